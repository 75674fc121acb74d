"""The asynchronous GPU staging, with fake device arrays and fake CUDA streams (no GPU needed).

``tests.fakes.FakeGPU`` runs queued stream work only when a thread waits for it, and logs what
ran in order. The gradient is written by a "kernel" queued on the compute stream, so:

- a staging copy that did not wait for it copies NaN (the write before the copy);
- an MPI post before the copy's event completed sees NaN (the copy before the post);
- a consumer kernel that did not wait for the copy back reads the old values (the result back
  before use). The fake MPI below triples the buffer, standing in for the other ranks' sums.

One rank (``MPI.COMM_SELF``): the ordering is per rank; tests/mpi/test_comm_gpu.py runs the
same fakes at 1, 2 and 4 ranks.
"""

import math

import numpy as np
import pytest

from ssdmpi.comm.communicator import Communicator
from ssdmpi.comm.transport import Transport
from ssdmpi.run.loop import Interval
from tests.fakes import FakeDeviceArray, FakeGPU

N = 1000
GRAD = np.arange(N, dtype=np.float32) / 7


def pending_gradient(gpu):
    """Device memory the backward 'kernel' (queued, not yet run) fills with ``GRAD``."""
    memory = np.full(N, np.nan, dtype=np.float32)
    gpu.compute.launch("backward writes the gradient", lambda: memory.__setitem__(Ellipsis, GRAD))
    return memory


class TriplingComm:
    """Wraps an mpi4py communicator: logs each post and what the buffer held then, and triples the
    buffer (the other ranks' contributions) before the real, one-rank call."""

    def __init__(self, comm, gpu):
        self._comm, self.gpu, self.seen = comm, gpu, []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def _log(self, what, buf):
        with self.gpu.lock:
            self.gpu.log.append(f"mpi: {what}")
        self.seen.append(np.array(buf, copy=True))
        buf *= 3

    def Iallreduce(self, sendbuf, buf, op):
        self._log("post Iallreduce", buf)
        return self._comm.Iallreduce(sendbuf, buf, op=op)

    def Allreduce(self, sendbuf, buf, op):
        self._log("Allreduce", buf)
        return self._comm.Allreduce(sendbuf, buf, op=op)

    def Bcast(self, buf, root):
        self._log("Bcast", buf)
        return self._comm.Bcast(buf, root=root)


def consume(gpu, memory):
    """The consumer's next kernel, queued on the compute stream: what it reads when it runs."""
    seen = []
    gpu.compute.launch("consumer reads the result", lambda: seen.append(memory.copy()))
    gpu.run_all()
    return seen[0]


# -- the transport alone ------------------------------------------------------------------------

def test_stage_returns_at_once_and_the_copy_waits_for_the_gradient_kernel():
    gpu = FakeGPU()
    memory = pending_gradient(gpu)
    transport = Transport("host", streams=gpu)
    staged = transport.stage(FakeDeviceArray(memory))
    assert gpu.log == [] and not staged.ready()          # nothing ran: the caller did not wait
    assert isinstance(staged.work, np.ndarray) and staged.work is not memory
    staged.wait_ready()
    assert gpu.log == ["compute: backward writes the gradient", "copy: D2H"]
    np.testing.assert_array_equal(staged.work, GRAD)     # not the NaN of before the kernel
    assert staged.ready()


def test_the_copy_back_is_ordered_before_the_consumers_next_kernel():
    gpu = FakeGPU()
    memory = pending_gradient(gpu)
    transport = Transport("host", streams=gpu)
    buf = FakeDeviceArray(memory)
    work = transport.to_mpi(buf)
    work *= 3                                            # "MPI" wrote the result into the staging buffer
    transport.from_mpi(buf, work)
    assert gpu.log[-1] == "copy: D2H"                    # the copy back is queued, not run: the host goes on
    np.testing.assert_array_equal(consume(gpu, memory), 3 * GRAD)
    assert gpu.log[-2:] == ["copy: H2D", "compute: consumer reads the result"]


def test_cuda_aware_hands_mpi_the_device_buffer_once_its_kernel_ran():
    gpu = FakeGPU()
    memory = pending_gradient(gpu)
    buf = FakeDeviceArray(memory)
    staged = Transport("cuda-aware", streams=gpu).stage(buf)
    assert staged.work is buf and not staged.ready()
    staged.wait_ready()
    assert gpu.log == ["compute: backward writes the gradient"]
    Transport("cuda-aware", streams=gpu).from_mpi(buf, buf)  # MPI wrote the device memory: nothing to copy
    assert gpu.copy.done and gpu.compute.done


def test_host_buffers_touch_no_stream():
    gpu = FakeGPU()
    a = np.ones(3, dtype=np.float32)
    staged = Transport("host", streams=gpu).stage(a)
    assert staged.work is a and staged.ready()
    assert gpu.compute.done and gpu.copy.done and gpu.log == []


