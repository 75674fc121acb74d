"""``ssdmpi train`` under MPI, in-process on COMM_WORLD (runs at 1, 2 and 4 ranks).

Signals: a signal delivered to ONE rank (the last) during the delay stage makes every
rank checkpoint and return 85 (SIGUSR1, SIGTERM) or 130 (SIGINT), and resuming finishes
bitwise where an uninterrupted run does. Divergence stops every rank with code 3 and
keeps the last good checkpoint.
"""

import json
import os
import signal

import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi import checkpoint
from ssdmpi.cli import main
from ssdmpi.data.loader import ShardedLoader
from ssdmpi.errors import DIVERGED_EXIT, INTERRUPT_EXIT, REQUEUE_EXIT
from tests.mpi.test_resume import differences, newest_checkpoint, shared_tmpdir

SIZE, RANK = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
ARGS = ["--dataset", "digits", "--model", "mlp", "--widths", "32", "--batch-size", "8", "--steps", "60",
        "--lr", "0.05", "--seed", "2", "--algo", "ssd", "--comm", "step", "--delay", "3", "--warmup-steps", "10",
        "--eval-every", "0", "--log-every", "4", "--keep-checkpoints", "0", "--no-progress-bar"]
SIGNAL_AT = 23   # loader iteration at which the last rank signals itself: delay stage, m = 13


def records(run_dir, kind):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r.get("kind") == kind]


@pytest.fixture
def signal_on_last_rank(monkeypatch):
    """Make the last rank send itself ``signum`` when its loader reaches ``SIGNAL_AT`` (once)."""
    def arm(signum):
        original = ShardedLoader.next_batch
        fired = []

        def next_batch(self):
            if RANK == SIZE - 1 and self.iteration == SIGNAL_AT and not fired:
                fired.append(True)
                os.kill(os.getpid(), signum)
            return original(self)

        monkeypatch.setattr(ShardedLoader, "next_batch", next_batch)
        return lambda: monkeypatch.setattr(ShardedLoader, "next_batch", original)
    return arm


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum, code", [(signal.SIGUSR1, REQUEUE_EXIT), (signal.SIGTERM, REQUEUE_EXIT),
                                          (signal.SIGINT, INTERRUPT_EXIT)])
def test_signal_on_one_rank_checkpoints_everywhere_and_resume_matches(signal_on_last_rank, signum, code):
    tmp = shared_tmpdir()
    straight, split = os.path.join(tmp, "straight"), os.path.join(tmp, "split")
    assert MPI.COMM_WORLD.allgather(main(["train", "--run-dir", straight] + ARGS)) == [0] * SIZE

    disarm = signal_on_last_rank(signum)
    codes = MPI.COMM_WORLD.allgather(main(["train", "--run-dir", split] + ARGS))
    disarm()
    assert codes == [code] * SIZE
    # The ranks acted at the next sync point after the signal (every --log-every 4 steps).
    stopped_at = int(newest_checkpoint(split)[5:13])
    assert SIGNAL_AT < stopped_at <= SIGNAL_AT + 4
    if RANK == 0:
        (stop,) = records(split, "stop")
        assert stop["step"] == stopped_at and stop["exit_code"] == code
        assert [c["reason"] for c in records(split, "checkpoint")][-1] == "signal"
        meta = checkpoint.read_meta(os.path.join(split, "checkpoints", newest_checkpoint(split)))
        assert meta["stage"] == "delay" and meta["reason"] == "signal" and not meta["write"]["background"]
    # SIGINT's handler is restored after the run: a later Ctrl-C still interrupts.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    assert MPI.COMM_WORLD.allgather(main(["train", "--run-dir", split, "--resume", "auto"] + ARGS)) == [0] * SIZE
    diff = None
    if RANK == 0:
        diff = differences(os.path.join(straight, "checkpoints", newest_checkpoint(straight)),
                           os.path.join(split, "checkpoints", newest_checkpoint(split)))
        # metrics.jsonl reads like one run: two starts, steps strictly increasing across the resume
        steps = [r["step"] for r in records(split, "step")]
        assert steps == sorted(set(steps)) and steps[-1] == 60 and len(records(split, "start")) == 2
    assert MPI.COMM_WORLD.bcast(diff, root=0) == []


@pytest.mark.timeout(300)
def test_divergence_stops_every_rank_and_keeps_the_last_good_checkpoint(capsys):
    tmp = shared_tmpdir()
    run_dir = os.path.join(tmp, "run")
    short = [a if a != "60" else "20" for a in ARGS]
    assert main(["train", "--run-dir", run_dir] + short) == 0
    good = newest_checkpoint(run_dir)
    # Continue the same run with an absurd learning rate: the loss goes non-finite.
    codes = MPI.COMM_WORLD.allgather(main(["train", "--run-dir", run_dir, "--resume", "auto", "--lr", "1e30",
                                          "--steps", "60"]))
    assert codes == [DIVERGED_EXIT] * SIZE
    assert newest_checkpoint(run_dir) == good
    err = capsys.readouterr().err
    if RANK == 0:
        line = [x for x in err.splitlines() if "diverged" in x]
        assert len(line) == 1 and good in line[0] and "Traceback" not in err
        path = os.path.join(run_dir, "checkpoints", good)
        assert checkpoint.verify(path) == []
        assert np.isfinite(checkpoint.read_model(path)[1]).all()
