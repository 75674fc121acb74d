"""Exact resume: stopping mid-run at a checkpoint and resuming gives bitwise the same state.

Every rank runs ``ssdmpi train`` in-process (``ssdmpi.cli.main``) on COMM_WORLD, so these
tests run at whatever size ``mpiexec -n`` gives (tests/run.py: 1, 2 and 4). Each case
compares an uninterrupted run of S steps with the same run stopped at S/2 by
``--stop-at-step`` (exit 85, as on a preemption signal) and resumed with ``--resume auto``,
under a learning-rate schedule that steps down every 0.15 epochs: every saved field of the final checkpoint (the
global model ``W``, every rank's local model ``L``, momentum and other algorithm buffers, the
counters, the loader position, integers and strings included; only wall-clock times left out)
must be identical.
"""

import os
import tempfile

import pytest
from mpi4py import MPI

from ssdmpi.cli import main
from ssdmpi.errors import REQUEUE_EXIT
from tests.checkpoints import differences as field_differences
from tests.checkpoints import fields

WARMUP, K = 10, 5
S = 2 * (WARMUP + 3 * K + 2)          # 54: S/2 = 27 is m = 17, two steps into a period of the delay stage
COMMON = ["--dataset", "digits", "--model", "mlp", "--widths", "32", "--batch-size", "8",
          "--lr", "0.05", "--lr-schedule", "step:0.15:0.5", "--seed", "5", "--eval-every", "0", "--log-every", "1000",
          "--keep-checkpoints", "0", "--no-progress-bar"]


OUTER = ["--outer-optimizer", "nesterov", "--outer-lr", "0.7", "--outer-momentum", "0.9"]


def shared_tmpdir() -> str:
    """A fresh directory, the same path on every rank (made by rank 0)."""
    path = tempfile.mkdtemp(prefix="ssdmpi-resume-") if MPI.COMM_WORLD.Get_rank() == 0 else None
    return MPI.COMM_WORLD.bcast(path, root=0)


def newest_checkpoint(run_dir: str) -> str:
    return sorted(n for n in os.listdir(os.path.join(run_dir, "checkpoints")) if n.startswith("ckpt-"))[-1]


def differences(a: str, b: str) -> list:
    """Names of saved fields that differ between two checkpoints (rank 0 reads)."""
    A, B = fields(a), fields(b)
    return field_differences(A, B) if A else ["no fields"]


def all_ranks(value):
    return MPI.COMM_WORLD.allgather(value)


