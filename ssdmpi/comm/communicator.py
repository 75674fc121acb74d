"""The Communicator: averaged allreduce of flat buffers over mpi4py buffer calls.

Contract (the layers above code against it; nothing outside ``ssdmpi/comm/`` touches MPI):

- ``Communicator(comm=None, progress="auto", transport="auto", bucket_bytes=None,
  stall_timeout=300.0)`` duplicates ``comm`` (an mpi4py communicator, default COMM_WORLD)
  three times, privately: one carries gradient/weight traffic, one control traffic
  (metrics, agreement, checkpoints), so control traffic never interleaves with an
  outstanding request, and one is the stall watchdog's (``stall_timeout=None`` or 0
  disables it). Collective: every rank constructs it together, with the same settings.
  ``.rank``, ``.size``, ``.strategy`` (the resolved progress strategy; ``auto`` picks by
  ``backend.device()``, so select the backend first), ``.stats`` (a ``CommStats``; see
  ``ssdmpi/comm/stats.py`` for its keys), ``settings()`` (a dict).
- A *flat buffer* is a C-contiguous array (NumPy, or a device array exposing
  ``__cuda_array_interface__`` such as CuPy's); it is reduced as one 1-D vector, in place.
- ``allreduce_start(buf, average=True) -> AllreduceHandle``: nonblocking. The caller must not
  read or write ``buf`` until ``handle.wait()`` returns; ``wait()`` returns ``buf`` holding the
  sum over ranks (or the mean when ``average``; float buffers only). ``handle.test()`` is True
  once the reduction completed (``wait()`` then returns at once, after finalising).
  Requests complete in the order they were posted; every rank must post the same sequence.
- ``progress()``: cheap; with ``--progress test`` it moves outstanding requests along (call it
  between layers or steps); a no-op for the other strategies.
- ``allreduce(buf, average=True)`` / ``allreduce_mean(buf)`` and ``broadcast(buf, root=0)``:
  blocking, in place. They first finish any outstanding requests (which keeps every rank's
  operations in the same order), then run in the caller's thread.
- Control calls (blocking, collective, on the control duplicate): ``barrier()``,
  ``broadcast_object(obj, root)``, ``check_agreement(signature)``, ``agree_error(exc)``,
  ``agree(fn)``, ``any_true(flag)``, ``allreduce_scalars(values, op)`` (and its nonblocking
  ``allreduce_scalars_start``, whose handle's ``wait()`` returns the dict), and the state-tree
  transport of checkpoints: ``gather_trees(tree, root)`` / ``scatter_trees(tree_of, root)``
  (one rank's tree at a time on the root).
- Point-to-point (nonblocking, on the gradient duplicate; used by the ``asgd`` parameter
  server): ``send_start(buf, dest, tag)`` and ``recv_start(buf, source, tag)`` (``source=None``:
  any source) return a ``P2PHandle`` with ``test()``, ``wait()`` (returns ``buf``; a receive
  then knows its ``source``); ``wait_all(handles)``. Do not touch ``buf`` until ``wait()``.
  These are not collective: ranks post different numbers of them, so they take no ``#seq``
  of their own; a wait is watched by the stall watchdog under the ``#seq`` of the rank's
  latest collective operation and named ``Isend #7.3 to rank 2 (tag 11, 4.1 KB)``.
- ``free()``: collective; finishes outstanding requests, stops helper threads, frees the
  duplicated communicators. ``with Communicator(...) as comm:`` calls it on a normal exit
  (on an exception it only stops the threads: the other ranks may not be there to free).
- Before a Communicator exists (reading the configuration, choosing the backend), use
  ``ssdmpi/comm/world.py``.

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
sum divided). A nonblocking mean under ``test``/``poll`` is MPI's
``Iallreduce`` and then a division pass in ``wait``. Callers that can fold ``1/size`` into their
own update should use ``average=False`` (the trainer's algorithms do): then there is no division
at all.

GPU buffers: see ``ssdmpi/comm/transport.py``. ``allreduce_start`` never waits for the GPU: it
orders the staging after the kernel that wrote ``buf`` with events, and the request is posted
once the staging is ready (by the communication thread, or by ``progress``/``test``/``wait``
with ``--progress test``); ``wait`` queues the copy back before the caller's next kernels.
``host`` stages through pinned memory. Progress strategies
and their measured defaults: ``ssdmpi/comm/progress.py``. Stall watchdog:
``ssdmpi/comm/watchdog.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time

from ssdmpi.comm import fused_mean
from ssdmpi.comm.agreement import first_error, signature_mismatch
from ssdmpi.comm.progress import PROGRESS, CommThread, Poller, default_progress
from ssdmpi.comm.stats import CommStats
from ssdmpi.comm.transport import Transport
from ssdmpi.comm.trees import recv_tree, send_tree
from ssdmpi.errors import UserError

_clock = time.perf_counter
TREE_TAG = 7301   # point-to-point tag of state trees on the control communicator


def format_bytes(n: int) -> str:
    """``3.4 MB``-style size for messages."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class AllreduceHandle:
    """An in-place allreduce in flight on ``buf``; see the module contract.

    ``str(handle)`` names it as the stall watchdog does, e.g. ``Iallreduce #12 of 3.4 MB``
    (built only when needed: formatting on every call would cost more than the bookkeeping).
    """

    __slots__ = ("buf", "seq", "nbytes", "_owner", "_work", "_buckets", "_divisor", "_divided",
                 "_requests", "_event", "_error", "_t_posted", "_t_returned", "_t_complete", "_final",
                 "_staged", "_unposted")

    def __init__(self, owner, buf, work, buckets, divisor, seq):
        self.buf, self.seq, self.nbytes = buf, seq, buf.nbytes
        self._owner, self._work, self._buckets = owner, work, buckets
        self._divisor, self._divided = divisor, False
        self._requests = self._event = self._error = None
        self._t_posted = self._t_returned = 0.0
        self._t_complete = None
        self._final = False

    def __str__(self) -> str:
        text = f"Iallreduce #{self.seq} of {format_bytes(self.nbytes)}"
        return text + (f" ({len(self._buckets)} buckets)" if len(self._buckets) > 1 else "")

    @property
    def what(self) -> str:
        """The operation's name in messages."""
        return str(self)

    def test(self) -> bool:
        """True when the reduction has completed (does not finalise the result; call ``wait``)."""
        return self._final or self._t_complete is not None or self._owner._test(self)

    def wait(self):
        """Block until complete; return ``buf`` with the sum (or mean) over ranks."""
        if not self._final:
            self._owner._finish(self)
        return self.buf


