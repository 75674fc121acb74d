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
- ``poll``: ``test``, plus a ``Poller`` thread that, while a request is pending, wakes every
  ``POLL_INTERVAL_S`` and drives MPI's progress engine with one non-destructive status check
  (``MPI_Request_get_status``), then sleeps again. It keeps the wire busy through the caller's
  long stretches without MPI calls (a big GEMM) at the cost of a wake-up per interval, not a
  spinning core. Needs ``MPI_THREAD_MULTIPLE``; the Communicator serialises its own request
  calls with the poller's under one lock.

Default per backend (``default_progress``), chosen from ``ssdmpi bench comm``'s overlap
measurements at 2 ranks on the 2-core development machine (BENCHMARKS.md section 6, with
the commands):

- GPU (CuPy) runs default to ``thread``: the CPU is idle while kernels run, and a thread
  blocked in MPI moves the data the whole time, whether or not the caller calls ``progress()``.
- CPU (NumPy) runs default to ``test``: never harmful, and the best with CPU-bound compute
  when the caller calls ``progress()`` between layers or steps. A spinning communication
  thread takes the core the compute needs (negative overlap on shared memory, 2 ranks on 2
  cores), though it beats ``test`` on a network when the caller never calls ``progress()``;
  with spare cores per rank ``thread`` may win: measure with ``ssdmpi bench comm``.
"""

from __future__ import annotations

import queue
import threading
import time

PROGRESS = ("auto", "test", "poll", "thread", "blocking")

# How often the ``poll`` strategy's thread drives progress while a request is pending.
POLL_INTERVAL_S = 0.002

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


class Poller:
    """The ``poll`` strategy's thread: while ``pending`` (the Communicator's list of handles
    in flight) is not empty, every ``interval`` seconds it takes ``lock`` and asks MPI for the
    status of the first incomplete request (``Request.Get_status``: it progresses every
    outstanding request, and completes or frees none, so the caller's ``test``/``wait`` stay
    the only ones that do). ``kick()`` after posting; ``stop()`` ends the thread."""

    def __init__(self, lock, pending: list, interval: float = POLL_INTERVAL_S, name: str = "ssdmpi-poll"):
        self._lock, self._pending, self._interval = lock, pending, float(interval)
        self._posted, self._stopping = threading.Event(), False
        self.polls = 0     # status checks made (for tests and curiosity)
        self.settled = threading.Event()   # set when a check found every pending request complete
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """A request was posted: start polling (if not already)."""
        self.settled.clear()
        self._posted.set()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._stopping = True
            self._posted.set()
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while True:
            self._posted.wait()
            if self._stopping:
                return
            time.sleep(self._interval)
            with self._lock:
                if self._stopping:
                    return
                if not self._poll_once():
                    self._posted.clear()   # nothing pending: sleep until the next post

    def _poll_once(self) -> bool:
        """One status check on the first incomplete request; False when nothing is pending."""
        for handle in self._pending:
            for request in handle._requests or ():
                self.polls += 1
                if not request.Get_status():
                    return True
        self.settled.set()
        return bool(self._pending)
