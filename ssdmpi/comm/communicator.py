"""The Communicator: allreduce of flat buffers over mpi4py buffer calls.

Minimal first version (blocking progress only). Contract, which later versions keep:

- ``Communicator(comm=None)`` duplicates ``comm`` (default COMM_WORLD) twice: one
  communicator for gradient/weight traffic, one (``control``) for metrics and agreement,
  so control traffic never interleaves with an outstanding request.
- ``allreduce_mean(buf)``: blocking, in place, ``buf <- mean over ranks of buf``.
- ``allreduce_start(buf, average=True) -> AllreduceHandle``: nonblocking, in place.
  The caller must not read or write ``buf`` until ``handle.wait()`` returns; ``wait()``
  returns ``buf`` holding the sum (or the mean when ``average``) over ranks.
  ``handle.test()`` is True once complete (and then ``wait()`` returns at once).
- ``broadcast(buf, root=0)``: blocking, in place.
Results are bitwise identical on every rank.
"""

from __future__ import annotations


class AllreduceHandle:
    """An allreduce in flight on ``buf`` (in place)."""

    def __init__(self, request, buf, divisor: int | None):
        self._request, self.buf, self._divisor, self._done = request, buf, divisor, False

    def test(self) -> bool:
        """True when the reduction has completed (does not finalise the result; call ``wait``)."""
        if self._done:
            return True
        return bool(self._request.Test())

    def wait(self):
        """Block until complete; return ``buf`` with the reduced result."""
        if not self._done:
            self._request.Wait()
            if self._divisor:
                self.buf /= self._divisor
            self._done = True
        return self.buf


class Communicator:
    """Gradient/weight traffic (``comm``) and control traffic (``control``) on separate duplicates."""

    def __init__(self, comm=None):
        from mpi4py import MPI

        self.MPI = MPI
        base = comm if comm is not None else MPI.COMM_WORLD
        self.comm = base.Dup()
        self.control = base.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    def allreduce_mean(self, buf):
        """Blocking, in place: ``buf <- mean over ranks``; returns ``buf``."""
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        if self.size > 1:
            buf /= self.size
        return buf

    def allreduce_start(self, buf, average: bool = True) -> AllreduceHandle:
        """Start an in-place allreduce (sum, or mean when ``average``); see the module contract."""
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        return AllreduceHandle(request, buf, self.size if average and self.size > 1 else None)

    def broadcast(self, buf, root: int = 0):
        """Blocking, in place: every rank gets ``root``'s ``buf``."""
        self.comm.Bcast(buf, root=root)
        return buf

    def free(self) -> None:
        """Release the duplicated communicators."""
        for c in (self.comm, self.control):
            if c != self.MPI.COMM_NULL:
                c.Free()
