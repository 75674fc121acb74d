"""Progress strategies: who drives a nonblocking allreduce while the caller computes.

MPI libraries rarely progress a nonblocking collective on their own: the data moves only
while some thread is inside an MPI call. So ``--progress`` picks who makes those calls:

- ``blocking``: ``allreduce_start`` runs the whole allreduce; ``wait()`` is free. No overlap,
  no surprises: the baseline.
- ``test``: ``allreduce_start`` posts ``Iallreduce``; the caller's own ``handle.test()`` /
  ``Communicator.progress()`` calls (e.g. between layers or steps) move it along, and
  ``wait()`` finishes it. Overlap depends on how often the caller calls ``progress()``.
- ``thread``: a communication thread runs the allreduce (blocking calls, GIL released)
  while the caller computes; ``wait()`` waits on an event. Needs ``MPI_THREAD_MULTIPLE``.

Default per backend (``default_progress``) is chosen from ``ssdmpi bench comm`` at 2 ranks
on the 2-core development machine (16 MB float32 buffer, compute sized to the
allreduce time, overlap = (t_comm + t_compute - t_total) / t_comm, median of 7):

=========  =====================  ========================
strategy   idle compute (sleep,   CPU-bound compute (NumPy
           as GPU work leaves)    matmul, as CPU training)
=========  =====================  ========================
blocking   0 %                    0 %
test       see ``bench/comm.py``  see ``bench/comm.py``
thread     see ``bench/comm.py``  see ``bench/comm.py``
=========  =====================  ========================

The measured numbers and the command are in ``ssdmpi/bench/comm.py``'s docstring.
"""

from __future__ import annotations

import queue
import threading

PROGRESS = ("auto", "test", "thread", "blocking")

# Chosen from the measurements above: see ``default_progress``.
DEFAULTS = {"cpu": "thread", "gpu": "thread"}


def default_progress(device: str) -> str:
    """The strategy ``--progress auto`` uses for ``device`` (``"cpu"`` or ``"gpu"``)."""
    return DEFAULTS.get(device, "blocking")


class CommThread:
    """One daemon thread running submitted jobs in order (FIFO), so every rank's MPI calls on
    the gradient communicator happen in the order the caller posted them.

    ``submit(job)``: ``job()`` runs on the thread; it must catch its own exceptions (the
    Communicator's jobs store them in their handle). ``stop()`` lets queued jobs finish, then
    joins (with a timeout, so a stalled MPI call cannot hang the exit).
    """

    def __init__(self, name: str = "ssdmpi-comm"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job) -> None:
        """Queue ``job`` (a callable with no arguments)."""
        self._jobs.put(job)

    def stop(self, timeout: float = 10.0) -> None:
        """Finish queued jobs and end the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()
