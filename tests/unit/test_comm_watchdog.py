"""The stall watchdog aborts a stuck job, naming the operation and the missing rank.

These jobs abort themselves (MPI_Abort), so each runs as its own ``mpiexec -n 2`` under an
outer timeout: a watchdog that failed to fire shows up as a timeout, not a hung suite.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT, mpiexec

SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    from ssdmpi.comm.communicator import Communicator

    strategy, scenario = sys.argv[1], sys.argv[2]
    c = Communicator(progress=strategy, stall_timeout=1.0)
    c.allreduce_mean(np.ones(16, dtype=np.float32))        # operation #1 completes on both ranks
    if c.rank == 0:
        c.allreduce_start(np.ones(1000, dtype=np.float32)).wait()   # #2: rank 1 never joins
    elif scenario == "computing":
        time.sleep(60)                                      # a rank stuck in its own work
        print("RANK 1 FINISHED COMPUTING", flush=True)      # only if the abort did not end the job
    else:
        c.any_true(True)                                    # a rank in a different collective
    print("NOT REACHED", flush=True)
""")


def run_job(tmp_path, strategy: str, scenario: str):
    script = tmp_path / "stall.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([mpiexec(), "-n", "2", sys.executable, str(script), strategy, scenario],
                          capture_output=True, text=True, timeout=90, cwd=ROOT, env=env)


@pytest.mark.parametrize("strategy", ["blocking", "test", "thread"])
def test_watchdog_names_the_operation_and_the_rank_still_computing(tmp_path, strategy):
    proc = run_job(tmp_path, strategy, "computing")
    assert proc.returncode != 0
    assert "NOT REACHED" not in proc.stdout
    assert "rank 0/2: stall: waited" in proc.stderr
    assert "in Iallreduce #2 of 4.0 KB" in proc.stderr
    assert "ranks missing from it: 1 (last posted #1, computing)" in proc.stderr
    # The abort ended the whole job: rank 1 was killed inside its 60 s of work, not left to finish it.
    assert "RANK 1 FINISHED COMPUTING" not in proc.stdout


def test_watchdog_names_a_rank_waiting_in_a_different_collective(tmp_path):
    proc = run_job(tmp_path, "thread", "other-collective")
    assert proc.returncode != 0
    assert "stall: waited" in proc.stderr
    # Whichever rank fires first names the other one's operation.
    assert ("waiting" in proc.stderr and "in a different operation" in proc.stderr), proc.stderr
    assert "control Allreduce #2 (any_true)" in proc.stderr or "Iallreduce #2 of 4.0 KB" in proc.stderr
