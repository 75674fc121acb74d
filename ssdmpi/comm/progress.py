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

Default per backend (``default_progress``), chosen from ``ssdmpi bench comm`` at 2 ranks on
the 2-core development machine (MPICH 5.0.2 wheel; the machine was shared with other jobs,
load average 6-13, so single numbers move by +-20 points; the ranking held in every run).
16 MB float32 buffer, compute = 1.2 x the allreduce time, overlap = (t_comm + t_compute -
t_total) / t_comm, median of 9-21 paired repeats, one value or range per run:

=================================  ========  =========  =========
overlap (hidden fraction)          blocking  test       thread
=================================  ========  =========  =========
shared memory, idle, 1 piece       --        3 %, 37 %  99 %, 99 %
shared memory, idle, 10 pieces     ~0 %      26-54 %    63-83 %
shared memory, CPU-bound, 10 p.    ~0 %      5-42 %     -26-25 %
1 Gbit/s TCP, idle, 1 piece        -1 %      50 %       100 %
1 Gbit/s TCP, idle, 10 pieces      0 %       87-88 %    97-98 %
1 Gbit/s TCP, CPU-bound, 1 piece   -2 %      43 %       60 %
1 Gbit/s TCP, CPU-bound, 10 p.     -4-1 %    66-89 %    56-68 %
=================================  ========  =========  =========

(idle = ``time.sleep``, standing in for GPU kernels, which leave the CPU free; CPU-bound =
NumPy matmuls; "pieces" = how often the caller calls ``progress()`` during the compute, 1 =
only after it; 1 Gbit/s = ``bin/ssdmpi-netns --rate 1gbit``. The 10-piece idle rows on
shared memory lose to the sleeping caller waking late on the oversubscribed machine.) So:

- GPU (CuPy) runs default to ``thread``: the CPU is idle while kernels run, and a thread
  blocked in MPI moves the data the whole time, whether or not the caller calls ``progress()``.
- CPU (NumPy) runs default to ``test``: never harmful, and the best with CPU-bound compute
  when the caller calls ``progress()`` between layers or steps. A spinning communication
  thread takes the core the compute needs (negative overlap on shared memory, 2 ranks on 2
  cores), though it beats ``test`` on a network when the caller never calls ``progress()``;
  with spare cores per rank ``thread`` may win: measure with ``ssdmpi bench comm``.

Full tables and commands: ``ssdmpi/bench/comm.py``'s docstring.
"""

from __future__ import annotations

import queue
import threading

PROGRESS = ("auto", "test", "thread", "blocking")

# Chosen from the measurements above: see ``default_progress``.
DEFAULTS = {"cpu": "test", "gpu": "thread"}


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
