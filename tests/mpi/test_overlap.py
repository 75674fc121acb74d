"""The gradient allreduce overlapped with the backward pass (ssdmpi/algos/overlap.py) against the
blocking path, at any rank count (``tests/run.py``: 1, 2 and 4).

The overlapped SSGD posts each bucket's sum-allreduce during the backward pass; the blocking
path runs one blocking allreduce of the whole buffer after it. Each element is reduced over
the same ranks either way, so with MPICH (which pairs the ranks alike for every message size,
see overlap.py) the weights must be the same BITS after every step, at every rank count, for
every progress strategy. ``--comm step``'s per-step allreduce, bucketed during the backward,
must likewise give the bits of the same allreduce posted whole after it.
"""

import hashlib

import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi.algos import AlgoConfig, build_algorithm
from ssdmpi.comm.communicator import Communicator
from ssdmpi.nn import build_model
from tests.fakes import ArrayBatches

STRATEGIES = ("test", "blocking", "thread", "poll")


def lenet(dtype):
    return build_model("lenet5", (1, 12, 12), 10, dtype=dtype, seed=2)


def mlp(dtype):
    return build_model("mlp", (20,), 5, widths=(16, 12), dtype=dtype, seed=2)


# Bucket sizes that cut each model into several buckets (mlp: one per layer; lenet5: conv1+conv2,
# fc1, fc2+fc3) while the Communicator's pieces of that size stay few.
SMALL_BUCKET = {mlp: 256, lenet: 4096}


def batches(model, rank, size, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(160,) + model.input_shape).astype(model.dtype)
    return ArrayBatches(x, rng.integers(0, model.output_shape[0], 160), 4, rank, size, seed=seed)


def same_everywhere(a) -> bool:
    digests = MPI.COMM_WORLD.allgather(hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
    return len(set(digests)) == 1


@pytest.fixture
def make_comm(comm):
    made = []

    def make(**kwargs):
        made.append(Communicator(comm, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.free()


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("build", [mlp, lenet], ids=["mlp", "lenet5"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_overlapped_ssgd_is_bitwise_the_blocking_one(make_comm, strategy, build, dtype):
    """Several buckets, posted during the backward pass, give the weights of the blocking
    allreduce after it, bit for bit, after every step."""
    overlapped_comm = make_comm(progress=strategy, bucket_bytes=SMALL_BUCKET[build])
    blocking_comm = make_comm(progress=strategy)
    cfg = AlgoConfig(algo="ssgd", lr=0.05)
    overlapped = build_algorithm(cfg, build(dtype), overlapped_comm)
    blocking = build_algorithm(cfg, build(dtype), blocking_comm)
    assert len(overlapped.backward_allreduce.buckets) >= 3      # mlp: 3 layers; lenet5: 5
    data = [batches(a.model, overlapped_comm.rank, overlapped_comm.size) for a in (overlapped, blocking)]
    for t in range(6):
        loss = overlapped.step(*data[0].next_batch())
        xb, yb = data[1].next_batch()
        assert loss == blocking._ssgd_step(xb, yb, overlap=False), f"loss at t={t}"
        blocking.t += 1
        diff = np.abs(overlapped.global_weights() - blocking.global_weights()).max()
        assert np.array_equal(overlapped.global_weights(), blocking.global_weights()), f"W at t={t}: {diff:.3g}"
        assert all(np.array_equal(a, b) for a, b in zip(overlapped.M.buffers(), blocking.M.buffers())), f"M at t={t}"
    assert same_everywhere(overlapped.global_weights())
    assert overlapped.s == blocking.s == 6


@pytest.mark.parametrize("bucket_bytes", [1024, 4096])
def test_ssd_warmup_and_step_schedule_overlapped_equal_the_whole_buffer_posted_after_backward(
        make_comm, bucket_bytes):
    """``ssd --comm step`` with its warm-up: bucketed during the backward pass (a few layers per
    bucket) == one bucket posted after it (a bucket size above the model's), W and
    L bit for bit after every step, through the switch and several pulls."""
    cfg = AlgoConfig(algo="ssd", comm="step", delay=2, warmup_steps=3, lr=0.05)
    runs = []
    for bb in (bucket_bytes, 1 << 30):
        c = make_comm(bucket_bytes=bb)
        algo = build_algorithm(cfg, lenet(np.float64), c)
        runs.append((algo, batches(algo.model, c.rank, c.size, seed=1)))
    (split, split_data), (whole, whole_data) = runs
    assert len(split.backward_allreduce.buckets) >= 3 and len(whole.backward_allreduce.buckets) == 1
    for t in range(12):
        assert split.step(*split_data.next_batch()) == whole.step(*whole_data.next_batch()), f"loss at t={t}"
        assert np.array_equal(split.global_weights(), whole.global_weights()), f"W at t={t}"
        if split.stage == "delay":
            assert np.array_equal(split.local_weights(), whole.local_weights()), f"L at t={t}"
    split.drain()
    whole.drain()
    assert split.s == whole.s and np.array_equal(split.global_weights(), whole.global_weights())
    assert same_everywhere(split.global_weights())
