"""Progress strategies: who drives a nonblocking allreduce while the caller computes.

MPI libraries rarely progress a nonblocking collective on their own: the data moves only
while some thread is inside an MPI call. So ``--progress`` picks who makes those calls. Each
strategy is one ``GradientChannel`` subclass (``ssdmpi/comm/gradients.py``) in its own file;
``create(strategy, ...)`` makes one (its docstring has the table of what each does and needs).
Every strategy also runs the blocking calls (``allreduce``, ``broadcast``) in the caller's thread.

Default per backend (``default_progress``), chosen from ``ssdmpi bench comm``'s overlap
measurements at 2 ranks on a 2-core machine (BENCHMARKS.md, "Communicator vs raw mpi4py, and
overlap per progress strategy", with the commands):

- GPU (CuPy) runs default to ``thread``: the CPU is idle while kernels run, and a thread
  blocked in MPI moves the data the whole time, whether or not the caller calls ``progress()``.
- CPU (NumPy) runs default to ``test``: never harmful, and the best with CPU-bound compute
  when the caller calls ``progress()`` between layers or steps. A spinning communication
  thread takes the core the compute needs (negative overlap on shared memory, 2 ranks on 2
  cores), though it beats ``test`` on a network when the caller never calls ``progress()``;
  with spare cores per rank ``thread`` may win: measure with ``ssdmpi bench comm``.
"""

from __future__ import annotations

from ssdmpi.comm.gradients import GradientChannel
from ssdmpi.comm.mpi_env import load_mpi
from ssdmpi.comm.progress.blocking import BlockingChannel
from ssdmpi.comm.progress.caller import CallerChannel
from ssdmpi.comm.progress.poller import PollerChannel
from ssdmpi.comm.progress.thread import ThreadChannel
from ssdmpi.errors import UserError

CHANNELS = {cls.name: cls for cls in (CallerChannel, PollerChannel, ThreadChannel, BlockingChannel)}
PROGRESS = ("auto", *CHANNELS)

# Chosen from the measurements above: see ``default_progress``.
DEFAULTS = {"cpu": "test", "gpu": "thread"}


def default_progress(device: str) -> str:
    """The strategy ``--progress auto`` uses for ``device`` (``"cpu"`` or ``"gpu"``)."""
    return DEFAULTS.get(device, "blocking")


def resolve(progress: str, device: str) -> str:
    """The strategy ``--progress progress`` means on ``device`` (``auto``: ``default_progress``).
    A ``UserError`` for an unknown name, or for a strategy this MPI library cannot run."""
    if progress not in PROGRESS:
        raise UserError(f"unknown progress strategy {progress!r}; choose one of {', '.join(PROGRESS)}")
    strategy = default_progress(device) if progress == "auto" else progress
    MPI = load_mpi()
    if CHANNELS[strategy].needs_thread_multiple and MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        raise UserError(f"--progress {strategy} needs MPI_THREAD_MULTIPLE, which this MPI library did not grant; "
                        "use --progress test or blocking")
    return strategy


def create(strategy: str, comm, transport, ops, stats, bucket_bytes: int | None = None) -> GradientChannel:
    """The gradient channel of ``strategy`` (a name ``resolve`` returned) on ``comm``; collective.
    The other arguments are ``GradientChannel``'s.

    ========  ===========  ===========================================  ===================  ==========
    strategy  file         who moves the data (overlap)                 needs                default on
    ========  ===========  ===========================================  ===================  ==========
    blocking  blocking.py  the caller, inside ``allreduce_start``       -                    -
                           (none: ``wait()`` is free)
    test      caller.py    the caller's ``progress``/``test``/``wait``  -                    CPU
                           (as much as the caller calls them)
    poll      poller.py    test's calls, and a thread every 2 ms        MPI_THREAD_MULTIPLE  -
                           (also through long compute)
    thread    thread.py    a communication thread, blocking MPI calls   MPI_THREAD_MULTIPLE  GPU
                           (all of it, without calls by the caller)
    ========  ===========  ===========================================  ===================  ==========
    """
    return CHANNELS[strategy](comm, transport, ops, stats, bucket_bytes)
