"""MPI test setup: every rank runs the same tests (``tests/run.py`` runs them at 1, 2 and 4 ranks;
``mpiexec -n N pytest`` from the repository root runs them, and only them, at N ranks). MPI starts
here as it does in a run: through ``ssdmpi.comm.mpi_env.load_mpi``, with ssdmpi's MPI settings."""

import pytest

from ssdmpi.comm.mpi_env import load_mpi

MPI = load_mpi()


@pytest.fixture
def comm():
    """A private duplicate of COMM_WORLD for one test (freed afterwards)."""
    c = MPI.COMM_WORLD.Dup()
    yield c
    c.Free()
