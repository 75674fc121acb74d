"""Where each algorithm communicates: the calls it makes on the Communicator, iteration by iteration.

A recording wrapper around the real Communicator logs every call with the iteration
it happened in, so the tests can check the schedule of ALGORITHM.md 5a/5b: what is
posted nonblocking, when it is waited for, and that in-flight buffers are never the
model's own buffers.
"""

import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi.algos import AlgoConfig, build_algorithm
from ssdmpi.comm.communicator import Communicator
from ssdmpi.nn import build_model
from tests.fakes import ArrayBatches


class Recording:
    """Forwards to a Communicator; ``log`` gets ``(kind, iteration, request id, buffer)``."""

    def __init__(self, comm):
        self.inner, self.size, self.rank, self.bucket_bytes = comm, comm.size, comm.rank, comm.bucket_bytes
        self.log, self.t, self._next = [], 0, 0
        self.averages = []     # the ``average`` flag of every call, in order

    def allreduce_mean(self, buf):
        self.log.append(("blocking", self.t, None, buf))
        return self.inner.allreduce_mean(buf)

    def allreduce(self, buf, average=True):
        self.averages.append(average)
        self.log.append(("blocking", self.t, None, buf))
        return self.inner.allreduce(buf, average)

    def allreduce_start(self, buf, average=True):
        rid, self._next = self._next, self._next + 1
        self.averages.append(average)
        self.log.append(("start", self.t, rid, buf))
        handle, log, outer = self.inner.allreduce_start(buf, average), self.log, self

        class Handle:
            def wait(self):
                log.append(("wait", outer.t, rid, buf))
                return handle.wait()

            def test(self):
                return handle.test()
        return Handle()


@pytest.fixture
def recorded():
    c = Communicator(MPI.COMM_WORLD)
    yield Recording(c)
    c.free()


def run(cfg, comm, steps):
    model = build_model("mlp", (6,), 3, widths=(5,), dtype=np.float64, seed=0)
    algo = build_algorithm(cfg, model, comm)
    rng = np.random.default_rng(0)
    loader = ArrayBatches(rng.normal(size=(200, 6)), rng.integers(0, 3, 200), 2, comm.rank, comm.size)
    for t in range(steps):
        comm.t = t
        algo.step(*loader.next_batch())
    return model, algo


def by_kind(log, kind):
    return [entry for entry in log if entry[0] == kind]


def test_comm_step_posts_every_iteration_and_waits_one_iteration_later(recorded):
    T_w, steps = 3, 10
    model, algo = run(AlgoConfig(warmup_steps=T_w, delay=2, comm="step", lr=0.05), recorded, steps)
    assert [t for _, t, _, _ in by_kind(recorded.log, "blocking")] == list(range(T_w))    # warm-up: SSGD
    starts, waits = by_kind(recorded.log, "start"), by_kind(recorded.log, "wait")
    assert [t for _, t, _, _ in starts] == list(range(T_w, steps))                       # one post per iteration
    assert [(rid, t) for _, t, rid, _ in waits] == [(rid, t + 1) for _, t, rid, _ in starts[:-1]]
    for i, (_, t, _rid, _buf) in enumerate(recorded.log):                                   # posted before the wait
        if recorded.log[i][0] == "wait":
            assert recorded.log[i - 1][0] == "start" and recorded.log[i - 1][1] == t
    buffers = [buf for _, _, _, buf in starts]
    assert buffers[0] is not buffers[1] and all(buffers[i] is buffers[i % 2] for i in range(len(buffers)))
    assert all(b is not model.grads and b is not model.params for b in buffers)
    algo.drain()
    assert by_kind(recorded.log, "wait")[-1][2] == starts[-1][2]                          # drain completes it


@pytest.mark.parametrize("settings", [dict(algo="ssgd"), dict(algo="ssd", comm="step", delay=2, warmup_steps=1)])
def test_each_bucket_is_posted_as_soon_as_backward_has_finished_its_layers(settings):
    """Buckets of one layer each (``--bucket-size`` 8 bytes): the last layer's gradient is posted
    before the first layer's backward runs, every bucket before the wait, the waits before the update."""
    inner = Communicator(MPI.COMM_WORLD, bucket_bytes=8)
    try:
        comm = Recording(inner)
        model = build_model("mlp", (6,), 3, widths=(5,), dtype=np.float64, seed=0)
        for layer in model.layers:
            layer.backward = logged(layer.backward, comm.log, layer.name)
        algo = build_algorithm(AlgoConfig(lr=0.05, **settings), model, comm)
        rng = np.random.default_rng(0)
        loader = ArrayBatches(rng.normal(size=(40, 6)), rng.integers(0, 3, 40), 2, comm.rank, comm.size)
        for t in range(3):
            comm.t = t
            del comm.log[:]
            algo.step(*loader.next_batch())
            events = [(e[0], e[2]) if e[0] == "backward" else (e[0], e[3].size) for e in comm.log]
            fc2, fc1 = 5 * 3 + 3, 6 * 5 + 5                     # the buckets' lengths, last layer first
            assert events[:5] == [("backward", "fc2"), ("start", fc2), ("backward", "relu1"), ("backward", "fc1"),
                                  ("start", fc1)], events
            if algo.stage == "warmup":
                assert events[5:] == [("wait", fc2), ("wait", fc1)], events
    finally:
        inner.free()


def logged(backward, log, name):
    def wrapper(dy):
        log.append(("backward", None, name, None))
        return backward(dy)
    return wrapper


@pytest.mark.parametrize("rule", ["delta-own", "replay"])
def test_comm_period_posts_once_per_period_and_waits_a_period_later(recorded, rule):
    T_w, k, steps = 2, 3, 2 + 5 * 3
    model, algo = run(AlgoConfig(warmup_steps=T_w, delay=k, comm="period", period_rule=rule, lr=0.05),
                      recorded, steps)
    starts, waits = by_kind(recorded.log, "start"), by_kind(recorded.log, "wait")
    period_ends = [t for t in range(T_w, steps) if (t - T_w) % k == k - 1]
    assert [t for _, t, _, _ in starts] == period_ends
    assert [(rid, t) for _, t, rid, _ in waits] == [(rid, t + k) for _, t, rid, _ in starts[:-1]]
    assert len(by_kind(recorded.log, "blocking")) == T_w
    assert all(buf is not model.grads and buf is not model.params for _, _, _, buf in starts)


def test_localsgd_averages_blocking_every_k(recorded):
    T_w, k, steps = 2, 4, 2 + 3 * 4 + 1
    run(AlgoConfig(algo="localsgd", warmup_steps=T_w, delay=k, lr=0.05), recorded, steps)
    blocking = [t for _, t, _, _ in by_kind(recorded.log, "blocking")]
    assert blocking == list(range(T_w)) + [t for t in range(T_w, steps) if (t - T_w) % k == k - 1]
    assert not by_kind(recorded.log, "start")


@pytest.mark.parametrize("algo,comm", [("ssgd", None), ("ssd", "step"), ("ssd", "period"), ("localsgd", None)])
def test_the_division_by_n_is_folded_into_the_consumer(recorded, algo, comm):
    """Every allreduce of a training step is a plain sum (``average=False``): the global update,
    delta-own's ``W`` update and localsgd's average divide by N as they read it (no extra pass)."""
    extra = {} if algo == "ssgd" else {"warmup_steps": 2, "delay": 2, **({"comm": comm} if comm else {})}
    cfg = AlgoConfig(algo=algo, lr=0.05, **extra)
    _, algo_obj = run(cfg, recorded, 8)
    algo_obj.drain()
    assert recorded.averages and not any(recorded.averages)
