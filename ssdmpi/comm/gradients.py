"""The gradient channel: in-place allreduce and broadcast of flat buffers on the gradient duplicate.

Contract (``Communicator`` forwards these calls; see ``ssdmpi/comm/communicator.py``):

- A *flat buffer* is a C-contiguous array (NumPy, or a device array exposing
  ``__cuda_array_interface__`` such as CuPy's); it is reduced as one 1-D vector, in place.
- ``allreduce_start(buf, average=True, compressor=None) -> AllreduceHandle``: nonblocking. The
  caller must not read or write ``buf`` until ``handle.wait()`` returns; ``wait()`` returns ``buf``
  holding the sum over ranks (or the mean when ``average``; float buffers only). ``handle.test()``
  is True once the reduction completed (``wait()`` then returns at once, after finalising).
  Requests complete in the order they were posted; every rank must post the same sequence.
  ``compressor`` (a ``Compressor`` of ``ssdmpi/comm/compressed.py``, from ``compressor(dtype, like)``):
  the sum travels compressed (float32 buffers, one request whatever the buckets), as that module says.
- ``progress()``: cheap; with ``--progress test`` (and ``poll``) it moves outstanding requests
  along (call it between layers or steps); a no-op for the other strategies.
- ``allreduce(buf, average=True)`` / ``allreduce_mean(buf)`` and ``broadcast(buf, root=0)``:
  blocking, in place. They first finish any outstanding requests (which keeps every rank's
  operations in the same order), then run in the caller's thread.

Who drives a posted allreduce to completion is the progress strategy: one subclass of
``GradientChannel`` per strategy, in ``ssdmpi/comm/progress/`` (``create`` there makes one). This
base class holds what every strategy shares: the checks, staging, buckets, the blocking reduction
(``allreduce`` under every strategy, and ``allreduce_start`` under ``blocking``), the wait's
copy back and division, and the timings and wire bytes in ``stats`` (``wire_bytes``).

Results are bitwise identical on every rank: MPI's builtin SUM gives every rank the same
bytes (each element is reduced once, or by commutative pairs, and then distributed), buckets
are fixed slices of the same vector on every rank, and the mean is one IEEE division by
``size`` applied identically everywhere (a multiplication by ``1/size`` when ``size`` is a power
of two: the same bits). (Checked at 1, 2 and 4 ranks by ``tests/mpi/test_comm.py``.) A mean
reduced in the caller's thread or on the communication thread (``blocking`` and ``thread``
strategies, and every blocking call) of a host bucket of at least ``fused_mean.MIN_BYTES`` runs
``ssdmpi/comm/fused_mean.py``: a reduce-scatter that divides each piece in cache right after its
last addition, then an allgather, so the division costs no pass of its own (a power-of-two rank
count adds in the reference simulator's pairwise order; at ``N <= 2`` the bits are those of MPI's
sum divided). A nonblocking mean under ``test``/``poll`` is MPI's ``Iallreduce`` and then a
division pass in ``wait``. Callers that can fold ``1/size`` into their own update should use
``average=False`` (the trainer's algorithms do): then there is no division at all.

GPU buffers: see ``ssdmpi/comm/transport.py``. ``allreduce_start`` never waits for the GPU: it
orders the staging after the kernel that wrote ``buf`` with events, and the request is posted
once the staging is ready (by the communication thread, or by ``progress``/``test``/``wait``
with ``--progress test``); ``wait`` queues the copy back before the caller's next kernels.
"""

from __future__ import annotations

import contextlib
import time

from ssdmpi.comm import fused_mean
from ssdmpi.comm.mpi_env import load_mpi
from ssdmpi.comm.operations import format_bytes

clock = time.perf_counter


class AllreduceHandle:
    """An in-place allreduce in flight on ``buf``; see the module contract.

    ``str(handle)`` names it as the stall watchdog does, e.g. ``Iallreduce #12 of 3.4 MB``
    (built only when needed: formatting on every call would cost more than the bookkeeping).
    The fields after ``_owner`` are the channel's bookkeeping: what MPI works on (``_work``,
    ``_buckets``, ``_staged``), how it is driven (``_requests``, ``_event``, ``_unposted``), the
    division still due (``_divisor``, ``_divided``), and the clock readings of ``stats``.
    """

    __slots__ = ("buf", "seq", "nbytes", "wire_bytes", "_owner", "_work", "_buckets", "_divisor", "_divided",
                 "_requests", "_event", "_error", "_t_posted", "_t_returned", "_t_complete", "_final",
                 "_staged", "_unposted", "_chain")

    def __init__(self, owner, buf, staged, buckets, divisor, seq, t_posted, chain=None):
        self.buf, self.seq, self.nbytes = buf, seq, buf.nbytes
        self._owner, self._staged, self._work, self._buckets = owner, staged, staged.work, buckets
        self._chain = chain     # a compressed sum (``ssdmpi/comm/compressed.py``), or None
        self.wire_bytes = (chain.compressor.wire_bytes if chain is not None
                           else sum(wire_bytes(b.nbytes, owner.size) for b in buckets))
        self._divisor, self._divided = divisor, False
        self._requests = self._event = self._error = None
        self._t_posted, self._t_returned = t_posted, 0.0
        self._t_complete = None
        self._final = self._unposted = False

    def __str__(self) -> str:
        if self._chain is not None:
            return f"{self._chain} #{self.seq} of {format_bytes(self.nbytes)}"
        text = f"Iallreduce #{self.seq} of {format_bytes(self.nbytes)}"
        return text + (f" ({len(self._buckets)} buckets)" if len(self._buckets) > 1 else "")

    @property
    def what(self) -> str:
        """The operation's name in messages."""
        return str(self)

    def test(self) -> bool:
        """True when the reduction has completed (does not finalise the result; call ``wait``)."""
        return self._final or self._t_complete is not None or self._owner._test_posted(self)

    def wait(self):
        """Block until complete; return ``buf`` with the sum (or mean) over ranks."""
        if not self._final:
            self._owner._finish(self)
        return self.buf


