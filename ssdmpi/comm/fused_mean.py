"""The blocking mean allreduce of a host buffer, with the division by ``N`` done in cache.

An MPI allreduce followed by ``buf /= N`` reads and writes the whole result once more: on
shared memory that pass cost 15-35% of a 1-16 MB allreduce (CHANGELOG.md, 2026-12-02, "The fused mean"). Here the
reduction is written with point-to-point buffer calls so that the last addition of every
element and its division happen on the same cache-resident piece:

1. **Reduce-scatter.** ``N`` a power of two: recursive halving, partner ``rank ^ mask`` for
   ``mask = 1, 2, 4, ...`` (the rank whose ``mask`` bit is clear keeps the lower half), so every
   element is summed as the pairwise tree ``((x0 + x1) + (x2 + x3)) + ...``, the order of the
   reference simulator (``ssdmpi/verify/reference.py``). Any other ``N``: a ring (step ``s``: send
   block ``rank - s`` to ``rank + 1``, receive block ``rank - s - 1`` from ``rank - 1``), after which
   ``rank`` owns block ``rank + 1``. Each exchange is one ``Sendrecv`` per piece of at most
   ``PIECE_BYTES``, received into a small scratch buffer and added into place while both are in
   cache; the last step divides each piece right after adding it.
2. **Allgather.** One in-place ``Allgather`` over a copy of the communicator whose rank order is
   the order of the owned blocks copies every owner's finished block to every rank (MPICH's
   ``Allgatherv`` measured 2.4x slower than its ``Allgather`` here, so the blocks are equal: the
   last ``length % N`` elements go through ``MPI_Allreduce`` and a division).

Every element is reduced and divided once, by its owner, then copied: every rank gets the same
bytes. At ``N <= 2`` they are the bytes of MPI's sum divided afterwards (``a + b`` is
commutative). Below ``MIN_BYTES`` the few extra calls cost more than the pass they save, and
the Communicator uses MPI's allreduce and a division instead. Measured: BENCHMARKS.md,
"Communicator vs raw mpi4py, and overlap per progress strategy".
"""

from __future__ import annotations

from ssdmpi.comm.mpi_env import load_mpi

PIECE_BYTES = 1 << 20     # one exchanged piece: fits in L2 with the piece it is added into
MIN_BYTES = 1 << 18       # smaller buffers: MPI_Allreduce + one division pass
TAG = 7303                # point-to-point tag on the gradient communicator (asgd uses 7401-7402)


def divide(buf, n: int) -> None:
    """``buf /= n`` in place. For a power of two this is a multiplication by ``1/n``, which is
    exact and rounds like the division in every case (both are the correctly rounded
    ``x * 2**-k``), and several times cheaper than a division."""
    if is_power_of_two(n):
        buf *= 1.0 / n
    else:
        buf /= n


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def bit_reversed(rank: int, size: int) -> int:
    """``rank``'s bits in reverse order over ``log2(size)`` bits (``size`` a power of two)."""
    out, bit = 0, 1
    while bit < size:
        out = (out << 1) | (1 if rank & bit else 0)
        bit <<= 1
    return out


def owned_block(rank: int, size: int) -> int:
    """The block (of ``size`` equal blocks) that ``rank`` holds fully reduced after the reduce-scatter."""
    return bit_reversed(rank, size) if is_power_of_two(size) else (rank + 1) % size


def reduce_scatter_steps(rank: int, size: int, length: int) -> list:
    """The exchanges of the reduce-scatter of ``[0, length)`` (``length`` a multiple of ``size``).

    Each step ``(send_to, send, recv_from, add_into)``: send range ``send`` to ``send_to``, receive
    ``recv_from``'s copy of range ``add_into`` and add it there. Ranges are ``(lo, hi)`` of equal
    length within a step. After the last step ``rank`` holds block ``owned_block(rank, size)``.
    """
    steps = []
    if is_power_of_two(size):
        lo, hi, mask = 0, length, 1
        while mask < size:
            mid, peer = (lo + hi) // 2, rank ^ mask
            if rank & mask:                      # keep the upper half
                steps.append((peer, (lo, mid), peer, (mid, hi)))
                lo = mid
            else:
                steps.append((peer, (mid, hi), peer, (lo, mid)))
                hi = mid
            mask <<= 1
        return steps
    q = length // size
    block = [(i * q, (i + 1) * q) for i in range(size)]
    right, left = (rank + 1) % size, (rank - 1) % size
    return [(right, block[(rank - s) % size], left, block[(rank - s - 1) % size]) for s in range(size - 1)]


class FusedMean:
    """The mean allreduce of host buffers over one mpi4py communicator (see the module docstring).

    Construction is collective (it splits ``comm`` into a copy whose rank order is the order of
    the owned blocks, so that one in-place ``Allgather`` places them); ``free()`` is collective.
    ``comm`` must carry no other traffic with ``TAG``.
    """

    def __init__(self, comm, piece_bytes: int = PIECE_BYTES):
        self.comm, self.piece_bytes = comm, int(piece_bytes)
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self._gather = comm.Split(0, owned_block(self.rank, self.size))
        self._scratch = None

    def __call__(self, buf) -> None:
        """Blocking, collective, in place: ``buf <- mean over ranks``. ``buf``: a 1-D C-contiguous
        float NumPy array of the same length on every rank. Every rank gets the same bytes."""
        MPI = load_mpi()
        size = self.size
        if size == 1:
            return
        length = buf.size - buf.size % size
        piece = max(1, self.piece_bytes // buf.itemsize)
        if self._scratch is None or self._scratch.dtype != buf.dtype or self._scratch.size < piece:
            import numpy as np

            self._scratch = np.empty(piece, dtype=buf.dtype)
        steps = reduce_scatter_steps(self.rank, size, length)
        for i, (dest, send, source, into) in enumerate(steps):
            last = i == len(steps) - 1
            for off in range(0, into[1] - into[0], piece):
                acc = buf[into[0] + off:min(into[0] + off + piece, into[1])]
                got = self._scratch[:acc.size]
                self.comm.Sendrecv(buf[send[0] + off:send[0] + off + acc.size], dest, TAG, got, source, TAG)
                acc += got
                if last:
                    divide(acc, size)
        if length:
            self._gather.Allgather(MPI.IN_PLACE, buf[:length])
        if length < buf.size:        # the last size - 1 elements at most
            tail = buf[length:]
            self.comm.Allreduce(MPI.IN_PLACE, tail, op=MPI.SUM)
            divide(tail, size)

    def free(self) -> None:
        self._gather.Free()
