"""The fused mean allreduce (ssdmpi/comm/fused_mean.py) at any rank count: the mean of NumPy
float64 sums, the same bytes on every rank, and the summation order it promises (pairwise:
``(x0 + x1)`` at 2 ranks, ``(x0 + x1) + (x2 + x3)`` at 4), for lengths that do and do not divide
by the rank count, shorter than it, and split into many pieces. Other rank counts (the ring):
tests/unit/test_fused_mean.py launches 3 and 6 ranks."""

import numpy as np
import pytest

from ssdmpi.comm import fused_mean
from ssdmpi.comm.communicator import Communicator
from tests.mpi.conftest import same_bytes_everywhere

LENGTHS = [1, 3, 4, 1000, 4099, (1 << 18) + 3]


def inputs(size: int, n: int, dtype) -> list:
    """Every rank's input (each rank rebuilds all of them from the seeds)."""
    return [np.random.default_rng(50 + r).standard_normal(n).astype(dtype) for r in range(size)]


def mean_of(xs: list):
    """The mean of the ranks' inputs, in float64 (the tolerance reference)."""
    return np.mean(np.array(xs, dtype=np.float64), axis=0)


class Recording:
    """A FusedMean that records the byte size of every buffer it reduces."""

    def __init__(self, inner):
        self.inner, self.sizes = inner, []

    def __call__(self, buf):
        self.sizes.append(buf.nbytes)
        self.inner(buf)

    def free(self):
        self.inner.free()


@pytest.fixture
def fused(comm):
    made = []

    def make(piece_bytes=fused_mean.PIECE_BYTES):
        made.append(fused_mean.FusedMean(comm, piece_bytes))
        return made[-1]

    yield make
    for f in made:
        f.free()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("piece_bytes", [16, fused_mean.PIECE_BYTES])
def test_mean_is_the_pairwise_sum_divided_with_the_same_bytes_everywhere(comm, fused, dtype, n, piece_bytes):
    size = comm.Get_size()
    xs = inputs(size, n, dtype)
    buf = xs[comm.Get_rank()].copy()
    fused(piece_bytes)(buf)
    np.testing.assert_allclose(buf, mean_of(xs), rtol=1e-5, atol=1e-6)
    assert same_bytes_everywhere(comm, buf)
    if fused_mean.is_power_of_two(size):
        total = xs
        while len(total) > 1:
            total = [total[i] + total[i + 1] for i in range(0, len(total), 2)]
        expected = total[0] * dtype(1.0 / size)
        length = n - n % size
        # The owned blocks follow the pairwise tree; the tail (n % size elements) is MPI's.
        np.testing.assert_array_equal(buf[:length], expected[:length])


def test_memory_around_the_buffer_is_untouched(comm, fused):
    size = comm.Get_size()
    big = np.full(5000 + 20, -3.0, dtype=np.float32)
    view = big[10:-10]
    xs = inputs(size, 5000, np.float32)
    view[:] = xs[comm.Get_rank()]
    fused(64)(view)
    assert np.all(big[:10] == -3.0) and np.all(big[-10:] == -3.0)
    np.testing.assert_allclose(view, mean_of(xs), rtol=1e-5, atol=1e-6)


def test_communicator_blocking_mean_of_large_buckets_uses_it(comm):
    """A multi-bucket blocking mean: the large buckets are fused means, a small last bucket is
    MPI's allreduce and a division; both give the mean, the same bytes on every rank."""
    size = comm.Get_size()
    n = 3 * (fused_mean.MIN_BYTES // 4) + 17          # three full buckets and a 68-byte one
    xs = inputs(size, n, np.float32)
    with Communicator(comm, progress="blocking", bucket_bytes=fused_mean.MIN_BYTES) as c:
        c.grads._fused_mean = recording = Recording(c.grads._fused_mean)
        buf = xs[comm.Get_rank()].copy()
        c.allreduce_mean(buf)
    np.testing.assert_allclose(buf, mean_of(xs), rtol=1e-5, atol=1e-6)
    assert same_bytes_everywhere(comm, buf)
    assert recording.sizes == ([fused_mean.MIN_BYTES] * 3 if size > 1 else [])