def test_the_staging_buffer_is_reused_and_evicting_waits_for_the_copies():
    gpu = FakeGPU()
    transport = Transport("host", streams=gpu)
    buf = FakeDeviceArray(np.ones(8, dtype=np.float32))
    first = transport.stage(buf).work
    assert transport.stage(buf).work is first
    others = [FakeDeviceArray(np.ones(8, dtype=np.float32)) for _ in range(15)]
    for other in others:
        transport.stage(other)
    assert not gpu.copy.done                             # copies queued into the cached buffers
    transport.stage(FakeDeviceArray(np.ones(8, dtype=np.float32)))   # the 17th: the cache is cleared
    assert gpu.log.count("copy: D2H") >= 17              # ... only after every queued copy ran


# -- the communicator: write, copy, post, copy back, use --------------------------------------

EXPECTED = ["compute: backward writes the gradient", "copy: D2H", "mpi: {post}", "copy: H2D",
            "compute: consumer reads the result"]


@pytest.fixture
def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


def staged_communicator(comm, gpu, strategy):
    c = Communicator(comm, progress=strategy, transport="host", streams=gpu, stall_timeout=None)
    fake = TriplingComm(c.grads._comm, gpu)
    c.grads._comm = fake
    return c, fake


@pytest.mark.parametrize("strategy", ["blocking", "thread"])
def test_allreduce_order_with_a_waiting_thread(self_comm, strategy):
    gpu = FakeGPU()
    memory = pending_gradient(gpu)
    c, fake = staged_communicator(self_comm, gpu, strategy)
    try:
        handle = c.allreduce_start(FakeDeviceArray(memory), average=False)
        handle.wait()
        np.testing.assert_array_equal(fake.seen[0], GRAD)    # MPI saw the gradient, not NaN
        np.testing.assert_array_equal(consume(gpu, memory), 3 * GRAD)
        post = "Allreduce"
        assert gpu.log == [e.format(post=post) for e in EXPECTED]
    finally:
        c.grads._comm = fake._comm
        c.free()


def test_test_strategy_posts_only_once_the_copy_is_done(self_comm):
    gpu = FakeGPU()
    memory = pending_gradient(gpu)
    c, fake = staged_communicator(self_comm, gpu, "test")
    try:
        handle = c.allreduce_start(FakeDeviceArray(memory), average=False)
        assert not handle.test()                            # the copy has not run: nothing posted
        c.progress()
        assert gpu.log == [] and fake.seen == []
        gpu.copy.run()                                      # the GPU gets there (the copy waits for the kernel)
        assert handle.test()                                # posted now, and one rank completes at once
        handle.wait()
        np.testing.assert_array_equal(fake.seen[0], GRAD)
        np.testing.assert_array_equal(consume(gpu, memory), 3 * GRAD)
        assert gpu.log == [e.format(post="post Iallreduce") for e in EXPECTED]
    finally:
        c.grads._comm = fake._comm
        c.free()


def test_test_strategy_wait_posts_a_request_whose_copy_is_still_queued(self_comm):
    gpu = FakeGPU()
    first, second = pending_gradient(gpu), pending_gradient(gpu)
    c, fake = staged_communicator(self_comm, gpu, "test")
    try:
        h1 = c.allreduce_start(FakeDeviceArray(first), average=False)
        h2 = c.allreduce_start(FakeDeviceArray(second), average=False)
        assert fake.seen == []
        h2.wait()                                           # posts h1 first: every rank posts in the same order
        assert len(fake.seen) == 2 and all(np.array_equal(s, GRAD) for s in fake.seen)
        assert h1.test()
        h1.wait()
        gpu.run_all()
        np.testing.assert_array_equal(first, 3 * GRAD)
        np.testing.assert_array_equal(second, 3 * GRAD)
    finally:
        c.grads._comm = fake._comm
        c.free()


def test_broadcast_stages_before_the_call_and_copies_back_before_use(self_comm):
    gpu = FakeGPU()
    memory = pending_gradient(gpu)
    c, fake = staged_communicator(self_comm, gpu, "test")
    try:
        c.broadcast(FakeDeviceArray(memory), root=0)
        np.testing.assert_array_equal(fake.seen[0], GRAD)
        np.testing.assert_array_equal(consume(gpu, memory), 3 * GRAD)
        assert gpu.log == [e.format(post="Bcast") for e in EXPECTED]
    finally:
        c.grads._comm = fake._comm
        c.free()


# -- losses stay on the device until the sync point ----------------------------------------

class CountedScalar(FakeDeviceArray):
    """A 0-d 'device' loss that counts how often it is copied to the host."""

    reads = 0

    def get(self, out=None, stream=None, blocking=True):
        CountedScalar.reads += 1
        return super().get(out, stream, blocking)


def test_interval_reads_device_losses_only_at_the_sync_point():
    CountedScalar.reads = 0
    interval = Interval()
    for value in (1.5, float("nan"), 2.0, float("inf")):
        interval.add(CountedScalar(np.array(value, dtype=np.float32)))
    interval.add(0.25)                                      # a host float (NumPy runs) mixes in
    assert CountedScalar.reads == 0 and interval.steps == 5
    assert interval.loss == 3.75 and interval.bad == 2     # the non-finite ones are counted, not summed
    assert CountedScalar.reads == 4
    assert interval.loss == 3.75 and CountedScalar.reads == 4   # read once
    interval.reset()
    assert (interval.steps, interval.loss, interval.bad) == (0, 0.0, 0)
    interval.add(CountedScalar(np.array(-math.inf)))
    assert interval.bad == 1 and interval.loss == 0.0
