"""``--progress thread``: a communication thread runs each allreduce (blocking MPI calls, which
release the GIL) while the caller computes; ``wait()`` waits on an event. Needs
``MPI_THREAD_MULTIPLE``."""

from __future__ import annotations

import queue
import threading

from ssdmpi.comm.gradients import GradientChannel, clock


class ThreadChannel(GradientChannel):
    """Allreduces run in posting order on one ``CommThread`` (see the module docstring)."""

    name = "thread"
    needs_thread_multiple = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._thread = CommThread()

    def _start(self, handle, divide_here: bool) -> None:
        handle._event = threading.Event()
        self._thread.submit(lambda: self._job(handle, divide_here))
        self._track(handle)

    def _test_posted(self, handle) -> bool:
        return handle._event.is_set()

    def _complete(self, handle) -> None:
        if handle._event is not None and not handle._event.is_set():
            self.ops.watched(handle, handle.seq, handle._event.wait)

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None

    def _job(self, handle, divide_here: bool) -> None:
        """Runs on the communication thread."""
        try:
            self._reduce_buckets(handle, divide_here)
            handle._t_complete = clock()
        except BaseException as exc:   # reported by ``wait`` on the caller's thread
            handle._error = exc
        finally:
            handle._event.set()


class CommThread:
    """One daemon thread running submitted jobs in order (FIFO), so every rank's MPI calls on
    the gradient communicator happen in the order the caller posted them.

    ``submit(job)``: ``job()`` runs on the thread; it must catch its own exceptions (the
    channel's jobs store them in their handle). ``stop()`` lets queued jobs finish, then
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
