"""``ssdmpi train ARGS`` in which the last rank is killed (SIGKILL) by its checkpoint writer
thread while it writes the checkpoint of step STEP, half of its file on disk (argv: STEP, then
the train arguments). The training thread is still running when it happens."""
import os
import signal
import sys

from ssdmpi.checkpoint import sharded
from ssdmpi.cli import main

step, last = int(sys.argv[1]), int(os.environ["PMI_SIZE"]) - 1
write = sharded.write_rank_file


def dying(path, state, pieces):
    report = write(path, state, pieces)
    if f"ckpt-{step:08d}." in path and int(os.environ["PMI_RANK"]) == last:
        with open(path, "r+b") as f:
            f.truncate(report["bytes"] // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    return report


sharded.write_rank_file = dying
sys.exit(main(["train"] + sys.argv[2:]))
