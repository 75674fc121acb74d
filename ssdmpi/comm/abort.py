"""A failing rank never hangs the job: print which rank failed and why, then abort all ranks.

``python -m mpi4py`` installs such a hook, but a console entry point does not get it,
so ``ssdmpi.cli.main`` calls ``install_abort_hook()`` first thing.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from .mpi_env import loaded_mpi
from .shm import unlink_own_segments

ABORT_GRACE_S = 0.5   # seconds between printing the reason and MPI_Abort (see abort_job)

_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")


def launcher_rank() -> int:
    """This process's rank as the launcher announced it, without initialising MPI (0 if none)."""
    for name in _RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def launcher_size() -> int:
    """The job size as the launcher announced it, without initialising MPI (1 if none)."""
    for name in _SIZE_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


def world_rank_size() -> tuple[int, int]:
    """``(rank, size)`` of COMM_WORLD if MPI is initialised, else what the launcher announced."""
    MPI = loaded_mpi()
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    return launcher_rank(), launcher_size()


def abort_job(message: str, exit_code: int = 1) -> None:
    """Print ``message`` naming this rank, then end the whole job with ``exit_code``.

    Uses ``MPI_Abort`` when MPI is up (so the other ranks die instead of waiting in a
    collective forever); otherwise exits this process.
    """
    rank, size = world_rank_size()
    prefix = f"ssdmpi: rank {rank}/{size}: " if size > 1 else "ssdmpi: "
    try:
        sys.stderr.write(prefix + message.rstrip("\n") + "\n")
        sys.stderr.flush()
        sys.stdout.flush()
    except Exception:
        pass
    MPI = loaded_mpi()
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized() and size > 1:
        # The launcher forwards our stderr through a pipe; MPI_Abort tears the job down at
        # once and can drop what is still in that pipe (seen with MPICH's hydra: the message
        # naming the failing rank was lost about one time in four). Give it a moment.
        time.sleep(ABORT_GRACE_S)
        # MPI_Abort kills this node's ranks before MPICH can remove its shared-memory
        # segment; a stale one breaks a later job that hashes to the same name (comm/shm.py).
        unlink_own_segments()
        MPI.COMM_WORLD.Abort(exit_code)
    os._exit(exit_code)


def _format(exc_type, exc, tb) -> str:
    return "".join(traceback.format_exception(exc_type, exc, tb)).rstrip() + "\n" + \
        f"uncaught {exc_type.__name__}: {exc}; aborting all ranks"


def install_abort_hook() -> None:
    """Make an uncaught exception in any thread abort the whole MPI job, naming the rank."""

    def excepthook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt) and world_rank_size()[1] == 1:
            sys.__excepthook__(exc_type, exc, tb)
            return
        abort_job(_format(exc_type, exc, tb), 1)

    def thread_excepthook(args):
        if args.exc_type is SystemExit:
            return
        abort_job(_format(args.exc_type, args.exc_value, args.exc_traceback)
                  + f" (in thread {args.thread.name if args.thread else '?'})", 1)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
