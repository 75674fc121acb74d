"""Exact resume: stopping mid-run at a checkpoint and resuming gives bitwise the same weights.

Every rank runs ``ssdmpi train`` in-process (``ssdmpi.cli.main``) on COMM_WORLD, so these
tests run at whatever size ``mpiexec -n`` gives (tests/run.py: 1, 2 and 4). Each case
compares an uninterrupted run of S steps with the same run stopped at S/2 by
``--stop-at-step`` (exit 85, as on a preemption signal) and resumed with ``--resume auto``:
the final global model ``W``, every rank's local model ``L``, momentum and other
algorithm buffers, and every rank's model parameters must be bitwise identical, and every
rank's algorithm and loader scalars (counters, flags such as a held result) equal.
"""

import json
import os
import tempfile

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi.cli import main
from ssdmpi.errors import REQUEUE_EXIT

WARMUP, K = 10, 5
S = 2 * (WARMUP + 3 * K + 2)          # 54: S/2 = 27 is m = 17, two steps into a period of the delay stage
COMMON = ["--dataset", "digits", "--model", "mlp", "--widths", "32", "--batch-size", "8",
          "--lr", "0.05", "--seed", "5", "--eval-every", "0", "--log-every", "1000", "--keep-checkpoints", "0",
          "--no-progress-bar"]


def shared_tmpdir() -> str:
    """A fresh directory, the same path on every rank (made by rank 0)."""
    path = tempfile.mkdtemp(prefix="ssdmpi-resume-") if MPI.COMM_WORLD.Get_rank() == 0 else None
    return MPI.COMM_WORLD.bcast(path, root=0)


def newest_checkpoint(run_dir: str) -> str:
    return sorted(os.listdir(os.path.join(run_dir, "checkpoints")))[-1]


def arrays(path: str) -> dict:
    """Every float array of the training state, by name (links to arrays stored once included)."""
    out = {}
    with h5py.File(path, "r") as f:
        names = []
        f.visit_links(names.append)
        for name in names:
            obj = f[name]
            if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f":
                out[name] = obj[()]
    return out


def scalars(path: str) -> dict:
    """Every rank's algorithm and loader scalars (``RANK/algo/_values``, ``RANK/loader/_values``), by name.
    (The trainer's own values are wall-clock times: not compared.)"""
    out = {}
    with h5py.File(path, "r") as f:
        for rank in (k for k in f if k.startswith("rank_")):
            for part in ("algo", "loader"):
                if f"{rank}/{part}/_values" in f:
                    values = json.loads(f[f"{rank}/{part}/_values"][()])
                    out.update({f"{rank}/{part}/{k}": v for k, v in values.items()})
    return out


def differences(a: str, b: str) -> list:
    """Names of arrays that are not bitwise equal, and of scalars that differ, between two checkpoints
    (rank 0 reads)."""
    A, B = arrays(a), arrays(b)
    diff = [name for name in sorted(set(A) | set(B))
            if name not in A or name not in B or A[name].dtype != B[name].dtype
            or not np.array_equal(A[name], B[name])]
    sa, sb = scalars(a), scalars(b)
    diff += [name for name in sorted(set(sa) | set(sb)) if sa.get(name, "absent") != sb.get(name, "absent")]
    return diff if diff else ([] if A and sa else ["no arrays"])


def all_ranks(value):
    return MPI.COMM_WORLD.allgather(value)


CASES = {
    "ssd-step": ["--algo", "ssd", "--comm", "step", "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "ssd-step-glu-paper": ["--algo", "ssd", "--comm", "step", "--delay", str(K), "--warmup-steps", str(WARMUP),
                           "--local-update", "glu-paper"],
    "ssd-step-float64": ["--algo", "ssd", "--comm", "step", "--delay", str(K), "--warmup-steps", str(WARMUP),
                         "--dtype", "float64"],
    "ssd-period": ["--algo", "ssd", "--comm", "period", "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "ssgd": ["--algo", "ssgd"],
    "localsgd": ["--algo", "localsgd", "--delay", str(K), "--warmup-steps", str(WARMUP)],
}


# Under a cosine lr (it depends on the run's length, so these are not "train longer" cases): delta-merge
# stopped at m = 17, between the post at m = 14 and its merge at m = 17 (d = 3: the drained sum is held
# in the checkpoint), or after that merge (d = 1).
SCHEDULED = {
    "ssd-period-merge-mid-delay": ["--algo", "ssd", "--comm", "period", "--period-rule", "delta-merge",
                                   "--merge-delay", "3", "--delay", str(K), "--warmup-steps", str(WARMUP),
                                   "--lr-schedule", "cosine"],
    "ssd-period-merge": ["--algo", "ssd", "--comm", "period", "--period-rule", "delta-merge", "--merge-delay", "1",
                         "--delay", str(K), "--warmup-steps", str(WARMUP), "--lr-schedule", "cosine"],
}


def stop_and_resume_differences(args, S, warmup, k, check_mid_period=True, held=None):
    """Run S steps straight, and stopped at S/2 + resumed; return (arrays that differ, arrays compared).
    ``held``: whether the checkpoint at S/2 must hold a drained sum of ``--comm period`` (``period.has_Rp``)."""
    tmp = shared_tmpdir()
    straight, split = os.path.join(tmp, "straight"), os.path.join(tmp, "split")

    assert all_ranks(main(["train", "--run-dir", straight] + args)) == [0] * MPI.COMM_WORLD.Get_size()
    codes = all_ranks(main(["train", "--run-dir", split, "--stop-at-step", str(S // 2)] + args))
    assert codes == [REQUEUE_EXIT] * MPI.COMM_WORLD.Get_size()
    assert newest_checkpoint(split) == f"ckpt-{S // 2:08d}.h5"
    stop = None
    if MPI.COMM_WORLD.Get_rank() == 0:                 # read by rank 0, checked on every rank
        path = os.path.join(split, "checkpoints", newest_checkpoint(split))
        with h5py.File(path, "r") as f:
            stop = (str(f.attrs["stage"]), [v for n, v in scalars(path).items() if n.endswith("/algo/period.has_Rp")])
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
        assert os.path.basename(a) == os.path.basename(b) == f"ckpt-{S:08d}.h5"
        result = differences(a, b), sorted(arrays(a))
    return MPI.COMM_WORLD.bcast(result, root=0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES) + list(SCHEDULED))
def test_stopped_and_resumed_run_matches_the_uninterrupted_one_bitwise(case):
    args = COMMON + ["--steps", str(S)] + {**CASES, **SCHEDULED}[case]
    held = {"ssd-period-merge-mid-delay": True, "ssd-period-merge": False}.get(case)
    diff, compared = stop_and_resume_differences(args, S, WARMUP, K, check_mid_period=case.startswith("ssd"),
                                                 held=held)
    assert diff == [], f"not bitwise identical after resume: {diff}"
    assert "model/global_weights" in compared and f"rank_{MPI.COMM_WORLD.Get_size() - 1:04d}/model/params" in compared


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
        assert os.path.basename(a) == os.path.basename(b) == f"ckpt-{S:08d}.h5"
        assert differences(a, b) == [], f"not bitwise identical after training longer: {differences(a, b)}"