CASES = {
    "ssd-step": ["--algo", "ssd", "--comm", "step", "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "ssd-step-glu-paper": ["--algo", "ssd", "--comm", "step", "--delay", str(K), "--warmup-steps", str(WARMUP),
                           "--local-update", "glu-paper"],
    "ssd-step-float64": ["--algo", "ssd", "--comm", "step", "--delay", str(K), "--warmup-steps", str(WARMUP),
                         "--dtype", "float64"],
    "ssd-period": ["--algo", "ssd", "--comm", "period", "--delay", str(K), "--warmup-steps", str(WARMUP)],
    # delta-merge with d = 3, stopped at m = 17 between the post at m = 14 and its merge at m = 17: the
    # drained sum is held in the checkpoint (with the default d = 1, "ssd-period", it was merged at m = 15)
    "ssd-period-mid-delay": ["--algo", "ssd", "--comm", "period", "--merge-delay", "3", "--delay", str(K),
                             "--warmup-steps", str(WARMUP)],
    "ssd-period-delta-own": ["--algo", "ssd", "--comm", "period", "--period-rule", "delta-own", "--delay", str(K),
                             "--warmup-steps", str(WARMUP)],
    # --comm-dtype: stopped with an int8 sum in flight (drained, held), its error feedback in the checkpoint;
    # replay posts a sum before waiting for the previous one (two in flight)
    "ssd-period-int8-mid-delay": ["--algo", "ssd", "--comm", "period", "--comm-dtype", "int8", "--merge-delay", "3",
                                  "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "ssd-period-replay-bfloat16": ["--algo", "ssd", "--comm", "period", "--period-rule", "replay", "--comm-dtype",
                                   "bfloat16", "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "ssgd": ["--algo", "ssgd"],
    "localsgd": ["--algo", "localsgd", "--delay", str(K), "--warmup-steps", str(WARMUP)],
    # AdamW: the state m, v and the integer count (M.*, and per rank U.* or V.*), clipping in some
    "adamw-ssd-step": ["--optimizer", "adamw", "--lr", "0.003", "--grad-clip", "0.5", "--algo", "ssd", "--comm", "step",
                       "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "adamw-ssd-period-mid-delay": ["--optimizer", "adamw", "--lr", "0.003", "--merge-delay", "3", "--delay", str(K),
                                   "--warmup-steps", str(WARMUP)],
    "adamw-ssd-period-merge-momentum": ["--optimizer", "adamw", "--lr", "0.003", "--merge-momentum", "1",
                                        "--grad-clip", "0.5", "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "adamw-ssd-period-delta-own": ["--optimizer", "adamw", "--lr", "0.003", "--period-rule", "delta-own",
                                   "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "adamw-ssd-period-replay": ["--optimizer", "adamw", "--lr", "0.003", "--period-rule", "replay",
                                "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "adamw-localsgd": ["--optimizer", "adamw", "--lr", "0.003", "--algo", "localsgd", "--delay", str(K),
                       "--warmup-steps", str(WARMUP)],
    "adamw-ssgd": ["--optimizer", "adamw", "--lr", "0.003", "--grad-clip", "0.5", "--algo", "ssgd"],
    # the outer optimizer: its momentum buffer (outer.momentum, replicated) in the checkpoint; delta-merge
    # stopped mid-delay (the held sum takes its outer step at its merge, after the resume)
    "outer-localsgd": ["--algo", "localsgd", "--delay", str(K), "--warmup-steps", str(WARMUP), *OUTER],
    "outer-ssd-period-mid-delay": ["--algo", "ssd", "--comm", "period", "--merge-delay", "3", "--delay", str(K),
                                   "--warmup-steps", str(WARMUP), *OUTER],
}
# The per-rank optimizer state each AdamW case saves besides the global M.* (the integer count included).
ADAMW_OWN = {"adamw-ssd-period-mid-delay": "period.U", "adamw-ssd-period-merge-momentum": "period.U",
             "adamw-ssd-period-delta-own": "period.U", "adamw-localsgd": "V"}


def stop_and_resume_differences(args, S, warmup, k, check_mid_period=True, held=None):
    """Run S steps straight, and stopped at S/2 + resumed; return (arrays that differ, arrays compared).
    ``held``: whether the checkpoint at S/2 must hold a drained sum of ``--comm period`` (``period.has_Rp``)."""
    tmp = shared_tmpdir()
    straight, split = os.path.join(tmp, "straight"), os.path.join(tmp, "split")

    assert all_ranks(main(["train", "--run-dir", straight] + args)) == [0] * MPI.COMM_WORLD.Get_size()
    codes = all_ranks(main(["train", "--run-dir", split, "--stop-at-step", str(S // 2)] + args))
    assert codes == [REQUEUE_EXIT] * MPI.COMM_WORLD.Get_size()
    assert newest_checkpoint(split) == f"ckpt-{S // 2:08d}"
    stop = None
    if MPI.COMM_WORLD.Get_rank() == 0:                 # read by rank 0, checked on every rank
        stopped = fields(os.path.join(split, "checkpoints", newest_checkpoint(split)))
        stop = (stopped["meta/stage"], [v for n, v in stopped.items() if n.endswith("/algo/period.has_Rp")])
    stage, has_rp = MPI.COMM_WORLD.bcast(stop, root=0)
    if check_mid_period:
        assert stage == "delay" and (S // 2 - warmup) % k != 0     # stopped inside the delay stage, mid-period
    if held is not None:
        assert has_rp == [int(held)] * MPI.COMM_WORLD.Get_size()
    assert all_ranks(main(["train", "--run-dir", split, "--resume", "auto"] + args)) == [0] * MPI.COMM_WORLD.Get_size()

    result = None
    if MPI.COMM_WORLD.Get_rank() == 0:
        a = os.path.join(straight, "checkpoints", newest_checkpoint(straight))
        b = os.path.join(split, "checkpoints", newest_checkpoint(split))
        assert os.path.basename(a) == os.path.basename(b) == f"ckpt-{S:08d}"
        result = differences(a, b), sorted(fields(a))
    return MPI.COMM_WORLD.bcast(result, root=0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_stopped_and_resumed_run_matches_the_uninterrupted_one_bitwise(case):
    args = COMMON + ["--steps", str(S)] + CASES[case]
    held = {"ssd-period-mid-delay": True, "ssd-period": False, "adamw-ssd-period-mid-delay": True,
            "adamw-ssd-period-merge-momentum": False, "ssd-period-int8-mid-delay": True,
            "outer-ssd-period-mid-delay": True}.get(case)
    delay_stage = case.removeprefix("adamw-").removeprefix("outer-").startswith("ssd")
    diff, compared = stop_and_resume_differences(args, S, WARMUP, K, check_mid_period=delay_stage, held=held)
    assert diff == [], f"not bitwise identical after resume: {diff}"
    last = f"rank_{MPI.COMM_WORLD.Get_size() - 1:04d}"
    state = {"shared/algo/M.m", "shared/algo/M.v", f"{last}/algo/M.count"} if case.startswith("adamw") \
        else {"shared/algo/M"}
    assert state | {"shared/algo/W", f"{last}/algo/t", f"{last}/loader/sample_offset"} <= set(compared)
    if case in ADAMW_OWN:
        assert {f"{last}/algo/{ADAMW_OWN[case]}.{part}" for part in ("m", "v", "count")} <= set(compared)
    if delay_stage or case.endswith("localsgd"):
        assert f"{last}/algo/L" in compared
    if case.startswith("outer-"):
        assert "shared/algo/outer.momentum" in compared
    if "--comm-dtype" in CASES[case]:
        assert {f"{last}/algo/period.ef.residual", f"{last}/algo/period.ef.shard_residual"} <= set(compared)


@pytest.mark.timeout(300)
def test_batchnorm_statistics_resume_bitwise_too():
    """resnet20 (BatchNorm running statistics per rank) on the 8x8 digits: a short run."""
    s, warmup, k = 18, 4, 2
    args = ["--dataset", "digits", "--model", "resnet20", "--batch-size", "4", "--steps", str(s), "--seed", "1",
            "--algo", "ssd", "--comm", "step", "--delay", str(k), "--warmup-steps", str(warmup),
            "--eval-every", "0", "--log-every", "1000", "--keep-checkpoints", "0", "--no-progress-bar"]
    diff, compared = stop_and_resume_differences(args, s, warmup, k)
    assert diff == [], f"not bitwise identical after resume: {diff}"
    assert any(name.startswith("rank_0000/model/buffers/") and "running_mean" in name for name in compared)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES) + ["ssd-period-replay"])
def test_training_longer_from_a_finished_run_continues_bitwise(case):
    """"Train longer": a run that FINISHED at S/2 (mid-period: finalize flushed what was in flight
    and the partial period into its model), resumed with ``--resume auto --steps S``, ends
    bitwise where one run of S steps ends: the final checkpoint keeps the state before finalize."""
    extra = CASES.get(case) or ["--algo", "ssd", "--comm", "period", "--period-rule", "replay",
                                "--delay", str(K), "--warmup-steps", str(WARMUP)]
    args = COMMON + extra
    tmp = shared_tmpdir()
    straight, longer = os.path.join(tmp, "straight"), os.path.join(tmp, "longer")
    ok = [0] * MPI.COMM_WORLD.Get_size()
    assert all_ranks(main(["train", "--run-dir", straight, "--steps", str(S)] + args)) == ok
    assert all_ranks(main(["train", "--run-dir", longer, "--steps", str(S // 2)] + args)) == ok
    assert all_ranks(main(["train", "--run-dir", longer, "--resume", "auto", "--steps", str(S)] + args)) == ok
    if MPI.COMM_WORLD.Get_rank() == 0:
        a = os.path.join(straight, "checkpoints", newest_checkpoint(straight))
        b = os.path.join(longer, "checkpoints", newest_checkpoint(longer))
        assert os.path.basename(a) == os.path.basename(b) == f"ckpt-{S:08d}"
        assert differences(a, b) == [], f"not bitwise identical after training longer: {differences(a, b)}"
