"""MPI test setup: every rank runs the same tests (``tests/run.py`` runs them at 1, 2 and 4 ranks;
``mpiexec -n N pytest`` from the repository root runs them, and only them, at N ranks). MPI starts
here as it does in a run: through ``ssdmpi.comm.mpi_env.load_mpi``, with ssdmpi's MPI settings.
A test that fails on one rank fails on every rank and never hangs the run (``tests/mpi_plugin.py``)."""

import pytest

from ssdmpi.comm.mpi_env import load_mpi
from tests.mpi_plugin import pytest_runtest_makereport  # noqa: F401 (the hook: the ranks agree on each outcome)

MPI = load_mpi()


@pytest.fixture
def comm():
    """A private duplicate of COMM_WORLD for one test (freed afterwards)."""
    c = MPI.COMM_WORLD.Dup()
    yield c
    c.Free()
