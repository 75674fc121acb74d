#!/usr/bin/env python3
"""Launch pytest on one MPI rank; ranks other than 0 write their output to a log file.

Used by ``tests/run.py`` as ``mpiexec -n N python tests/mpi_pytest.py LOGDIR PYTEST_ARGS...`` so
the console shows rank 0's report only; the other ranks' logs are printed when a stage fails.
A rank that aborts the job over a failed test (``tests/mpi_plugin.py``) also writes its report
to the console, through the descriptor named in ``SSDMPI_TEST_CONSOLE_FD``. The rank is read from
the launcher's environment, before MPI (or pytest) starts.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ssdmpi.comm.abort import launcher_rank  # noqa: E402

logdir, pytest_args = sys.argv[1], sys.argv[2:]
rank = launcher_rank()
if rank != 0:
    console = os.dup(2)
    os.set_inheritable(console, True)
    os.environ["SSDMPI_TEST_CONSOLE_FD"] = str(console)
    fd = os.open(os.path.join(logdir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
os.execv(sys.executable, [sys.executable, "-m", "pytest"] + pytest_args)