def wire_bytes(nbytes: int, size: int) -> int:
    """Bytes one rank sends in an allreduce of ``nbytes`` on ``size`` ranks: ``2 (size-1)/size nbytes``,
    what the bandwidth-optimal algorithms (ring; reduce-scatter then allgather) that MPI libraries use
    for large buffers send (recursive doubling, for small ones, sends ``log2(size) nbytes``)."""
    return 2 * (size - 1) * int(nbytes) // size


class GradientChannel:
    """Gradient and weight traffic on ``comm`` (a private duplicate no one else uses); the base of
    the progress strategies (``ssdmpi/comm/progress/``).

    Args: ``comm``: the mpi4py communicator it owns the traffic of (the caller frees it);
    ``transport``: a ``Transport``; ``ops``: the ``Operations`` shared with the other channels;
    ``stats``: a ``CommStats``; ``bucket_bytes``: None for one fused request, else the size of
    each fixed slice. Construction is collective (``FusedMean`` splits ``comm``; the second step of a
    compressed sum has a duplicate of its own, ``_gather_comm``).

    A strategy subclass sets ``name`` and overrides ``_start`` (post a handle) and, as needed,
    ``_test_posted``, ``_complete``, ``progress`` and ``stop``. ``pending``: the handles not yet
    finalised, in posting order; ``_lock`` guards it and the strategy's request calls.
    """

    name = ""                       # the strategy's ``--progress`` name
    needs_thread_multiple = False   # the strategy runs MPI calls on a helper thread
    moved_by_caller = False         # a request in flight moves only inside the caller's MPI calls

    def __init__(self, comm, transport, ops, stats, bucket_bytes: int | None = None):
        self._MPI = load_mpi()
        self._comm = comm
        self.transport, self.ops, self.stats = transport, ops, stats
        self.bucket_bytes = bucket_bytes
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._fused_mean = fused_mean.FusedMean(comm)   # collective: splits a copy of comm
        self._gather_comm = comm.Dup()                   # compressed sums' second collective (compressed.py)
        self._host_staging = None                        # their codes' pinned staging (device buffers)
        self.pending: list = []
        self._lock = contextlib.nullcontext()

    # -- the calls ---------------------------------------------------------------------------
    def allreduce_start(self, buf, average: bool = True, compressor=None) -> AllreduceHandle:
        """Start an in-place allreduce (sum, or mean when ``average``; compressed with ``compressor``);
        see the module contract."""
        return self._post(buf, average, self._start, compressor)

    def compressor(self, dtype: str, like):
        """A ``Compressor`` (``ssdmpi/comm/compressed.py``) for sums of float32 buffers shaped as ``like``."""
        from ssdmpi import backend
        from ssdmpi.comm.compressed import Compressor

        if like.dtype.str[1:] != "f4":
            raise TypeError(f"a compressed sum adds float32 buffers, not {like.dtype}")
        return Compressor(dtype, like.size, self.size, self.rank, backend.array_module(like))

    def allreduce(self, buf, average: bool = True):
        """Blocking, in place: ``buf <- sum`` (or mean) over ranks; returns ``buf``."""
        self.drain()
        return self._post(buf, average, self._reduce_now).wait()

    def allreduce_mean(self, buf):
        """Blocking, in place: ``buf <- mean over ranks``; returns ``buf``."""
        return self.allreduce(buf, average=True)

    def broadcast(self, buf, root: int = 0):
        """Blocking, in place: every rank gets ``root``'s ``buf``; returns ``buf``."""
        self.drain()
        seq = self.ops.next_seq()
        work = self.transport.to_mpi(buf)
        self.ops.watched(f"Bcast #{seq} of {format_bytes(buf.nbytes)} from rank {root}", seq,
                         self._comm.Bcast, work, root=root)
        self.transport.from_mpi(buf, work)
        return buf

    def progress(self) -> None:
        """Move outstanding requests along (``test`` and ``poll``; a no-op otherwise). Cheap."""

    def drain(self) -> None:
        """``wait()`` for every outstanding request, in posting order."""
        for handle in list(self.pending):
            handle.wait()

    def stop(self) -> None:
        """Stop the strategy's helper thread, if any (a local act)."""

    def free(self) -> None:
        """Collective: free what construction made (the caller drains and stops first)."""
        self._fused_mean.free()
        self._gather_comm.Free()

    # -- what a strategy overrides ------------------------------------------------------------
    def _start(self, handle, divide_here: bool) -> None:
        """Post ``handle`` and add it to ``pending`` (the caller's thread, in ``allreduce_start``);
        ``divide_here``: the mean's division is due on the host right after the reduction."""
        raise NotImplementedError

    def _test_posted(self, handle) -> bool:
        """``handle.test()`` of a handle this strategy posted and that is not known complete."""
        return True

    def _complete(self, handle) -> None:
        """Return once MPI has finished with ``handle``'s buffer (``wait``, before the copy back)."""

    # -- shared machinery --------------------------------------------------------------------------
    def _post(self, buf, average: bool, start, compressor=None) -> AllreduceHandle:
        t_posted = clock()
        if average and buf.dtype.kind not in "fc":
            raise TypeError(f"cannot average a {buf.dtype} buffer in place; pass average=False for a sum")
        for other in self.pending:
            if other.buf is buf:
                raise ValueError(f"this buffer is already in flight in {other}; wait() for it before reusing it")
        seq = self.ops.next_seq()
        divisor = self.size if average and self.size > 1 else None
        if compressor is None:
            staged = self.transport.stage(buf)      # returns at once; MPI may start once staged.ready()
            handle = AllreduceHandle(self, buf, staged, self._buckets(staged.work), divisor, seq, t_posted)
        else:
            chain = self._make_chain(compressor, buf)    # encodes now; its codes are staged like a buffer
            handle = AllreduceHandle(self, buf, chain.staged, [], divisor, seq, t_posted, chain)
        # Dividing on the host right after each bucket is reduced keeps the data in cache; device
        # buffers (and compressed sums) are divided in ``wait`` (a device's on the caller's stream).
        start(handle, divisor is not None and not self.transport.is_device(buf) and compressor is None)
        handle._t_returned = clock()
        return handle

    def _make_chain(self, compressor, buf):
        from ssdmpi.comm.compressed import Chain
        from ssdmpi.comm.transport import Transport

        if self._host_staging is None and self.transport.is_device(buf):
            self._host_staging = Transport("host", self.transport.streams)
        return Chain(compressor, buf, self._host_staging)

    def _track(self, handle) -> None:
        """Add a posted handle to ``pending``."""
        with self._lock:
            self.pending.append(handle)

    def _buckets(self, work) -> list:
        flat = work if work.ndim == 1 else work.reshape(-1)
        if not self.bucket_bytes or self.bucket_bytes >= flat.nbytes:
            return [flat]
        step = max(1, self.bucket_bytes // flat.itemsize)
        return [flat[i:i + step] for i in range(0, flat.size, step)]

    def _reduce_now(self, handle, divide_here: bool) -> None:
        """Reduce ``handle`` in the caller's thread, watched; it is complete on return."""
        self.ops.watched(handle, handle.seq, self._reduce_buckets, handle, divide_here)
        handle._t_complete = clock()
        self._track(handle)

    def _reduce_buckets(self, handle, divide_here: bool) -> None:
        """Blocking reduction of every bucket (the caller's thread, or the communication thread)."""
        MPI = self._MPI
        op, in_place, allreduce = MPI.SUM, MPI.IN_PLACE, self._comm.Allreduce
        handle._staged.wait_ready()        # this thread waits for the staging copy; the GPU runs on
        if handle._chain is not None:
            handle._chain.run(self._comm, self._gather_comm)
            handle._divided = False
            return
        for b in handle._buckets:
            if divide_here and b.nbytes >= fused_mean.MIN_BYTES:
                self._fused_mean(b)        # the division inside the reduction, in cache
                continue
            allreduce(in_place, b, op=op)
            if divide_here:
                fused_mean.divide(b, handle._divisor)
        handle._divided = divide_here

    def _finish(self, handle) -> None:
        """``wait()``: complete the request, copy back, divide, record timings."""
        t_wait = clock()
        self._complete(handle)
        with self._lock:
            self.pending.remove(handle)
        handle._final = True
        if handle._error is not None:
            raise RuntimeError(f"{handle.what} failed on the communication thread: {handle._error}") \
                from handle._error
        if handle._chain is not None:
            handle._chain.finish(handle.buf, self.transport.streams)
        else:
            self.transport.from_mpi(handle.buf, handle._work)
        if handle._divisor is not None and not handle._divided:
            fused_mean.divide(handle.buf, handle._divisor)
        t_end = clock()
        exposed = (handle._t_returned - handle._t_posted) + (t_end - t_wait)
        self.stats.record(handle.wire_bytes, handle._t_complete - handle._t_posted, exposed,
                          t_wait - handle._t_returned)
