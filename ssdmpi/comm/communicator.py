"""The Communicator: one object a run holds for all its MPI traffic, made of three channels.

Contract (the layers above code against it; nothing outside ``ssdmpi/comm/`` touches MPI):

- ``Communicator(comm=None, progress="auto", transport="auto", bucket_bytes=None,
  stall_timeout=STALL_TIMEOUT_S)`` duplicates ``comm`` (an mpi4py communicator, default COMM_WORLD)
  three times, privately: one carries gradient/weight traffic, one control traffic
  (metrics, agreement, checkpoints), so control traffic never interleaves with an
  outstanding request, and one is the stall watchdog's (``stall_timeout=None`` or 0
  disables it). Collective: every rank constructs it together, with the same settings.
  ``.rank``, ``.size``, ``.strategy`` (the resolved progress strategy; ``auto`` picks by
  ``backend.device()``, so select the backend first), ``.stats`` (a ``CommStats``; see
  ``ssdmpi/comm/stats.py`` for its keys), ``settings()`` (a dict).
- Its calls are those of its three channels, forwarded under the same names:

  - ``.grads`` (``ssdmpi/comm/gradients.py``, one class per progress strategy in
    ``ssdmpi/comm/progress/``): ``allreduce_start(buf, average, compressor=None) -> handle``,
    ``handle.wait()``, ``allreduce``, ``allreduce_mean``, ``broadcast``, ``progress()``, and
    ``compressor(dtype, like)`` for compressed sums (``ssdmpi/comm/compressed.py``);
  - ``.control`` (``ssdmpi/comm/control.py``): ``barrier``, ``broadcast_object``,
    ``check_agreement``, ``agree_error``, ``agree``, ``any_true``, ``allreduce_scalars`` (and
    ``allreduce_scalars_start``, nonblocking), ``gather_trees``, ``scatter_trees``;
  - ``.p2p`` (``ssdmpi/comm/p2p.py``, the ``asgd`` parameter server's): ``send_start``,
    ``recv_start``, ``wait_all``.

  One object with the calls forwarded keeps every caller (algorithms, the trainer, checkpoints)
  holding one thing, whose lifetime (``free``) covers all three; the channels are reachable for
  code that should see only one of them.
- Gradient and control operations are numbered in one sequence (``#seq``, the same on every
  rank) and watched by one stall watchdog: ``ssdmpi/comm/operations.py``, ``watchdog.py``.
- ``free()``: collective; finishes outstanding requests, stops helper threads, frees the
  duplicated communicators. ``with Communicator(...) as comm:`` calls it on a normal exit
  (on an exception it only stops the threads: the other ranks may not be there to free).
- Before a Communicator exists (reading the configuration, choosing the backend), use
  ``ssdmpi/comm/world.py``.
"""

from __future__ import annotations

import atexit

from ssdmpi import backend
from ssdmpi.comm import progress as progress_strategies
from ssdmpi.comm.control import ControlChannel
from ssdmpi.comm.mpi_env import load_mpi
from ssdmpi.comm.operations import Operations
from ssdmpi.comm.p2p import PointToPoint
from ssdmpi.comm.stats import CommStats
from ssdmpi.comm.transport import Transport
from ssdmpi.comm.watchdog import STALL_TIMEOUT_S, StallWatchdog
from ssdmpi.errors import UserError


