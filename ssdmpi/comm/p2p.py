"""Point-to-point transfers of flat buffers, for the ``asgd`` parameter server (ALGORITHM.md 11).

``send_start(buf, dest, tag)`` and ``recv_start(buf, source, tag)`` (``source=None``: any source)
are nonblocking and return a ``P2PHandle`` with ``test()`` and ``wait()`` (returns ``buf``; a
receive then knows its ``source``); ``wait_all(handles)``. Do not touch ``buf`` until ``wait()``.
They run on the gradient duplicate and take device buffers through the same ``Transport``.

These are not collective: ranks post different numbers of them, so they take no ``#seq`` of
their own; a wait is watched by the stall watchdog under the ``#seq`` of the rank's latest
collective operation and named ``Isend #7.3 to rank 2 (tag 11, 4.1 KB)``.
"""

from __future__ import annotations

import time

from ssdmpi.comm.mpi_env import load_mpi
from ssdmpi.comm.operations import format_bytes

clock = time.perf_counter


class P2PHandle:
    """A nonblocking send or receive of ``buf`` in flight; see the module docstring."""

    __slots__ = ("buf", "what", "nbytes", "source", "seq", "_owner", "_work", "_request", "_is_recv",
                 "_t_posted", "_final")

    def __init__(self, owner, buf, work, request, what: str, seq: int, is_recv: bool, t_posted: float):
        self.buf, self.what, self.nbytes, self.seq = buf, what, buf.nbytes, seq
        self.source = None
        self._owner, self._work, self._request, self._is_recv = owner, work, request, is_recv
        self._t_posted, self._final = t_posted, False

    def __str__(self) -> str:
        return self.what

    def test(self) -> bool:
        """True when the transfer has completed (call ``wait`` to finalise it)."""
        return self._final or self._request.Test()

    def wait(self):
        """Block until complete; return ``buf`` (a receive's ``source`` is then set)."""
        if not self._final:
            self._owner._finish(self)
        return self.buf


class PointToPoint:
    """Sends and receives on ``comm`` (the gradient duplicate; the caller frees it), through
    ``transport``, watched through ``ops``, timed in ``stats`` (a send counts its bytes)."""

    def __init__(self, comm, transport, ops, stats):
        self._MPI = load_mpi()
        self._comm, self.transport, self.ops, self.stats = comm, transport, ops, stats
        self._count = 0      # operations posted (they are named ``#seq.count``)

    def send_start(self, buf, dest: int, tag: int) -> P2PHandle:
        """Start sending ``buf`` to rank ``dest`` with ``tag``; do not write ``buf`` until ``wait()``."""
        return self._post(buf, dest, tag, recv=False)

    def recv_start(self, buf, source: int | None, tag: int) -> P2PHandle:
        """Start receiving into ``buf`` from ``source`` (None: any rank) with ``tag``; do not touch
        ``buf`` until ``wait()``, which sets the handle's ``source``."""
        return self._post(buf, source, tag, recv=True)

    def wait_all(self, handles) -> None:
        """``wait()`` for every handle, in order."""
        for handle in handles:
            handle.wait()

    def _post(self, buf, peer, tag: int, recv: bool) -> P2PHandle:
        t_posted = clock()
        self._count += 1
        work = self.transport.to_mpi(buf)
        if recv:
            source = self._MPI.ANY_SOURCE if peer is None else peer
            request = self._comm.Irecv(work, source=source, tag=tag)
            where = "from any rank" if peer is None else f"from rank {peer}"
        else:
            request = self._comm.Isend(work, dest=peer, tag=tag)
            where = f"to rank {peer}"
        seq = self.ops.seq
        what = (f"{'Irecv' if recv else 'Isend'} #{seq}.{self._count} {where} "
                f"(tag {tag}, {format_bytes(buf.nbytes)})")
        return P2PHandle(self, buf, work, request, what, seq, recv, t_posted)

    def _finish(self, handle) -> None:
        t_wait = clock()
        status = self._MPI.Status()
        self.ops.watched(handle, handle.seq, handle._request.Wait, status)
        handle._final = True
        if handle._is_recv:
            handle.source = status.Get_source()
            self.transport.from_mpi(handle.buf, handle._work)
        t_end = clock()
        self.stats.record(0 if handle._is_recv else handle.nbytes, t_end - handle._t_posted, t_end - t_wait, 0.0)
