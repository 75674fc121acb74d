"""``--comm-dtype int8`` resumed on another number of ranks (tests/run.py: 2 and 4 ranks): the error
feedback restarts at zero (its shards are others; ``PeriodRule.resized_transport``), the resize record
says so, and the run goes on. The rest of the resized state follows tests/mpi/test_resize.py's rules."""

import json
import os

import numpy as np
import pytest

from tests.checkpoints import fields
from tests.mpi.test_resize import RANK, SIZE, WORLD, copied_on_rank_0, train
from tests.mpi.test_resume import shared_tmpdir
from tests.unit.test_resize import BASE, STEPS, STOP, WARMUP, K

ARGS = BASE + ["--algo", "ssd", "--comm", "period", "--comm-dtype", "int8", "--merge-delay", "3", "--delay", str(K),
               "--warmup-steps", str(WARMUP), "--batch-size", "{batch}"]


def args(batch: int) -> list:
    return [a.format(batch=batch) for a in ARGS]


@pytest.mark.skipif(SIZE % 2 or SIZE < 2, reason="needs an even number of ranks: resumes on half of them")
@pytest.mark.timeout(300)
def test_the_error_feedback_restarts_on_another_number_of_ranks():
    n_new, total = SIZE // 2, 8 * SIZE
    tmp = shared_tmpdir()
    run = os.path.join(tmp, "run-0")
    assert train(["--run-dir", run, "--stop-at-step", str(STOP), "--steps", str(STEPS)] + args(total // SIZE)) \
        == [85] * SIZE
    saved = os.path.join(tmp, "saved")
    copied_on_rank_0(os.path.join(run, "checkpoints", f"ckpt-{STOP:08d}"), saved)
    assert train(["--resume", saved, "--run-dir", os.path.join(tmp, "rebuilt-{part}"), "--steps", str(STOP)]
                 + args(total // n_new), 2) == [0] * SIZE
    ok = None
    if RANK == 0:
        old = fields(saved)
        new = fields(os.path.join(tmp, "rebuilt-0", "checkpoints", f"ckpt-{STOP:08d}"))
        ok = [np.abs(old[f"rank_{r:04d}/algo/period.ef.residual"]).max() > 0 for r in range(SIZE)]
        for r in range(n_new):
            ok.append(not new[f"rank_{r:04d}/algo/period.ef.residual"].any())
            ok.append(not new[f"rank_{r:04d}/algo/period.ef.shard_residual"].any())
        with open(os.path.join(tmp, "rebuilt-0", "metrics.jsonl")) as f:
            (resize,) = [r for r in map(json.loads, f) if r["kind"] == "resize"]
        ok.append("error-feedback residuals restart at zero" in resize["merged"])
    assert all(WORLD.bcast(ok, root=0))
    # and the run goes on on half the ranks, to the end
    copied_on_rank_0(run, os.path.join(tmp, "run-1"))
    assert train(["--run-dir", os.path.join(tmp, "run-{part}"), "--resume", "auto", "--steps", str(STEPS)]
                 + args(total // n_new), 2) == [0] * SIZE
