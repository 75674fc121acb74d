"""Resuming on another number of ranks, in-process on the ranks of this job (tests/run.py: 2 and 4).

What ``tests/unit/test_resize.py`` checks with separate ``mpiexec`` jobs, here on real ranks: a run
of ``N`` ranks stopped mid-period is resumed on ``N / 2`` (every half of the job on its own) and a
run of ``N / 2`` on ``N``. ``ssdmpi train`` runs in a smaller world by having ``MPI.COMM_WORLD``
name a split of the job for the time of the call (``smaller_world``): every part of ssdmpi takes
its world from there. Each case checks, on every rank: (1) the state a resume for zero steps built,
field by field against the old ranks' by the documented rules (``check_state``, computed there from
the saved arrays with NumPy); (2) that the resumed run goes on with the same global batches, no
sample lost or repeated, and records the resize.
"""

import contextlib
import json
import os
import shutil

import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi.cli import main
from ssdmpi.data.loader import ShardedLoader
from tests.checkpoints import fields
from tests.mpi.test_resume import shared_tmpdir
from tests.unit import test_resize as serial
from tests.unit.test_resize import ALGOS, BASE, SEED, STEPS, STOP, check_state, workers

WORLD = MPI.COMM_WORLD
SIZE, RANK = WORLD.Get_size(), WORLD.Get_rank()
CASES = ["ssgd", "ssd-step", "ssd-period-mid-delay", "asgd", "adamw-ssd-period-mid-delay", "adamw-asgd",
         "outer-ssd-period-mid-delay"]


@contextlib.contextmanager
def smaller_world(parts: int):
    """Split the job into ``parts`` equal worlds (consecutive ranks); inside, ``MPI.COMM_WORLD`` is
    this rank's part. Yields ``(part, its size)``."""
    part = RANK * parts // SIZE
    group = WORLD.Split(part, RANK)
    MPI.COMM_WORLD = group
    try:
        yield part, group.Get_size()
    finally:
        MPI.COMM_WORLD = WORLD
        group.Free()


def train(argv: list, parts: int = 1) -> list:
    """``ssdmpi train ARGV`` in ``parts`` worlds at once (each part its own run: ``{part}`` in ARGV
    names it); the exit codes of every rank of the job."""
    if parts == 1:
        return WORLD.allgather(main(["train"] + [a.format(part=0) for a in argv]))
    with smaller_world(parts) as (part, _):
        code = main(["train"] + [a.format(part=part) for a in argv])
    return WORLD.allgather(code)


@pytest.fixture
def samples(monkeypatch):
    """Every batch this rank's loader hands out: ``{"step", "indices"}`` (as tests/unit/ckpt_scripts/
    record_samples.py records them)."""
    seen = []
    take = ShardedLoader.next_batch

    def recording(self):
        seen.append({"step": self.step_in_epoch, "indices": self.indices(self.epoch, self.step_in_epoch).tolist()})
        return take(self)

    monkeypatch.setattr(ShardedLoader, "next_batch", recording)
    return seen


def copied_on_rank_0(source: str, dest: str) -> None:
    if RANK == 0:
        shutil.copytree(source, dest, symlinks=True)
    WORLD.Barrier()


@pytest.mark.skipif(SIZE % 2 or SIZE < 2, reason="needs an even number of ranks: resumes on half of them")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("direction", ["to-half", "to-double"])
@pytest.mark.parametrize("algo", CASES)
def test_resume_on_another_number_of_ranks_keeps_the_global_state_and_the_epoch(algo, direction, samples):
    n_old, n_new = (SIZE, SIZE // 2) if direction == "to-half" else (SIZE // 2, SIZE)
    if algo.endswith("asgd") and min(n_old, n_new) < 2:
        pytest.skip("asgd needs a server and a worker in both worlds: 4 ranks")
    total = serial.GLOBAL_BATCH.get(algo, serial.DEFAULT_GLOBAL_BATCH)
    tmp = shared_tmpdir()
    args = BASE + ALGOS[algo]
    # the old run: on the whole job, or on its first half (the second half waits)
    old_parts = SIZE // n_old
    run = os.path.join(tmp, "run-{part}")
    batch = ["--batch-size", str(total // workers(algo, n_old))]
    codes = train(["--run-dir", run, "--stop-at-step", str(STOP), "--steps", str(STEPS)] + args + batch, old_parts)
    assert codes == [85] * SIZE
    before = WORLD.allgather(list(samples))[:n_old]             # the first world's ranks' batches
    samples.clear()
    old_run = os.path.join(tmp, "run-0")
    saved = os.path.join(tmp, "saved")
    copied_on_rank_0(os.path.join(old_run, "checkpoints", f"ckpt-{STOP:08d}"), saved)
    new_parts = SIZE // n_new

    # (1) the state the resume builds, on the new number of ranks (each part on its own)
    assert train(["--resume", saved, "--run-dir", os.path.join(tmp, "rebuilt-{part}"), "--steps", str(STOP)] + args,
                 new_parts) == [0] * SIZE
    samples.clear()
    for part in range(new_parts):
        rebuilt = os.path.join(tmp, f"rebuilt-{part}", "checkpoints", f"ckpt-{STOP:08d}")
        check_state(algo, fields(saved), fields(rebuilt), n_old, n_new)

    # (2) the run goes on (the same command line, on the new number of ranks: each part its own copy)
    for part in range(new_parts):
        if part:
            copied_on_rank_0(old_run, os.path.join(tmp, f"run-{part}"))
    batch = ["--batch-size", str(total // workers(algo, n_new))]
    assert train(["--run-dir", run, "--resume", "auto", "--steps", str(STEPS)] + args + batch, new_parts) == \
        [0] * SIZE
    after = WORLD.allgather(list(samples))[:n_new]               # the first new world's ranks' batches
    before, after = [b for rank in before for b in rank], [b for rank in after for b in rank]
    assert {b["step"] for b in before} == set(range(STOP)) and {b["step"] for b in after} == set(range(STOP, STEPS))
    assert len(before) == STOP * workers(algo, n_old) and len(after) == (STEPS - STOP) * workers(algo, n_new)
    taken = [i for b in before + after for i in b["indices"]]
    assert len(taken) == len(set(taken)) == STEPS * total            # none repeated, none lost
    order = np.random.default_rng([SEED, 0]).permutation(1437)         # epoch 0's order (loader docstring)
    for step in range(STEPS):                                          # each step: the same global batch
        batch_at = sorted(i for b in before + after if b["step"] == step for i in b["indices"])
        assert batch_at == sorted(order[step * total:(step + 1) * total].tolist()), step

    with open(os.path.join(old_run, "metrics.jsonl")) as f:
        (resize,) = [r for r in map(json.loads, f) if r["kind"] == "resize"]
    assert (resize["step"], resize["from_ranks"], resize["to_ranks"]) == (STOP, n_old, n_new)
    assert resize["batch_size"] == [total // workers(algo, n_old), total // workers(algo, n_new)]
    with open(os.path.join(old_run, "summary.json")) as f:
        summary = json.load(f)
    assert summary["step"] == STEPS and summary["world_size"] == n_new
    assert [(r["from_ranks"], r["to_ranks"]) for r in summary["resized"]] == [(n_old, n_new)]
    WORLD.Barrier()
