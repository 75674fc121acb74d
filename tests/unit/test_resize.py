"""Resuming on another number of ranks (4 -> 2 and 2 -> 4), as a user launches it, for ssgd, ssd
(both schedules; delta-merge with a sum in flight mid-delay, and delta-own), localsgd and asgd;
and a rank killed while it writes a checkpoint.

Each resize case runs ``mpiexec -n N`` to a mid-epoch (and, for ssd, mid-period) stop, then
(1) resumes a copy of that checkpoint on N' ranks for zero steps, so that the final checkpoint
holds exactly the state the resume built, which is checked field by field against the old
ranks' (the rules of ssdmpi/algos/resize.py, computed here from the saved arrays with NumPy), and
(2) resumes the run itself on N' ranks to its end, every rank recording the sample indices its
loader hands out (tests/unit/ckpt_scripts/record_samples.py): the epoch goes on with the same
global batches, in the order the loader documents, no sample lost or repeated.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ssdmpi import checkpoint
from tests.checkpoints import fields
from tests.conftest import ROOT, mpiexec, run_cli

SCRIPTS = Path(__file__).parent / "ckpt_scripts"
SEED, WARMUP, K, STOP, STEPS = 5, 10, 5, 27, 40   # step 27: m = 17, two steps into a period
OUTER_LR, OUTER_MU = 0.7, 0.9                      # the outer case's Nesterov step
BASE = ["--dataset", "digits", "--model", "mlp", "--widths", "32", "--lr", "0.05", "--seed", str(SEED),
        "--eval-every", "0", "--log-every", "1000", "--keep-checkpoints", "0", "--no-progress-bar"]
ALGOS = {
    "ssgd": ["--algo", "ssgd"],
    "ssd-step": ["--algo", "ssd", "--comm", "step", "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "ssd-period": ["--algo", "ssd", "--comm", "period", "--delay", str(K), "--warmup-steps", str(WARMUP)],
    # delta-merge with d = 3: the sum posted at m = 14 is still in flight at the stop (its merge is at m = 17)
    "ssd-period-mid-delay": ["--algo", "ssd", "--comm", "period", "--merge-delay", "3", "--delay", str(K),
                             "--warmup-steps", str(WARMUP)],
    "ssd-period-delta-own": ["--algo", "ssd", "--comm", "period", "--period-rule", "delta-own", "--delay", str(K),
                             "--warmup-steps", str(WARMUP)],
    "localsgd": ["--algo", "localsgd", "--delay", str(K), "--warmup-steps", str(WARMUP)],
    "asgd": ["--algo", "asgd", "--servers", "1", "--warmup-steps", str(WARMUP)],
    # AdamW: m and v averaged like the velocity, the integer count kept (old rank 0's, the same on every rank)
    "adamw-ssd-period-mid-delay": ["--optimizer", "adamw", "--lr", "0.003", "--merge-delay", "3", "--delay", str(K),
                                   "--warmup-steps", str(WARMUP)],
    "adamw-asgd": ["--optimizer", "adamw", "--lr", "0.003", "--grad-clip", "1", "--algo", "asgd", "--servers", "1",
                   "--warmup-steps", str(WARMUP)],
    # the outer optimizer: the sum in flight and the partial period merged through its steps, its buffer with them
    "outer-ssd-period-mid-delay": ["--algo", "ssd", "--comm", "period", "--merge-delay", "3", "--delay", str(K),
                                   "--warmup-steps", str(WARMUP), "--outer-optimizer", "nesterov", "--outer-lr",
                                   str(OUTER_LR), "--outer-momentum", str(OUTER_MU)],
}
GLOBAL_BATCH = {"asgd": 6, "adamw-asgd": 6}          # asgd: 3 workers x 2 or 1 worker x 6; the others: 4 x 4 or 2 x 8
DEFAULT_GLOBAL_BATCH = 16


def workers(algo: str, ranks: int) -> int:
    return ranks - 1 if algo.removeprefix("adamw-") == "asgd" else ranks


def state_parts(algo: str, name: str) -> tuple:
    """The checkpoint keys of optimizer state ``name``: itself (momentum SGD's velocity) or AdamW's parts."""
    return (f"{name}.m", f"{name}.v") if algo.startswith("adamw-") else (name,)


def launch(ranks: int, argv: list, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [mpiexec(), "-n", str(ranks), sys.executable] + [str(a) for a in argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def recorded(out: Path) -> list:
    return [json.loads(line) for p in sorted(out.glob("samples-*.jsonl")) for line in p.read_text().splitlines()]


def mean_over_ranks(old: dict, n: int, key: str) -> np.ndarray:
    return np.mean([old[f"rank_{r:04d}/algo/{key}"].astype(np.float64) for r in range(n)], axis=0)


def check_state(algo: str, old: dict, new: dict, n_old: int, n_new: int) -> None:
    """The state the resume built (``new``) from the old ranks' (``old``), by the documented rules."""
    close = {"rtol": 1e-5, "atol": 1e-6}
    first = "rank_0000"
    adamw, algo = algo.startswith("adamw-"), algo.removeprefix("adamw-")
    outer, algo = algo.startswith("outer-"), algo.removeprefix("outer-")
    for r in range(n_new):
        rank = f"rank_{r:04d}"
        assert new[f"{rank}/algo/t"] == old[f"{first}/algo/t"] == STOP
        assert new[f"{rank}/algo/stage"] == old[f"{first}/algo/stage"]
        assert new[f"{rank}/trainer/step"] == STOP
        if f"{rank}/loader/sample_offset" in new:   # every rank but asgd's server: the same position
            assert new[f"{rank}/loader/epoch"] == old[f"{first}/loader/epoch"] == 0
            assert new[f"{rank}/loader/sample_offset"] == old[f"{first}/loader/sample_offset"]
            assert new[f"{rank}/loader/batch_size"] * workers(algo, n_new) == \
                old[f"{first}/loader/batch_size"] * workers(algo, n_old)
    if algo == "asgd":
        W = old["shared/model/global_weights"]
        servers = [n_new - 1]
        for r in range(n_new):
            rank = f"rank_{r:04d}"
            if r in servers:     # the one server keeps its W and M exactly; staleness restarts
                assert np.array_equal(new[f"{rank}/algo/W_shard"], W)
                for key in state_parts("adamw-" * adamw + algo, "M_shard") + (("M_shard.count",) if adamw else ()):
                    assert np.array_equal(new[f"{rank}/algo/{key}"], old[f"rank_{n_old - 1:04d}/algo/{key}"]), key
                assert list(new[f"{rank}/algo/version"]) == [old[f"rank_{n_old - 1:04d}/algo/s"]] * (n_new - 1)
                assert list(new[f"{rank}/algo/pushes"]) == [STOP] * (n_new - 1)
            else:                # every worker starts from a fresh pull of W
                assert np.array_equal(new[f"{rank}/algo/L"], W)
        return
    for key in state_parts("adamw-" * adamw + algo, "M"):
        assert np.array_equal(new[f"shared/algo/{key}"], old[f"shared/algo/{key}"])
    for r in range(n_new):
        for key in (("M.count", "period.U.count") if algo.startswith("ssd-period") else ("M.count",)) if adamw else ():
            assert new[f"rank_{r:04d}/algo/{key}"] == old[f"{first}/algo/{key}"] > 0, key
    W, s = old["shared/algo/W"], old[f"{first}/algo/s"]
    if algo.startswith("ssd-period"):
        # a sum in flight at the stop: only mid-delay (delta-merge's d = 1 has merged it at m = 15)
        assert old[f"{first}/algo/period.has_Rp"] == (algo != "ssd-period")
        partial = mean_over_ranks(old, n_old, "L") - mean_over_ranks(old, n_old, "period.S")
        held = [old["shared/algo/period.Rp"].astype(np.float64)] if old[f"{first}/algo/period.has_Rp"] else []
        s += K * len(held)
        if outer:   # the outer step (Nesterov) from each mean displacement in turn, the held one first
            merged, b = W.astype(np.float64), old["shared/algo/outer.momentum"].astype(np.float64)
            for mean in held + [partial]:
                b = OUTER_MU * b - mean
                merged = merged - OUTER_LR * (-mean + OUTER_MU * b)
            np.testing.assert_allclose(new["shared/algo/outer.momentum"], b, **close)
        else:
            merged = W.astype(np.float64) + partial + sum(held)
        np.testing.assert_allclose(new["shared/algo/W"], merged, **close)
        assert new[f"{first}/algo/period.has_Rp"] == 0 and "shared/algo/period.Rp" not in new
    else:
        assert np.array_equal(new["shared/algo/W"], W)
    for r in range(n_new):
        rank = f"rank_{r:04d}"
        assert new[f"{rank}/algo/s"] == s
        if algo.startswith("ssd-period"):
            assert np.array_equal(new[f"{rank}/algo/L"], new["shared/algo/W"])
            assert np.array_equal(new[f"{rank}/algo/period.S"], new["shared/algo/W"])
            for key in state_parts("adamw-" * adamw + algo, "period.U"):
                np.testing.assert_allclose(new[f"{rank}/algo/{key}"], mean_over_ranks(old, n_old, key), **close)
        for key in {"ssd-step": ["L"], "localsgd": ["L", "V"]}.get(algo, []):
            np.testing.assert_allclose(new[f"{rank}/algo/{key}"], mean_over_ranks(old, n_old, key), **close)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n_old, n_new", [(4, 2), (2, 4)], ids=["4to2", "2to4"])
@pytest.mark.parametrize("algo", list(ALGOS))
def test_resume_on_another_number_of_ranks_keeps_the_global_state_and_the_epoch(tmp_path, algo, n_old, n_new):
    total = GLOBAL_BATCH.get(algo, DEFAULT_GLOBAL_BATCH)
    args = BASE + ALGOS[algo]
    run, first, second = tmp_path / "run", tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    batch = ["--batch-size", str(total // workers(algo, n_old))]
    stopped = launch(n_old, [SCRIPTS / "record_samples.py", first, "--run-dir", run, "--stop-at-step", STOP,
                             "--steps", STEPS] + args + batch)
    assert stopped.returncode == 85, stopped.stdout + stopped.stderr
    saved = tmp_path / "saved"
    shutil.copytree(run / "checkpoints" / f"ckpt-{STOP:08d}", saved)

    # (1) the state the resume builds
    rebuilt = launch(n_new, ["-m", "ssdmpi", "train", "--resume", saved, "--run-dir", tmp_path / "rebuilt",
                             "--steps", STOP] + args)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    check_state(algo, fields(str(saved)), fields(str(tmp_path / "rebuilt" / "checkpoints" / f"ckpt-{STOP:08d}")),
                n_old, n_new)

    # (2) the run goes on (the same command line, on another number of ranks)
    resumed = launch(n_new, [SCRIPTS / "record_samples.py", second, "--run-dir", run, "--resume", "auto",
                             "--steps", STEPS] + args + batch)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    before, after = recorded(first), recorded(second)
    assert {b["step"] for b in before} == set(range(STOP)) and {b["step"] for b in after} == set(range(STOP, STEPS))
    assert len(before) == STOP * workers(algo, n_old) and len(after) == (STEPS - STOP) * workers(algo, n_new)
    taken = [i for b in before + after for i in b["indices"]]
    assert len(taken) == len(set(taken)) == STEPS * total            # none repeated, none lost
    order = np.random.default_rng([SEED, 0]).permutation(1437)         # epoch 0's order (loader docstring)
    for step in range(STEPS):                                          # each step: the same global batch
        batch_at = sorted(i for b in before + after if b["step"] == step for i in b["indices"])
        assert batch_at == sorted(order[step * total:(step + 1) * total].tolist()), step

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (resize,) = [r for r in records if r["kind"] == "resize"]
    assert (resize["step"], resize["from_ranks"], resize["to_ranks"]) == (STOP, n_old, n_new)
    assert resize["batch_size"] == [total // workers(algo, n_old), total // workers(algo, n_new)]
    assert resize["merged"] and f"resumed on another number of ranks ({n_old} -> {n_new})" in resumed.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == STEPS and summary["world_size"] == n_new
    assert [(r["from_ranks"], r["to_ranks"]) for r in summary["resized"]] == [(n_old, n_new)]
    assert f"  resumed at step {STOP} on another number of ranks ({n_old} -> {n_new}): {resize['merged']}" in \
        (run / "summary.txt").read_text()


@pytest.mark.timeout(300)
def test_a_rank_killed_while_writing_in_the_background_leaves_the_previous_checkpoint_selected(tmp_path):
    run = tmp_path / "run"
    args = ["--run-dir", str(run)] + BASE + ["--steps", "60", "--checkpoint-every", "10", "--log-every", "5",
                                                  "--batch-size", "8"] + ALGOS["ssd-period"]
    killed = launch(2, [SCRIPTS / "die_while_writing.py", "20"] + args)
    assert killed.returncode != 0 and f"signal {int(signal.SIGKILL)}" in killed.stdout + killed.stderr, \
        killed.stdout + killed.stderr
    directory = str(run / "checkpoints")
    partial = [n for n in os.listdir(directory) if n.startswith(".ckpt-00000020.partial-")]
    assert len(partial) == 1 and os.path.getsize(os.path.join(directory, partial[0], "rank-0001.h5")) > 0
    assert checkpoint.list_checkpoints(directory) == [(10, os.path.join(directory, "ckpt-00000010"))]
    assert checkpoint.select_resume(directory) == os.path.join(directory, "ckpt-00000010")
    listing = run_cli(["ckpt", "verify", str(run)])
    assert listing.returncode == 0 and listing.stdout.strip().endswith("ckpt-00000010: ok"), listing.stdout

    resumed = run_cli(["train", "--resume", "auto"] + args, ranks=2, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "ckpt-00000010 at step 10" in resumed.stdout
    assert not [n for n in os.listdir(directory) if n.startswith(".")]        # the crash's leftovers removed
    assert [s for s, _ in checkpoint.list_checkpoints(directory)] == [10, 20, 30, 40, 50, 60]
