"""The GPU-buffer paths of the Communicator, without a GPU.

``tests.fakes.FakeDeviceArray`` exposes ``__cuda_array_interface__`` over host memory (as mpi4py's own
``test/arrayimpl.py`` does), plus the few CuPy methods the transports use (``get(out=)``,
``set``, slicing, in-place division). mpi4py hands its pointer to MPI as a "device" buffer;
since the memory is really on the host, a non-CUDA MPI handles it, so both transports can
be exercised here. ``tests.fakes.FakeGPU`` stands in for the CUDA streams: the "kernel" that
writes the gradient is queued on its compute stream and lands only when a thread waits for it,
so a transport that let MPI (or its staging copy) read the buffer before ordering itself after
that kernel would reduce garbage, and the copy back lands only when the consumer's stream runs
(``gpu.run_all()``). The order of operations itself: tests/unit/test_gpu_staging.py.
"""

import numpy as np
import pytest

from ssdmpi.comm.communicator import Communicator
from tests.fakes import FakeDeviceArray, FakeGPU

STRATEGIES = ("blocking", "test", "thread")


def pending_kernel(gpu: FakeGPU, device_host_memory: np.ndarray, values: np.ndarray) -> None:
    """The producing kernel, queued on the compute stream: the values land when it runs."""
    gpu.compute.launch("kernel", lambda: device_host_memory.__setitem__(Ellipsis, values))


def rank_data(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(77 + rank).standard_normal(n).astype(np.float32)


def reference_mean(size: int, n: int) -> np.ndarray:
    return np.mean([rank_data(r, n).astype(np.float64) for r in range(size)], axis=0)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("transport", ["host", "cuda-aware"])
@pytest.mark.parametrize("bucket_bytes", [None, 3000])
def test_device_buffers_reduce_correctly_after_synchronising(comm, strategy, transport, bucket_bytes):
    n = 10_001
    memory = np.full(n, np.nan, dtype=np.float32)        # the "kernel" has not run yet
    gpu = FakeGPU()
    pending_kernel(gpu, memory, rank_data(comm.Get_rank(), n))
    c = Communicator(comm, progress=strategy, transport=transport, bucket_bytes=bucket_bytes, streams=gpu)
    try:
        buf = FakeDeviceArray(memory, gpu)
        out = c.allreduce_start(buf).wait()
        gpu.run_all()                                     # the consumer's stream runs: the result lands
        assert out is buf and gpu.log.count("compute: kernel") == 1
        np.testing.assert_allclose(memory, reference_mean(c.size, n), rtol=1e-5, atol=1e-6)
    finally:
        c.free()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_host_staging_leaves_the_device_buffer_alone_until_wait(comm, strategy):
    n = 5000
    memory = rank_data(comm.Get_rank(), n)
    before = memory.copy()
    gpu = FakeGPU()
    c = Communicator(comm, progress=strategy, transport="host", streams=gpu)
    try:
        handle = c.allreduce_start(FakeDeviceArray(memory, gpu))
        while not handle.test():
            gpu.run_all()                                 # time passes on the GPU: the staging copy runs
            c.progress()
        np.testing.assert_array_equal(memory, before)  # reduced, but only in the staging copy
        handle.wait()
        gpu.run_all()
        np.testing.assert_allclose(memory, reference_mean(c.size, n), rtol=1e-5, atol=1e-6)
    finally:
        c.free()


def test_host_staging_reuses_its_pinned_buffer(comm):
    memory = rank_data(comm.Get_rank(), 4096)
    c = Communicator(comm, progress="test", transport="host", streams=FakeGPU())
    try:
        buf = FakeDeviceArray(memory)
        first = c.transport.to_mpi(buf)
        assert isinstance(first, np.ndarray) and first is not memory
        np.testing.assert_array_equal(first, memory)
        assert c.transport.to_mpi(buf) is first
    finally:
        c.free()


@pytest.mark.parametrize("transport", ["host", "cuda-aware"])
def test_broadcast_of_a_device_buffer_waits_for_its_kernel_first(comm, transport):
    n = 2048
    memory = np.zeros(n, dtype=np.float32)
    gpu = FakeGPU()
    pending_kernel(gpu, memory, rank_data(comm.Get_rank(), n))
    c = Communicator(comm, progress="test", transport=transport, streams=gpu)
    try:
        c.broadcast(FakeDeviceArray(memory), root=0)
        gpu.run_all()
        assert gpu.log.count("compute: kernel") == 1
        np.testing.assert_array_equal(memory, rank_data(0, n))
    finally:
        c.free()
