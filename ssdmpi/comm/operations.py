"""The caller's MPI operations as the stall watchdog sees them: numbered, named, watched.

Every rank posts the same collective operations in the same order, so a running number
(``#seq``) names the same operation on every rank; the watchdog (``ssdmpi/comm/watchdog.py``)
compares ranks by it. The Communicator's channels (gradients, control, point-to-point) share one
``Operations``, so gradient and control operations are numbered in one sequence.
"""

from __future__ import annotations


def format_bytes(n: int) -> str:
    """``3.4 MB``-style size for messages."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class Operations:
    """``next_seq()`` numbers a collective operation as it is posted; ``seq`` is the latest number;
    ``watched(what, seq, fn, ...)`` runs a blocking call while ``watchdog`` (a ``StallWatchdog``,
    or None: unwatched) watches it as operation ``str(what)``; ``stop()`` stops the watchdog."""

    def __init__(self, watchdog=None):
        self.watchdog = watchdog
        self.seq = 0

    def next_seq(self) -> int:
        """Number the operation being posted (and tell the watchdog)."""
        self.seq += 1
        if self.watchdog is not None:
            self.watchdog.posted(self.seq)
        return self.seq

    def watched(self, what, seq: int, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, watched as operation ``#seq`` named ``str(what)`` (formatted only
        if the watchdog reports it)."""
        if self.watchdog is None:
            return fn(*args, **kwargs)
        self.watchdog.begin(what, seq)
        try:
            return fn(*args, **kwargs)
        finally:
            self.watchdog.end()

    def stop(self) -> None:
        """Stop the watchdog's thread (a local act); later operations are unwatched."""
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
