"""Compressed sums (``--comm-dtype``, ssdmpi/comm/compressed.py) at any rank count, under every progress
strategy: against the reference simulator's own transport (``ssdmpi/verify/quantize.py``, written from
the definition), bitwise the same on every rank, the bytes the stats count, error feedback, sums in
flight together with other requests.

Every rank rebuilds every rank's input from its seed, so each computes the oracle itself.
"""

import time

import numpy as np
import pytest

from ssdmpi.comm.communicator import Communicator
from ssdmpi.verify.quantize import Wire
from tests.mpi.conftest import same_bytes_everywhere

DTYPES = ("bfloat16", "float16", "int8")


def rank_data(rank: int, n: int, post: int = 0) -> np.ndarray:
    return np.random.default_rng(100 * post + rank).standard_normal(n).astype(np.float32) * (1 + post)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 1000, 100_003])
def test_sums_in_sequence_match_the_reference_transport_bitwise(make_comm, comm, dtype, n):
    """Three sums of one stream (the error feedback carried from each to the next), a mean last."""
    c = make_comm()
    stream = c.compressor(dtype, np.zeros(n, np.float32))
    oracle = Wire(dtype, c.size)
    for post in range(3):
        buf = rank_data(c.rank, n, post)
        average = post == 2
        handle = c.allreduce_start(buf, average=average, compressor=stream)
        c.progress()
        assert handle.wait() is buf
        inputs = [rank_data(r, n, post) for r in range(c.size)]
        expected = oracle.mean(inputs) if average else oracle.sum(inputs)
        assert buf.dtype == np.float32 and np.array_equal(buf, expected), \
            f"post {post}: max |diff| {np.abs(buf - expected).max():.3g}"
        assert same_bytes_everywhere(comm, buf)
        np.testing.assert_array_equal(stream.residual, oracle.owed[c.rank])
        np.testing.assert_array_equal(stream.shard_residual, oracle.shard_owed[c.rank])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_sum_is_close_to_the_float32_sum(make_comm, dtype):
    c = make_comm()
    n = 10_000
    buf = rank_data(c.rank, n)
    c.allreduce_start(buf, average=False, compressor=c.compressor(dtype, buf)).wait()
    exact = np.sum([rank_data(r, n).astype(np.float64) for r in range(c.size)], axis=0)
    # one encoding per rank and one of the sum: a relative step of 2**-8 (bfloat16), 2**-11 (float16),
    # 1/254 of a block's largest element (int8, ~4 sigma of a normal block)
    step = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "int8": 4.5 / 254}[dtype]
    assert np.abs(buf - exact).max() <= (c.size + 1) * step * np.abs(exact).max()


@pytest.mark.parametrize("dtype", DTYPES)
def test_stats_count_the_bytes_on_the_wire(make_comm, dtype):
    """int8 sends at most 0.27 of float32's bytes, bfloat16 and float16 about half (at 2 and 4 ranks)."""
    c = make_comm()
    n = 100_003
    if c.size == 1:
        pytest.skip("one rank sends nothing")
    c.stats.reset()
    c.allreduce_start(np.ones(n, np.float32), average=False).wait()
    float32 = c.stats.snapshot_and_reset()["bytes_sent"]
    buf = np.ones(n, np.float32)
    c.allreduce_start(buf, average=False, compressor=c.compressor(dtype, buf)).wait()
    compressed = c.stats.snapshot_and_reset()
    assert float32 == 2 * (c.size - 1) * 4 * n // c.size
    ratio = compressed["bytes_sent"] / float32
    assert compressed["allreduce_count"] == 1
    if dtype == "int8":
        assert ratio <= 0.27
    else:
        assert 0.5 <= ratio <= 0.51


def test_error_feedback_keeps_the_running_sum_on_track(make_comm):
    """200 sums of 1/3 from every rank (bfloat16 rounds it the same way every time): with the feedback the
    total received stays within half a bfloat16 step per rank and per shard of the total meant (what is
    owed at the end); with the residuals dropped after every sum it drifts by 200 rounding errors."""
    c = make_comm()
    n, posts = 512, 200

    def meant(r):
        return np.full(n, 1.0 / 3.0, np.float32)

    totals = {}
    for feedback in (True, False):
        stream = c.compressor("bfloat16", meant(c.rank))
        received = np.zeros(n, np.float64)
        for _ in range(posts):
            buf = meant(c.rank)
            c.allreduce_start(buf, average=False, compressor=stream).wait()
            received += buf
            if not feedback:
                stream.reset()
        totals[feedback] = received
    one_sum = np.sum([meant(r) for r in range(c.size)], axis=0, dtype=np.float64)
    owed = (c.size + 1) * 2.0 ** -8 * one_sum.max()      # half of bfloat16's relative spacing, N + 1 times
    assert np.abs(totals[True] - posts * one_sum).max() <= owed
    assert np.abs(totals[False] - posts * one_sum).max() > 10 * owed


