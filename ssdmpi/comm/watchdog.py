"""Stall watchdog: a wait that lasts longer than ``--stall-timeout`` names the operation and
the ranks missing from it, then aborts the whole job instead of hanging until the queue limit.

How the missing ranks are found (best effort, documented heuristic): every Communicator
numbers the operations its caller posts (``#seq``; every rank posts the same operations in
the same order). Each rank's watchdog thread owns a private duplicate communicator on which
it answers queries with ``(last posted #seq, what it is waiting in now)``. A rank whose wait
times out asks every other rank, collects replies for a few seconds, and reports:

- a rank whose last posted ``#seq`` is below the stalled operation's has *not reached* it
  (it is still computing, or stuck in something else: its own wait is named);
- a rank that reached it but waits in a different operation called the collectives in a
  different order (a bug in the caller);
- a rank that does not reply is hung where Python cannot run (a C call holding the GIL) or dead;
- when every rank has reached the operation, MPI itself (or the network) is stuck.

The answers come from a helper thread, so this needs ``MPI_THREAD_MULTIPLE`` (the mpich and
Open MPI wheels grant it); without it the report says the missing ranks are unknown.
"""

from __future__ import annotations

import threading
import time

from ssdmpi.comm.abort import abort_job
from ssdmpi.comm.mpi_env import load_mpi

STALL_TIMEOUT_S = 300.0   # the default: seconds one wait may take before the job is aborted

QUERY_TAG, REPLY_TAG = 1, 2


class StallWatchdog:
    """Watches the caller's blocking waits; ``timeout`` seconds in one wait aborts the job.

    ``begin(what, seq)`` / ``end()`` bracket a wait (two attribute writes: cheap);
    ``posted(seq)`` records the caller posting operation ``#seq``. ``comm`` is a private
    duplicate the watchdog owns (queries and replies only); ``stop()`` joins the thread and
    frees it.
    """

    def __init__(self, comm, timeout: float, reply_window: float | None = None):
        self.MPI = MPI = load_mpi()
        self.timeout = float(timeout)
        self.poll = min(0.25, self.timeout / 4)
        self.reply_window = reply_window if reply_window is not None else min(5.0, max(3.0, self.timeout))
        self.comm = comm
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.can_talk = MPI.Query_thread() == MPI.THREAD_MULTIPLE and self.size > 1
        self.posted_seq = 0
        self._current = None          # (what, seq, monotonic start) while the caller waits
        self._stop = threading.Event()
        self._query = self.comm.irecv(source=MPI.ANY_SOURCE, tag=QUERY_TAG) if self.can_talk else None
        self._sends: list = []
        self._thread = threading.Thread(target=self._loop, name="ssdmpi-stall-watchdog", daemon=True)
        self._thread.start()

    def posted(self, seq: int) -> None:
        """The caller posted operation ``#seq``."""
        self.posted_seq = seq

    def begin(self, what, seq: int) -> None:
        """The caller starts waiting in ``str(what)`` (operation ``#seq``; formatted only if reported)."""
        self._current = (what, seq, time.monotonic())

    def end(self) -> None:
        """The caller's wait returned."""
        self._current = None

    def stop(self) -> None:
        """Stop the thread, cancel the pending query receive, free the private communicator."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = None
        if self._query is not None:
            self._query.Cancel()
            self.MPI.Request.Wait(self._query)
            self._query = None
        self.MPI.Request.Waitall(self._sends)
        self.comm.Free()

    # -- the watchdog thread ------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            self._serve()
            current = self._current
            if current is not None and time.monotonic() - current[2] > self.timeout:
                self._fire(*current)
                return

    def _state(self) -> dict:
        current = self._current
        return {"rank": self.rank, "posted": self.posted_seq,
                "waiting": None if current is None else str(current[0]),
                "waiting_s": 0.0 if current is None else time.monotonic() - current[2]}

    def _serve(self) -> None:
        """Answer every query that has arrived."""
        while self._query is not None:
            done, asker = self._query.test()
            if not done:
                return
            self._sends.append(self.comm.isend(self._state(), dest=asker, tag=REPLY_TAG))
            self._sends = [r for r in self._sends if not r.Test()]
            self._query = self.comm.irecv(source=self.MPI.ANY_SOURCE, tag=QUERY_TAG)

    def _fire(self, what, seq: int, since: float) -> None:
        what = str(what)
        waited = time.monotonic() - since
        message = (f"stall: waited {waited:.1f} s (over the stall timeout of {self.timeout:g} s) in {what}; "
                   + self._who_is_missing(what, seq)
                   + "; aborting the job (raise --stall-timeout if a step can legitimately take longer)")
        abort_job(message, 1)

    def _who_is_missing(self, what: str, seq: int) -> str:
        if self.size == 1:
            return "this is the only rank, so MPI itself is stuck"
        if not self.can_talk:
            return "ranks missing: unknown (MPI lacks MPI_THREAD_MULTIPLE, so the ranks cannot be asked)"
        for peer in range(self.size):
            if peer != self.rank:
                self._sends.append(self.comm.isend(self.rank, dest=peer, tag=QUERY_TAG))
        replies: dict = {}
        deadline = time.monotonic() + self.reply_window
        reply = self.comm.irecv(source=self.MPI.ANY_SOURCE, tag=REPLY_TAG)
        while len(replies) < self.size - 1 and time.monotonic() < deadline:
            done, state = reply.test()
            if done:
                replies[state["rank"]] = state
                reply = self.comm.irecv(source=self.MPI.ANY_SOURCE, tag=REPLY_TAG)
                continue
            self._serve()            # peers stalled in the same operation ask us too
            time.sleep(0.01)
        behind, elsewhere, silent, there = [], [], [], []
        for peer in range(self.size):
            if peer == self.rank:
                continue
            state = replies.get(peer)
            if state is None:
                silent.append(f"{peer} (no reply within {self.reply_window:g} s: hung outside Python, or dead)")
            elif state["posted"] < seq:
                doing = (f"waiting {state['waiting_s']:.1f} s in {state['waiting']}" if state["waiting"]
                         else "computing")
                behind.append(f"{peer} (last posted #{state['posted']}, {doing})")
            elif state["waiting"] not in (None, what):
                elsewhere.append(f"{peer} (waiting {state['waiting_s']:.1f} s in a different operation: "
                                 f"{state['waiting']})")
            else:
                there.append(str(peer))
        missing = behind + elsewhere + silent
        text = "ranks missing from it: " + ("; ".join(missing) if missing else "none")
        if there:
            text += f"; ranks that reached it: {', '.join(there)}"
        if not missing:
            text += " (every rank reached it: MPI or the network is stuck)"
        return text
