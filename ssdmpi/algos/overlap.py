"""A gradient allreduce overlapped with the backward pass, in buckets, as PyTorch DDP does it.

Backward fills the flat gradient buffer from its end, one top-level layer at a time
(``Model.grads_ready``: after layer ``i``, ``grads[layer_offsets[i]:]`` is final). A
``BackwardAllreduce`` cuts the buffer at layer boundaries into buckets of at least
``bucket_bytes`` each, counted from the end (the last bucket, the first layers, may be
smaller; one layer larger than a bucket is a bucket of its own), and posts each bucket's
allreduce -- a sum, ``allreduce_start`` on a contiguous slice -- as soon as backward has
finished its layers. ``finish()`` posts what is left and returns the ``Pending`` requests;
``Pending.wait()`` completes them in posting order and returns the whole buffer. So the
allreduce of the last layers' gradients travels while the first layers' backward runs,
and the caller waits only before its update.

Every rank cuts the same buckets (they depend on the model and ``bucket_bytes`` only) and
posts them in the same order, as the Communicator requires. ``dest`` (``start(dest)``)
posts a copy instead of ``model.grads`` itself: each bucket is copied into the same slice
of ``dest`` just before it is posted (``--comm step``'s double buffer).

Bits: a sum-allreduce reduces each element over the ranks on its own, so a slice gives the
same bits as the whole buffer when the MPI library adds that element's ranks in the same
order for both message sizes. MPI does not promise that; MPICH (the ``mpich`` wheel) does at
1 to 4 ranks over shared memory and over TCP (its recursive-doubling and reduce-scatter
algorithms pair ranks alike), and ``tests/mpi/test_overlap.py`` checks the overlapped SSGD
against the blocking one bit for bit at 1, 2 and 4 ranks. Another library may differ in the
last bit at more than 2 ranks (at 2, ``a + b`` is one commutative addition).

Timing: the time spent in ``grads_ready`` (copies and posts) is kept in ``spent_s``, so
the trainer's step breakdown can leave it out of forward+backward (the posts' exposed time
is the Communicator's ``wait_s``; the copies are the update phase, as before).
"""

from __future__ import annotations

from ssdmpi.phases import clock

# PyTorch DDP's default bucket (bucket_cap_mb=25): the bucket size when --bucket-size is not given.
DEFAULT_BUCKET_BYTES = 25 * 2**20


def bucket_cuts(layer_offsets, size: int, itemsize: int, bucket_bytes: int) -> list:
    """The buckets ``[(lo, hi), ...]`` in posting order (from the buffer's end): each a run of whole
    top-level layers of at least ``bucket_bytes``, the last one whatever remains down to offset 0."""
    buckets, hi = [], size
    for lo in sorted(set(layer_offsets), reverse=True):
        if lo < hi and (hi - lo) * itemsize >= bucket_bytes:
            buckets.append((lo, hi))
            hi = lo
    if hi > 0:
        buckets.append((0, hi))
    return buckets


class Pending:
    """The allreduces of one buffer's buckets in flight; ``wait()`` completes them and returns the buffer."""

    __slots__ = ("buf", "handles")

    def __init__(self, buf, handles):
        self.buf, self.handles = buf, handles

    def wait(self):
        for handle in self.handles:
            handle.wait()
        return self.buf


class BackwardAllreduce:
    """Posts the bucketed sum-allreduce of ``model.grads`` during the backward pass (module docstring).

    Args:
        model: the ``Model`` whose backward produces the gradients.
        comm: the Communicator (``allreduce_start`` only).
        bucket_bytes: the least bytes per bucket (None: ``DEFAULT_BUCKET_BYTES``); a size at least
            the buffer's makes one bucket, posted after the whole backward: no overlap.
    Use: ``start(dest)`` before ``model.loss_and_grad``, ``finish()`` after it.
    """

    def __init__(self, model, comm, bucket_bytes: int | None = None):
        self.model, self.comm = model, comm
        self.bucket_bytes = int(bucket_bytes or DEFAULT_BUCKET_BYTES)
        grads = model.grads
        self.buckets = bucket_cuts(model.layer_offsets, grads.size, grads.itemsize, self.bucket_bytes)
        self.spent_s = 0.0          # seconds inside grads_ready (copies and posts)
        self._dest = self._handles = None
        self._next = 0              # the next bucket to post

    def start(self, dest=None) -> None:
        """Arm the model's ``grads_ready`` hook for one backward; ``dest``: post a copy there (None:
        ``model.grads`` in place). Not reentrant: ``finish()`` before the next ``start``."""
        self._dest = self.model.grads if dest is None else dest
        self._handles, self._next = [], 0
        self.model.grads_ready = self._ready

    def finish(self) -> Pending:
        """After the backward: post the buckets not posted yet, disarm the hook; the requests."""
        self.model.grads_ready = None
        self._ready(0)
        pending = Pending(self._dest, self._handles)
        self._dest = self._handles = None
        return pending

    def _ready(self, offset: int) -> None:
        """``grads[offset:]`` is final: post every bucket that lies inside it."""
        t0 = clock()
        grads, dest = self.model.grads, self._dest
        while self._next < len(self.buckets) and self.buckets[self._next][0] >= offset:
            lo, hi = self.buckets[self._next]
            part = dest if hi - lo == dest.size else dest[lo:hi]    # one bucket: the buffer itself
            if dest is not grads:
                part[...] = grads[lo:hi]
            self._handles.append(self.comm.allreduce_start(part, average=False))
            self._next += 1
        self.spent_s += clock() - t0
