"""Per-interval communication timings, cheap enough to leave on (a few clock reads per allreduce).

The Communicator records one entry per allreduce when it is finalised (``wait()``). The
trainer reads and clears the totals once per logging interval with ``snapshot_and_reset()``,
which returns a dict with exactly these keys (all per rank, summed over the interval):

=================  ======================================================================
``allreduce_count``  allreduces finalised in the interval
``bytes_sent``       bytes this rank put on the wire for other ranks: an allreduce of a buffer
                     of ``nbytes`` counts ``2 (N-1)/N nbytes`` (``gradients.wire_bytes``: what
                     the ring and reduce-scatter + allgather algorithms send), a compressed
                     sum its codes' ``2 (N-1)`` pieces (``ssdmpi/comm/compressed.py``), a
                     point-to-point send its ``nbytes``; 0 on one rank
``inflight_s``       time from posting each allreduce to its observed completion
``wait_s``           exposed time: the caller blocked inside ``allreduce_start`` (blocking
                     strategy, GPU staging copies), ``wait()``, or ``progress()`` (test
                     strategy: the data moves during those calls, on the caller's time)
``progress_s``       the part of ``wait_s`` spent inside ``progress()`` calls
``compute_s``        time the caller spent elsewhere between ``allreduce_start`` returning
                     and calling ``wait()`` (its compute while the request was in flight)
``overlap``          hidden fraction of the communication: ``1 - wait_s / inflight_s``,
                     clipped to [0, 1]; 0.0 when nothing was in flight
``interval_s``       wall time since the previous reset
=================  ======================================================================

"Observed completion" is exact for the blocking and thread strategies; with the ``test``
strategy it is the first ``test()``/``progress()`` call that saw the request done (or the end
of ``wait()``), so ``inflight_s`` is an upper bound there.
"""

from __future__ import annotations

import time

KEYS = ("allreduce_count", "bytes_sent", "inflight_s", "wait_s", "progress_s", "compute_s", "overlap", "interval_s")


class CommStats:
    """Running totals of one Communicator's allreduces since the last reset."""

    __slots__ = ("allreduce_count", "bytes_sent", "inflight_s", "wait_s", "progress_s", "compute_s", "_since")

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Zero the totals and restart the interval clock."""
        self.allreduce_count = 0
        self.bytes_sent = 0
        self.inflight_s = 0.0
        self.wait_s = 0.0
        self.progress_s = 0.0
        self.compute_s = 0.0
        self._since = time.perf_counter()

    def record(self, nbytes: int, inflight_s: float, wait_s: float, compute_s: float) -> None:
        """Add one finalised operation that sent ``nbytes`` on the wire."""
        self.allreduce_count += 1
        self.bytes_sent += int(nbytes)
        self.inflight_s += inflight_s
        self.wait_s += wait_s
        self.compute_s += compute_s

    def add_exposed(self, seconds: float) -> None:
        """Add communication time the caller spent outside ``wait`` (``progress()`` calls)."""
        self.wait_s += seconds
        self.progress_s += seconds

    def snapshot(self) -> dict:
        """The totals so far as a dict with the documented ``KEYS``."""
        overlap = 0.0
        if self.inflight_s > 0:
            overlap = min(1.0, max(0.0, 1.0 - self.wait_s / self.inflight_s))
        return {"allreduce_count": self.allreduce_count, "bytes_sent": self.bytes_sent,
                "inflight_s": self.inflight_s, "wait_s": self.wait_s, "progress_s": self.progress_s,
                "compute_s": self.compute_s, "overlap": overlap, "interval_s": time.perf_counter() - self._since}

    def snapshot_and_reset(self) -> dict:
        """``snapshot()``, then ``reset()``."""
        snap = self.snapshot()
        self.reset()
        return snap
