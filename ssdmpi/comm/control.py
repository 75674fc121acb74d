"""Control collectives: small blocking calls on their own duplicate, so that they never interleave
with a gradient request in flight.

Every call is collective (every rank makes it, in the same order) and blocking:
``barrier()``, ``broadcast_object(obj, root)``, ``check_agreement(signature)``,
``agree_error(exc)``, ``agree(fn)``, ``any_true(flag)``, ``allreduce_scalars(values, op)`` (also
started without blocking: ``allreduce_scalars_start``, whose handle's ``wait()`` returns the dict), and
the state-tree transport of checkpoints: ``gather_trees(tree, root)`` / ``scatter_trees(tree_of,
root)`` (one rank's tree at a time on the root; ``ssdmpi/comm/trees.py``). Each is numbered and
watched by the stall watchdog in the same sequence as the gradient operations.

Pickled (lowercase) mpi4py calls are fine here: mpi4py 4.x releases the GIL inside MPI for them
(msgpickle.pxi: ``with nogil: MPI_Allgatherv_c(...)``), so the communication thread and the
watchdog keep running (``tests/mpi/test_comm.py::test_control_calls_in_flight_do_not_freeze...``).
"""

from __future__ import annotations

import numpy as np

from ssdmpi.comm.agreement import first_error, signature_mismatch
from ssdmpi.comm.mpi_env import load_mpi
from ssdmpi.comm.trees import recv_tree, send_tree
from ssdmpi.errors import UserError

TREE_TAG = 7301   # point-to-point tag of state trees on the control communicator


class ScalarsHandle:
    """A nonblocking ``allreduce_scalars`` (``ControlChannel.allreduce_scalars_start``)."""

    def __init__(self, wait, keys, data):
        self._wait, self._keys, self._data, self._result = wait, keys, data, None

    def wait(self) -> dict:
        """Block until the reduction completed; ``{name: value}`` as ``allreduce_scalars`` returns."""
        if self._result is None:
            self._wait()
            self._result = {k: float(v) for k, v in zip(self._keys, self._data)}
        return self._result