def test_sums_in_flight_with_plain_allreduces_waited_out_of_order(make_comm, comm):
    """Two compressed sums of one stream and a float32 allreduce in flight together (replay posts a
    period's sum before waiting for the previous one), waited last-first: the right values, in order."""
    c = make_comm()
    n = 5000
    stream = c.compressor("int8", np.zeros(n, np.float32))
    oracle = Wire("int8", c.size)
    first, plain, second = rank_data(c.rank, n, 0), rank_data(c.rank, n, 5), rank_data(c.rank, n, 1)
    h1 = c.allreduce_start(first, average=False, compressor=stream)
    hp = c.allreduce_start(plain, average=False)
    c.progress()
    h2 = c.allreduce_start(second, average=False, compressor=stream)
    h2.wait()
    hp.wait()
    h1.wait()
    for post, buf in ((0, first), (1, second)):
        assert np.array_equal(buf, oracle.sum([rank_data(r, n, post) for r in range(c.size)])), f"sum {post}"
    np.testing.assert_allclose(plain, np.sum([rank_data(r, n, 5) for r in range(c.size)], axis=0), rtol=1e-5,
                               atol=1e-5)
    assert same_bytes_everywhere(comm, np.concatenate([first, second, plain]))


def test_the_thread_strategy_completes_a_compressed_sum_without_the_caller(comm):
    c = Communicator(comm, progress="thread")
    try:
        buf = rank_data(c.rank, 1 << 18)
        handle = c.allreduce_start(buf, average=False, compressor=c.compressor("int8", buf))
        deadline = time.monotonic() + 30
        while not handle.test() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handle.test() and "Ialltoall+Iallgather" in str(handle)
        handle.wait()
        assert same_bytes_everywhere(comm, buf)
    finally:
        c.free()


def test_a_compressor_refuses_what_it_cannot_send(make_comm):
    c = make_comm()
    with pytest.raises(TypeError, match="float32"):
        c.compressor("int8", np.zeros(10, np.float64))
    with pytest.raises(ValueError, match="no compressed transport"):
        c.compressor("int4", np.zeros(10, np.float32))
    stream = c.compressor("int8", np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="does not fit"):
        stream.load_state_dict({"residual": np.zeros(11, np.float32), "shard_residual": stream.shard_residual})


def test_delay_auto_with_int8_agrees_on_one_choice_and_equals_the_fixed_run_it_chose():
    """``--delay auto`` probes the compressed sum at the switch on scratch buffers (no error feedback of
    the run's touched): every rank chooses the same (k, d, ratio), and the run equals, bit for bit, the
    fixed ``--delay k --merge-delay d`` run in int8."""
    from mpi4py import MPI

    from ssdmpi.algos import AlgoConfig, build_algorithm
    from ssdmpi.data import ShardedLoader as Loader
    from tests.mpi.test_algos import B, dataset, tiny_mlp

    def trajectory(settings, comm, steps):
        x, y = dataset(dtype=np.float32)
        algo = build_algorithm(AlgoConfig(algo="ssd", comm="period", comm_dtype="int8", warmup_steps=6, lr=0.05,
                                          **settings), tiny_mlp(np.float32)(), comm)
        loader = Loader(x, y, B, comm.rank, comm.size, seed=3)
        out = []
        while algo.t < 6 or algo.t < steps(algo.k):
            algo.step(*loader.next_batch())
            out.append((algo.global_weights().copy(), None if algo.L is None else algo.local_weights().copy()))
        return algo, out

    c = Communicator(MPI.COMM_WORLD)
    try:
        auto, got = trajectory({"delay": "auto"}, c, lambda k: 6 + 3 * k + 2)
        choice = auto.delay_choice
        agreed = MPI.COMM_WORLD.allgather((choice.k, choice.d, choice.comm_ratio))
        assert agreed == [agreed[0]] * c.size and choice.comm_ratio > 0
        assert choice.record()["comm_ratio"] == choice.comm_ratio
        _, want = trajectory({"delay": choice.k, "merge_delay": choice.d}, c, lambda k: 6 + 3 * k + 2)
        assert len(got) == len(want)
        for t, ((W, L), (W0, L0)) in enumerate(zip(got, want)):
            assert np.array_equal(W, W0) and (L is None or np.array_equal(L, L0)), f"t={t}"
    finally:
        c.free()