class Communicator:
    """Gradient/weight traffic and control traffic on separate private duplicates.

    Args (see the module contract): ``progress``: ``auto|test|poll|thread|blocking``;
    ``transport``: ``auto|cuda-aware|host`` (device buffers only); ``bucket_bytes``: None
    for one fused request, else the size of each fixed slice; ``stall_timeout``: seconds,
    None or 0 disables the watchdog; ``streams``: where the transport's streams and events
    come from (default ``ssdmpi.backend``; tests pass fakes, see ``Transport``).
    """

    def __init__(self, comm=None, progress: str = "auto", transport: str = "auto", bucket_bytes=None,
                 stall_timeout: float | None = STALL_TIMEOUT_S, streams=None):
        MPI = self._MPI = load_mpi()
        strategy = progress_strategies.resolve(progress, backend.device())
        if bucket_bytes is not None and int(bucket_bytes) <= 0:
            raise UserError(f"bucket size must be a positive number of bytes, got {bucket_bytes!r}")
        self.transport = Transport(transport, streams)   # validates before any collective call
        base = comm if comm is not None else MPI.COMM_WORLD
        self._comms = [base.Dup(), base.Dup()]   # gradient traffic (and point-to-point), control traffic
        # Always duplicated, watchdog or not: a rank with a different --stall-timeout must not
        # leave the others waiting in a collective Dup (check_agreement reports the difference).
        watch_comm = base.Dup()
        if stall_timeout and stall_timeout > 0:
            self.ops = Operations(StallWatchdog(watch_comm, stall_timeout))   # it frees watch_comm
        else:
            self.ops = Operations()
            self._comms.append(watch_comm)
        grad_comm, ctl_comm = self._comms[:2]
        self.rank, self.size = grad_comm.Get_rank(), grad_comm.Get_size()
        self.strategy = strategy
        self.bucket_bytes = None if bucket_bytes is None else int(bucket_bytes)
        self.stall_timeout = stall_timeout
        self.stats = CommStats()
        self.grads = progress_strategies.create(strategy, grad_comm, self.transport, self.ops, self.stats,
                                                self.bucket_bytes)
        self.control = ControlChannel(ctl_comm, self.ops)
        self.p2p = PointToPoint(grad_comm, self.transport, self.ops, self.stats)
        atexit.register(self._stop_threads)

    # -- gradient traffic (``ssdmpi/comm/gradients.py``) ------------------------------------
    def allreduce_start(self, buf, average: bool = True, compressor=None):
        """Start an in-place allreduce (sum, or mean when ``average``) -> ``AllreduceHandle``; with a
        ``compressor`` (``compressor()``) the sum travels compressed."""
        return self.grads.allreduce_start(buf, average, compressor)

    def compressor(self, dtype: str, like):
        """A stream of compressed sums (``dtype``: ``ssdmpi/comm/compressed.py``'s ``DTYPES`` but float32)
        of float32 buffers shaped as ``like``, with its error feedback. Not collective."""
        return self.grads.compressor(dtype, like)

    def allreduce(self, buf, average: bool = True):
        """Blocking, in place: ``buf <- sum`` (or mean) over ranks; returns ``buf``."""
        return self.grads.allreduce(buf, average)

    def allreduce_mean(self, buf):
        """Blocking, in place: ``buf <- mean over ranks``; returns ``buf``."""
        return self.grads.allreduce_mean(buf)

    def broadcast(self, buf, root: int = 0):
        """Blocking, in place: every rank gets ``root``'s ``buf``; returns ``buf``."""
        return self.grads.broadcast(buf, root)

    @property
    def moved_by_caller(self) -> bool:
        """A request in flight moves only inside this thread's MPI calls (``--progress test``, ``poll``):
        whoever computes while one is in flight should call ``progress()`` every so often."""
        return self.grads.moved_by_caller

    def progress(self) -> None:
        """Move outstanding requests along (``test`` and ``poll``; a no-op otherwise). Cheap."""
        self.grads.progress()

    # -- point-to-point traffic (``ssdmpi/comm/p2p.py``; not collective) -------------------
    def send_start(self, buf, dest: int, tag: int):
        """Start sending ``buf`` to rank ``dest`` with ``tag`` -> ``P2PHandle``."""
        return self.p2p.send_start(buf, dest, tag)

    def recv_start(self, buf, source: int | None, tag: int):
        """Start receiving into ``buf`` from ``source`` (None: any rank) with ``tag`` -> ``P2PHandle``."""
        return self.p2p.recv_start(buf, source, tag)

    def wait_all(self, handles) -> None:
        """``wait()`` for every handle, in order."""
        self.p2p.wait_all(handles)

    # -- control traffic (``ssdmpi/comm/control.py``; blocking and collective) -------------
    def barrier(self) -> None:
        """Return once every rank has called it."""
        self.control.barrier()

    def broadcast_object(self, obj, root: int = 0):
        """Every rank gets ``root``'s ``obj`` (pickled; small objects)."""
        return self.control.broadcast_object(obj, root)

    def check_agreement(self, signature: dict) -> None:
        """Every rank must pass an equal ``signature``; else the same collective ``UserError`` on all."""
        self.control.check_agreement(signature)

    def agree_error(self, exc: BaseException | None = None) -> None:
        """If any rank passes an exception, every rank raises the same collective ``UserError``."""
        self.control.agree_error(exc)

    def agree(self, fn):
        """``fn()`` on every rank; a ``UserError`` on any rank is raised on all."""
        return self.control.agree(fn)

    def any_true(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any rank."""
        return self.control.any_true(flag)

    def allreduce_scalars(self, values: dict, op: str = "sum") -> dict:
        """``{name: op over ranks of values[name]}`` in float64 (``op``: sum, max or min)."""
        return self.control.allreduce_scalars(values, op)

    def allreduce_scalars_start(self, values: dict, op: str = "sum"):
        """``allreduce_scalars`` without waiting -> a handle whose ``wait()`` returns the dict."""
        return self.control.allreduce_scalars_start(values, op)

    def gather_trees(self, tree, root: int = 0):
        """Every rank's state ``tree`` on ``root``, one at a time (an iterator there; None elsewhere)."""
        return self.control.gather_trees(tree, root)

    def scatter_trees(self, tree_of=None, root: int = 0):
        """Every rank gets its own state tree, made by ``tree_of(rank)`` on ``root``."""
        return self.control.scatter_trees(tree_of, root)

    # -- settings and lifetime ----------------------------------------------------------------
    def settings(self) -> dict:
        """The resolved settings, for logs and for ``check_agreement`` signatures."""
        return {"progress": self.strategy, "transport": self.transport.name, "bucket_bytes": self.bucket_bytes,
                "stall_timeout": self.stall_timeout, "ranks": self.size}

    def free(self) -> None:
        """Collective: finish outstanding requests, stop helper threads, free the communicators."""
        self.grads.drain()
        self._stop_threads()
        atexit.unregister(self._stop_threads)
        self.grads.free()
        for c in self._comms:
            if c != self._MPI.COMM_NULL:
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
        self.grads.stop()
        self.ops.stop()