class ControlChannel:
    """The control calls on ``comm`` (a private duplicate carrying nothing else; the caller frees
    it), numbered and watched through ``ops`` (the ``Operations`` shared with the other channels)."""

    def __init__(self, comm, ops):
        self._MPI = load_mpi()
        self._ctl, self.ops = comm, ops
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def barrier(self) -> None:
        """Return once every rank has called it."""
        self._control("Barrier #{seq}", self._ctl.Barrier)

    def broadcast_object(self, obj, root: int = 0):
        """Every rank gets ``root``'s ``obj`` (pickled; small objects: settings, errors)."""
        return self._control(f"bcast #{{seq}} (object from rank {root})", self._ctl.bcast, obj, root=root)

    def check_agreement(self, signature: dict) -> None:
        """Every rank must pass an equal ``signature`` dict (flat-buffer length, dtype, algorithm
        settings, ...). On a mismatch every rank raises the same collective ``UserError`` naming
        the ranks that differ from rank 0 and the differing keys."""
        signatures = self._control("allgather #{seq} (setup signature check)", self._ctl.allgather, dict(signature))
        message = signature_mismatch(signatures)
        if message:
            raise UserError(message, collective=True)

    def agree_error(self, exc: BaseException | None = None) -> None:
        """Pass the exception this rank hit during setup (or None). If any rank hit one, every
        rank raises the same collective ``UserError`` naming the lowest failing rank."""
        mine = None
        if exc is not None:
            text = str(exc).strip()
            mine = text.splitlines()[0] if text else type(exc).__name__
        message = first_error(self._control("allgather #{seq} (setup error agreement)", self._ctl.allgather, mine))
        if message is not None:
            raise UserError(message, collective=True) from exc

    def agree(self, fn):
        """Run ``fn()`` on every rank and return its result; if it raised a ``UserError`` on any
        rank, every rank raises the same collective one (``agree_error``)."""
        result, exc = None, None
        try:
            result = fn()
        except UserError as e:
            exc = e
        self.agree_error(exc)
        return result

    def any_true(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any rank (e.g. a signal arrived)."""
        data = np.array([1 if flag else 0], dtype=np.int32)
        self._control("Allreduce #{seq} (any_true)", self._ctl.Allreduce, self._MPI.IN_PLACE, data,
                      op=self._MPI.MAX)
        return bool(data[0])

    def allreduce_scalars(self, values: dict, op: str = "sum") -> dict:
        """``{name: op over ranks of values[name]}`` in float64, the same on every rank. Every rank
        must pass the same keys. ``op``: ``sum``, ``max`` or ``min``."""
        ops = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}
        if op not in ops:
            raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
        keys = sorted(values)
        data = np.array([float(values[k]) for k in keys], dtype=np.float64)
        self._control("Allreduce #{seq} (scalars)", self._ctl.Allreduce, self._MPI.IN_PLACE, data, op=ops[op])
        return {k: float(v) for k, v in zip(keys, data)}

    def allreduce_scalars_start(self, values: dict, op: str = "sum") -> ScalarsHandle:
        """Nonblocking ``allreduce_scalars``: its handle's ``wait()`` returns the dict (watched by
        the stall watchdog). Collective in the same order as the blocking calls; MPI moves it
        inside any MPI call of this process, so a rank busy with its own traffic completes it
        without waiting for the others until ``wait()``."""
        ops = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}
        if op not in ops:
            raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
        keys = sorted(values)
        data = np.array([float(values[k]) for k in keys], dtype=np.float64)
        seq = self.ops.next_seq()
        request = self._ctl.Iallreduce(self._MPI.IN_PLACE, data, op=ops[op])
        return ScalarsHandle(lambda: self.ops.watched(f"control Iallreduce #{seq} (scalars)", seq, request.Wait),
                             keys, data)

    def gather_trees(self, tree, root: int = 0):
        """Every rank's state ``tree`` (nested dicts/lists of arrays and plain values; see
        ``ssdmpi/comm/trees.py``) on ``root``.

        On ``root``: an iterator of ``(rank, tree)`` in rank order (``root``'s own ``tree`` as
        is, the others as NumPy arrays); each tree is received only when the iterator reaches
        it, so ``root`` holds its own and one other rank's tree at a time. The caller must
        exhaust the iterator (even after an error of its own), or the senders block forever.
        Elsewhere: sends ``tree`` to ``root`` (blocking until received) and returns None.
        """
        seq = self.ops.next_seq()
        if self.rank != root:
            self.ops.watched(f"control send #{seq} (state tree to rank {root})", seq,
                             send_tree, self._ctl, tree, root, TREE_TAG)
            return None
        return self._received_trees(tree, root, seq)

    def _received_trees(self, mine, root: int, seq: int):
        for r in range(self.size):
            if r == root:
                yield r, mine
            else:
                yield r, self.ops.watched(f"control recv #{seq} (state tree from rank {r})", seq,
                                          recv_tree, self._ctl, r, TREE_TAG)

    def scatter_trees(self, tree_of=None, root: int = 0):
        """Every rank gets its own state tree from ``root``; returns it.

        On ``root``, ``tree_of(rank)`` makes rank ``rank``'s tree (e.g. reads it from a file):
        it is called for the other ranks in rank order, each tree sent before the next is
        made, and last for ``root`` itself, so ``root`` holds one rank's tree at a time.
        ``tree_of`` is not used elsewhere. Arrays arrive as NumPy arrays.
        """
        seq = self.ops.next_seq()
        if self.rank != root:
            return self.ops.watched(f"control recv #{seq} (state tree from rank {root})", seq,
                                    recv_tree, self._ctl, root, TREE_TAG)
        for r in range(self.size):
            if r != root:
                self.ops.watched(f"control send #{seq} (state tree to rank {r})", seq,
                                 send_tree, self._ctl, tree_of(r), r, TREE_TAG)
        return tree_of(root)

    def _control(self, what: str, fn, *args, **kwargs):
        seq = self.ops.next_seq()
        return self.ops.watched("control " + what.format(seq=seq), seq, fn, *args, **kwargs)
