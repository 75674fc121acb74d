"""MPI test setup: every rank runs the same tests (``tests/run.py`` runs them at 1, 2 and 4 ranks;
``mpiexec -n N pytest`` from the repository root runs them, and only them, at N ranks). MPI starts
here as it does in a run: through ``ssdmpi.comm.mpi_env.load_mpi``, with ssdmpi's MPI settings.
A test that fails on one rank fails on every rank and never hangs the run (``tests/mpi_plugin.py``).

Shared here: ``make_comm`` (Communicators under every progress strategy) and
``same_bytes_everywhere``."""

import hashlib

import numpy as np
import pytest

from ssdmpi.comm.communicator import Communicator
from ssdmpi.comm.mpi_env import load_mpi
from tests.mpi_plugin import pytest_runtest_makereport  # noqa: F401 (the hook: the ranks agree on each outcome)

MPI = load_mpi()


@pytest.fixture
def comm():
    """A private duplicate of COMM_WORLD for one test (freed afterwards)."""
    c = MPI.COMM_WORLD.Dup()
    yield c
    c.Free()


STRATEGIES = ("blocking", "test", "poll", "thread")     # the Communicator's progress strategies


@pytest.fixture(params=STRATEGIES)
def make_comm(request, comm):
    """``make(**kwargs)``: a Communicator on the test's private communicator (``comm``), under each
    progress strategy in turn (``progress`` unless ``kwargs`` name one); every one made is freed
    after the test."""
    made = []

    def make(**kwargs):
        kwargs.setdefault("progress", request.param)
        made.append(Communicator(comm, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.free()


def same_bytes_everywhere(comm, array) -> bool:
    """Whether ``array`` holds the same bytes on every rank of ``comm`` (the test's raw mpi4py
    communicator: tests may call MPI; the package may not)."""
    digests = comm.allgather(hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest())
    return len(set(digests)) == 1
