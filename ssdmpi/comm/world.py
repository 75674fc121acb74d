"""COMM_WORLD before a Communicator exists: who am I, run set-up work once, agree on errors.

A run reads its configuration and picks its backend before it can build its Communicator
(whose progress strategy depends on the backend). These calls cover that stretch; every
rank makes them together, in the same order. They use mpi4py's pickle-based collectives,
which is fine here: no communication or watchdog thread exists yet.

- ``rank_and_size()``: this process's rank and the world size (initialises MPI).
- ``on_root(fn)``: run ``fn()`` on rank 0 alone (reading files once), return its result
  everywhere; a ``UserError`` there is raised on every rank as a collective one.
- ``agree(fn)``: run ``fn()`` on every rank; a ``UserError`` on any rank is raised on every
  rank as one collective error: the lowest failing rank's (named unless it is rank 0).
"""

from __future__ import annotations

from ssdmpi.comm.mpi_env import load_mpi
from ssdmpi.errors import UserError


def _world():
    return load_mpi().COMM_WORLD


def rank_and_size() -> tuple[int, int]:
    """``(rank, size)`` in COMM_WORLD."""
    world = _world()
    return world.Get_rank(), world.Get_size()


def on_root(fn):
    """Collective: ``fn()``'s result on rank 0, returned on every rank (see the module docstring)."""
    world = _world()
    result = error = None
    if world.Get_rank() == 0:
        try:
            result = fn()
        except UserError as exc:
            error = str(exc)
    result, error = world.bcast((result, error), root=0)
    if error:
        raise UserError(error, collective=True)
    return result


def agree(fn):
    """Collective: ``fn()``'s result on each rank, or the same collective ``UserError`` on all."""
    result, message = None, None
    try:
        result = fn()
    except UserError as exc:
        message = str(exc)
    for r, m in enumerate(_world().allgather(message)):
        if m is not None:
            raise UserError(m if r == 0 else f"rank {r}: {m}", collective=True)
    return result