class P2PHandle:
    """A nonblocking send or receive of ``buf`` in flight; see the module contract."""

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
            self._owner._finish_p2p(self)
        return self.buf


class ScalarsHandle:
    """A nonblocking ``allreduce_scalars`` (``Communicator.allreduce_scalars_start``)."""

    def __init__(self, wait, keys, data):
        self._wait, self._keys, self._data, self._result = wait, keys, data, None

    def wait(self) -> dict:
        """Block until the reduction completed; ``{name: value}`` as ``allreduce_scalars`` returns."""
        if self._result is None:
            self._wait()
            self._result = {k: float(v) for k, v in zip(self._keys, self._data)}
        return self._result


class Communicator:
    """Gradient/weight traffic and control traffic on separate private duplicates.

    Args (see the module contract): ``progress``: ``auto|test|poll|thread|blocking``;
    ``transport``: ``auto|cuda-aware|host`` (device buffers only); ``bucket_bytes``: None
    for one fused request, else the size of each fixed slice; ``stall_timeout``: seconds,
    None or 0 disables the watchdog; ``streams``: where the transport's streams and events
    come from (default ``ssdmpi.backend``; tests pass fakes, see ``Transport``).
    """

    def __init__(self, comm=None, progress: str = "auto", transport: str = "auto", bucket_bytes=None,
                 stall_timeout: float | None = 300.0, streams=None):
        from mpi4py import MPI

        from ssdmpi import backend
        from ssdmpi.comm.watchdog import StallWatchdog

        if progress not in PROGRESS:
            raise UserError(f"unknown progress strategy {progress!r}; choose one of {', '.join(PROGRESS)}")
        strategy = default_progress(backend.device()) if progress == "auto" else progress
        if strategy in ("thread", "poll") and MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise UserError(f"--progress {strategy} needs MPI_THREAD_MULTIPLE, which this MPI library did not grant; "
                            "use --progress test or blocking")
        if bucket_bytes is not None and int(bucket_bytes) <= 0:
            raise UserError(f"bucket size must be a positive number of bytes, got {bucket_bytes!r}")
        self.transport = Transport(transport, streams)   # validates before any collective call
        self._MPI = MPI
        base = comm if comm is not None else MPI.COMM_WORLD
        self._comm = base.Dup()
        self._ctl = base.Dup()
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self.strategy = strategy
        self._requests_progress = strategy in ("test", "poll")   # nonblocking requests the caller drives
        self.bucket_bytes = None if bucket_bytes is None else int(bucket_bytes)
        self.stall_timeout = stall_timeout
        self.stats = CommStats()
        self._fused_mean = fused_mean.FusedMean(self._comm)   # collective: splits a copy of _comm
        # Always duplicated, watchdog or not: a rank with a different --stall-timeout must not
        # leave the others waiting in a collective Dup (check_agreement reports the difference).
        watch_comm = base.Dup()
        self._watchdog = self._spare = None
        if stall_timeout and stall_timeout > 0:
            self._watchdog = StallWatchdog(watch_comm, stall_timeout)
        else:
            self._spare = watch_comm
        self._thread = CommThread() if strategy == "thread" else None
        self._pending: list = []     # handles not yet finalised, in posting order
        # ``poll``: the poller thread's status checks and this thread's request calls take turns.
        self._lock = threading.Lock() if strategy == "poll" else contextlib.nullcontext()
        self._poller = Poller(self._lock, self._pending) if strategy == "poll" else None
        self._seq = 0
        self._p2p_seq = 0            # point-to-point operations posted (named, not collective)
        atexit.register(self._stop_threads)

    # -- gradient traffic --------------------------------------------------------------
    def allreduce_start(self, buf, average: bool = True) -> AllreduceHandle:
        """Start an in-place allreduce (sum, or mean when ``average``); see the module contract."""
        return self._post(buf, average, self.strategy)

    def allreduce(self, buf, average: bool = True):
        """Blocking, in place: ``buf <- sum`` (or mean) over ranks; returns ``buf``."""
        self._drain()
        return self._post(buf, average, "blocking").wait()

    def allreduce_mean(self, buf):
        """Blocking, in place: ``buf <- mean over ranks``; returns ``buf``."""
        return self.allreduce(buf, average=True)

    def broadcast(self, buf, root: int = 0):
        """Blocking, in place: every rank gets ``root``'s ``buf``; returns ``buf``."""
        self._drain()
        seq = self._next_seq()
        work = self.transport.to_mpi(buf)
        self._watched(f"Bcast #{seq} of {format_bytes(buf.nbytes)} from rank {root}", seq,
                      self._comm.Bcast, work, root=root)
        self.transport.from_mpi(buf, work)
        return buf

    def progress(self) -> None:
        """Move outstanding requests along (``test`` and ``poll``; a no-op otherwise). Cheap."""
        if self._requests_progress and self._pending:
            start = _clock()
            for handle in self._pending:
                if not handle.test():
                    break   # one MPI_Test drives the whole progress engine
            # Data moves inside these calls, on the caller's time: count it as exposed.
            self.stats.add_exposed(_clock() - start)

    # -- point-to-point traffic (not collective; see the module contract) ------------------
    def send_start(self, buf, dest: int, tag: int) -> P2PHandle:
        """Start sending ``buf`` to rank ``dest`` with ``tag``; do not write ``buf`` until ``wait()``."""
        return self._post_p2p(buf, dest, tag, recv=False)

    def recv_start(self, buf, source: int | None, tag: int) -> P2PHandle:
        """Start receiving into ``buf`` from ``source`` (None: any rank) with ``tag``; do not touch
        ``buf`` until ``wait()``, which sets the handle's ``source``."""
        return self._post_p2p(buf, source, tag, recv=True)

    def wait_all(self, handles) -> None:
        """``wait()`` for every handle, in order."""
        for handle in handles:
            handle.wait()

    def _post_p2p(self, buf, peer, tag: int, recv: bool) -> P2PHandle:
        t_posted = _clock()
        self._p2p_seq += 1
        work = self.transport.to_mpi(buf)
        if recv:
            source = self._MPI.ANY_SOURCE if peer is None else peer
            request = self._comm.Irecv(work, source=source, tag=tag)
            where = "from any rank" if peer is None else f"from rank {peer}"
        else:
            request = self._comm.Isend(work, dest=peer, tag=tag)
            where = f"to rank {peer}"
        what = (f"{'Irecv' if recv else 'Isend'} #{self._seq}.{self._p2p_seq} {where} "
                f"(tag {tag}, {format_bytes(buf.nbytes)})")
        return P2PHandle(self, buf, work, request, what, self._seq, recv, t_posted)

    def _finish_p2p(self, handle) -> None:
        t_wait = _clock()
        status = self._MPI.Status()
        self._watched(handle, handle.seq, handle._request.Wait, status)
        handle._final = True
        if handle._is_recv:
            handle.source = status.Get_source()
            self.transport.from_mpi(handle.buf, handle._work)
        t_end = _clock()
        self.stats.record(0 if handle._is_recv else handle.nbytes, t_end - handle._t_posted, t_end - t_wait, 0.0)

    # -- control traffic: blocking and collective, on the control duplicate -------------
    # Pickled (lowercase) mpi4py calls are fine here: mpi4py 4.x releases the GIL inside MPI for them
    # (msgpickle.pxi: ``with nogil: MPI_Allgatherv_c(...)``), see test_control_calls_in_flight_do_not_freeze...
    def barrier(self) -> None:
        """Collective: return once every rank has called it."""
        self._control("Barrier #{seq}", self._ctl.Barrier)

    def broadcast_object(self, obj, root: int = 0):
        """Collective: every rank gets ``root``'s ``obj`` (pickled; small objects: settings, errors)."""
        return self._control(f"bcast #{{seq}} (object from rank {root})", self._ctl.bcast, obj, root=root)

    def check_agreement(self, signature: dict) -> None:
        """Collective: every rank must pass an equal ``signature`` dict (flat-buffer length,
        dtype, algorithm settings, ...). On a mismatch every rank raises the same collective
        ``UserError`` naming the ranks that differ from rank 0 and the differing keys."""
        signatures = self._control("allgather #{seq} (setup signature check)", self._ctl.allgather, dict(signature))
        message = signature_mismatch(signatures)
        if message:
            raise UserError(message, collective=True)

    def agree_error(self, exc: BaseException | None = None) -> None:
        """Collective: pass the exception this rank hit during setup (or None). If any rank hit
        one, every rank raises the same collective ``UserError`` naming the lowest failing rank."""
        mine = None
        if exc is not None:
            text = str(exc).strip()
            mine = text.splitlines()[0] if text else type(exc).__name__
        message = first_error(self._control("allgather #{seq} (setup error agreement)", self._ctl.allgather, mine))
        if message is not None:
            raise UserError(message, collective=True) from exc

    def agree(self, fn):
        """Collective: run ``fn()`` on every rank and return its result; if it raised a
        ``UserError`` on any rank, every rank raises the same collective one (``agree_error``)."""
        result, exc = None, None
        try:
            result = fn()
        except UserError as e:
            exc = e
        self.agree_error(exc)
        return result

    def any_true(self, flag: bool) -> bool:
        """Collective: True on every rank when ``flag`` is true on any rank (e.g. a signal arrived)."""
        import numpy as np

        data = np.array([1 if flag else 0], dtype=np.int32)
        self._control("Allreduce #{seq} (any_true)", self._ctl.Allreduce, self._MPI.IN_PLACE, data,
                      op=self._MPI.MAX)
        return bool(data[0])

    def allreduce_scalars(self, values: dict, op: str = "sum") -> dict:
        """Collective: ``{name: op over ranks of values[name]}`` in float64, same on every rank.
        Every rank must pass the same keys. ``op``: ``sum``, ``max`` or ``min``."""
        import numpy as np

        ops = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}
        if op not in ops:
            raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
        keys = sorted(values)
        data = np.array([float(values[k]) for k in keys], dtype=np.float64)
        self._control("Allreduce #{seq} (scalars)", self._ctl.Allreduce, self._MPI.IN_PLACE, data, op=ops[op])
        return {k: float(v) for k, v in zip(keys, data)}

    def allreduce_scalars_start(self, values: dict, op: str = "sum") -> ScalarsHandle:
        """Nonblocking ``allreduce_scalars``: ``wait()`` returns its dict. Collective as the
        blocking control calls are (every rank starts the same sequence of control operations);
        MPI moves it inside any MPI call of this process, so a rank busy with its own traffic
        completes it without waiting for the others until ``wait()``."""
        import numpy as np

        ops = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}
        if op not in ops:
            raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
        keys = sorted(values)
        data = np.array([float(values[k]) for k in keys], dtype=np.float64)
        seq = self._next_seq()
        request = self._ctl.Iallreduce(self._MPI.IN_PLACE, data, op=ops[op])
        return ScalarsHandle(lambda: self._watched(f"control Iallreduce #{seq} (scalars)", seq, request.Wait),
                             keys, data)

    def gather_trees(self, tree, root: int = 0):
        """Collective: every rank's state ``tree`` (nested dicts/lists of arrays and plain values;
        see ``ssdmpi/comm/trees.py``) on ``root``.

        On ``root``: an iterator of ``(rank, tree)`` in rank order (``root``'s own ``tree`` as
        is, the others as NumPy arrays); each tree is received only when the iterator reaches
        it, so ``root`` holds its own and one other rank's tree at a time. The caller must
        exhaust the iterator (even after an error of its own), or the senders block forever.
        Elsewhere: sends ``tree`` to ``root`` (blocking until received) and returns None.
        """
        seq = self._next_seq()
        if self.rank != root:
            self._watched(f"control send #{seq} (state tree to rank {root})", seq,
                          send_tree, self._ctl, tree, root, TREE_TAG)
            return None
        return self._received_trees(tree, root, seq)

    def _received_trees(self, mine, root: int, seq: int):
        for r in range(self.size):
            if r == root:
                yield r, mine
            else:
                yield r, self._watched(f"control recv #{seq} (state tree from rank {r})", seq,
                                       recv_tree, self._ctl, r, TREE_TAG)

    def scatter_trees(self, tree_of=None, root: int = 0):
        """Collective: every rank gets its own state tree from ``root``; returns it.

        On ``root``, ``tree_of(rank)`` makes rank ``rank``'s tree (e.g. reads it from a file):
        it is called for the other ranks in rank order, each tree sent before the next is
        made, and last for ``root`` itself, so ``root`` holds one rank's tree at a time.
        ``tree_of`` is not used elsewhere. Arrays arrive as NumPy arrays.
        """
        seq = self._next_seq()
        if self.rank != root:
            return self._watched(f"control recv #{seq} (state tree from rank {root})", seq,
                                 recv_tree, self._ctl, root, TREE_TAG)
        for r in range(self.size):
            if r != root:
                self._watched(f"control send #{seq} (state tree to rank {r})", seq,
                              send_tree, self._ctl, tree_of(r), r, TREE_TAG)
        return tree_of(root)

    def settings(self) -> dict:
        """The resolved settings, for logs and for ``check_agreement`` signatures."""
        return {"progress": self.strategy, "transport": self.transport.name, "bucket_bytes": self.bucket_bytes,
                "stall_timeout": self.stall_timeout, "ranks": self.size}

    # -- lifetime -------------------------------------------------------------------------
    def free(self) -> None:
        """Collective: finish outstanding requests, stop helper threads, free the communicators."""
        self._drain()
        self._stop_threads()
        atexit.unregister(self._stop_threads)
        self._fused_mean.free()
        for c in (self._comm, self._ctl, self._spare):
            if c is not None and c != self._MPI.COMM_NULL:
                c.Free()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """``free()`` on a normal exit. On an exception only the helper threads stop (a local
        act): ``free()`` is collective and the other ranks may not be there to join it."""
        if exc_type is None:
            self.free()
        else:
            self._stop_threads()

    def _stop_threads(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._poller is not None:
            self._poller.stop()
            self._poller = None
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    # -- machinery --------------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        if self._watchdog is not None:
            self._watchdog.posted(self._seq)
        return self._seq

    def _watched(self, what, seq: int, fn, *args, **kwargs):
        """Call ``fn`` while the stall watchdog watches it as operation ``str(what)``."""
        if self._watchdog is None:
            return fn(*args, **kwargs)
        self._watchdog.begin(what, seq)
        try:
            return fn(*args, **kwargs)
        finally:
            self._watchdog.end()

    def _control(self, what: str, fn, *args, **kwargs):
        seq = self._next_seq()
        return self._watched("control " + what.format(seq=seq), seq, fn, *args, **kwargs)

    def _buckets(self, work) -> list:
        flat = work if work.ndim == 1 else work.reshape(-1)
        if not self.bucket_bytes or self.bucket_bytes >= flat.nbytes:
            return [flat]
        step = max(1, self.bucket_bytes // flat.itemsize)
        return [flat[i:i + step] for i in range(0, flat.size, step)]

    def _post(self, buf, average: bool, strategy: str) -> AllreduceHandle:
        t_posted = _clock()
        if average and buf.dtype.kind not in "fc":
            raise TypeError(f"cannot average a {buf.dtype} buffer in place; pass average=False for a sum")
        for other in self._pending:
            if other.buf is buf:
                raise ValueError(f"this buffer is already in flight in {other}; wait() for it before reusing it")
        seq = self._next_seq()
        staged = self.transport.stage(buf)      # returns at once; MPI may start once staged.ready()
        work = staged.work
        buckets = self._buckets(work)
        divisor = self.size if average and self.size > 1 else None
        handle = AllreduceHandle(self, buf, work, buckets, divisor, seq)
        handle._t_posted = t_posted
        handle._staged, handle._unposted = staged, strategy in ("test", "poll")   # this call's strategy
        # Dividing on the host right after each bucket is reduced keeps the data in cache; device
        # buffers are divided on the device in ``wait`` (on the caller's stream).
        divide_here = divisor is not None and not self.transport.is_device(buf)
        if strategy == "blocking":
            self._watched(handle, seq, self._reduce_buckets, handle, divide_here)
            handle._t_complete = _clock()
        elif strategy == "thread":
            handle._event = threading.Event()
            self._thread.submit(lambda: self._thread_job(handle, divide_here))
        with self._lock:
            self._pending.append(handle)
        if handle._unposted:
            self._post_staged(handle, wait=False)   # now if the staging is ready, else from test()
        handle._t_returned = _clock()
        return handle

    def _reduce_buckets(self, handle, divide_here: bool) -> None:
        op, in_place, allreduce = self._MPI.SUM, self._MPI.IN_PLACE, self._comm.Allreduce
        handle._staged.wait_ready()        # this thread waits for the staging copy; the GPU runs on
        for b in handle._buckets:
            if divide_here and b.nbytes >= fused_mean.MIN_BYTES:
                self._fused_mean(b)        # the division inside the reduction, in cache
                continue
            allreduce(in_place, b, op=op)
            if divide_here:
                fused_mean.divide(b, handle._divisor)
        handle._divided = divide_here

    def _thread_job(self, handle, divide_here: bool) -> None:
        """Runs on the communication thread (blocking MPI calls release the GIL)."""
        try:
            self._reduce_buckets(handle, divide_here)
            handle._t_complete = _clock()
        except BaseException as exc:   # reported by ``wait`` on the caller's thread
            handle._error = exc
        finally:
            handle._event.set()

    def _post_staged(self, upto, wait: bool) -> bool:
        """``--progress test|poll``: post the requests whose staging is ready, in posting order (every
        rank posts the same sequence), up to ``upto``; ``wait``: wait for each staging first.
        True when ``upto`` is posted."""
        op, in_place = self._MPI.SUM, self._MPI.IN_PLACE
        for h in self._pending:
            if h._unposted:
                if not h._staged.ready():
                    if not wait:
                        return False
                    h._staged.wait_ready()
                with self._lock:
                    h._requests = [self._comm.Iallreduce(in_place, b, op=op) for b in h._buckets]
                h._unposted = False
                if self._poller is not None:
                    self._poller.kick()
            if h is upto:
                break
        return True

    def _test(self, handle) -> bool:
        if handle._unposted and not self._post_staged(handle, wait=False):
            return False
        if handle._requests is not None:
            with self._lock:
                done = self._MPI.Request.Testall(handle._requests)
            if not done:
                return False
            handle._t_complete = _clock()
            return True
        if handle._event is not None:
            return handle._event.is_set()
        return True

    def _finish(self, handle) -> None:
        """``wait()``: complete the request, copy back, divide, record timings."""
        t_wait = _clock()
        if handle._unposted:
            self._post_staged(handle, wait=True)
        if handle._t_complete is None or handle._event is not None:
            if handle._requests is not None:
                with self._lock:
                    self._watched(handle, handle.seq, self._MPI.Request.Waitall, handle._requests)
                handle._t_complete = _clock()
            elif handle._event is not None and not handle._event.is_set():
                self._watched(handle, handle.seq, handle._event.wait)
        with self._lock:
            self._pending.remove(handle)
        handle._final = True
        if handle._error is not None:
            raise RuntimeError(f"{handle.what} failed on the communication thread: {handle._error}") \
                from handle._error
        self.transport.from_mpi(handle.buf, handle._work)
        if handle._divisor is not None and not handle._divided:
            fused_mean.divide(handle.buf, handle._divisor)
        t_end = _clock()
        exposed = (handle._t_returned - handle._t_posted) + (t_end - t_wait)
        self.stats.record(handle.nbytes, handle._t_complete - handle._t_posted, exposed,
                          t_wait - handle._t_returned)

    def _drain(self) -> None:
        for handle in list(self._pending):
            handle.wait()
