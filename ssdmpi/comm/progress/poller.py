"""``--progress poll``: ``test``, plus a ``Poller`` thread that, while a request is pending, wakes
every ``POLL_INTERVAL_S`` and drives MPI's progress engine with one non-destructive status check
(``MPI_Request_get_status``), then sleeps again. It keeps the wire busy through the caller's long
stretches without MPI calls (a big GEMM) at the cost of a wake-up per interval, not a spinning
core. Needs ``MPI_THREAD_MULTIPLE``; the channel serialises its own request calls with the
poller's under one lock.
"""

from __future__ import annotations

import threading
import time

from ssdmpi.comm.progress.caller import CallerChannel

# How often the poller drives progress while a request is pending.
POLL_INTERVAL_S = 0.002


class PollerChannel(CallerChannel):
    """``CallerChannel`` with a ``Poller`` thread (see the module docstring)."""

    name = "poll"
    needs_thread_multiple = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._poller = Poller(self._lock, self.pending)

    def _posted(self) -> None:
        if self._poller is not None:
            self._poller.kick()

    def stop(self) -> None:
        if self._poller is not None:
            self._poller.stop()
            self._poller = None


class Poller:
    """The ``poll`` strategy's thread: while ``pending`` (the channel's list of handles in flight)
    is not empty, every ``interval`` seconds it takes ``lock`` and asks MPI for the status of the
    first incomplete request (``Request.Get_status``: it progresses every outstanding request,
    and completes or frees none, so the caller's ``test``/``wait`` stay the only ones that do).
    ``kick()`` after posting; ``stop()`` ends the thread."""

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
