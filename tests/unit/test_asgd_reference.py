"""The reference ASGD (``ASGDSimulation``, round-robin order) and asgd's settings, without MPI."""

import numpy as np
import pytest

from ssdmpi.algos import AlgoConfig
from ssdmpi.algos.asgd import pairwise_sum, shard
from ssdmpi.data import ShardedLoader
from ssdmpi.errors import UserError
from ssdmpi.nn import build_model
from ssdmpi.verify.reference import ASGDSimulation, Simulation, simulate

FEATURES, CLASSES, B = 6, 3, 4


def data(n=160, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, FEATURES)), rng.integers(0, CLASSES, size=n)


def factory():
    return build_model("mlp", (FEATURES,), CLASSES, widths=(5,), dtype=np.float64, seed=1)


@pytest.mark.parametrize("warmup", [0, 3])
def test_one_worker_is_sgd_bitwise(warmup):
    x, y = data()
    asgd = ASGDSimulation(AlgoConfig(algo="asgd", warmup_steps=warmup, lr=0.05), factory,
                          [ShardedLoader(x, y, B, 0, 1, seed=2)], world_size=2)
    sgd = Simulation(AlgoConfig(algo="ssgd", lr=0.05), factory, [ShardedLoader(x, y, B, 0, 1, seed=2)], 1)
    for _ in range(12):
        assert asgd.step() == sgd.step()
        assert np.array_equal(asgd.W, sgd.W) and np.array_equal(asgd.M, sgd.M)
    assert asgd.staleness == [0] * 12 and asgd.s == 12


def test_warmup_is_ssgd_over_the_workers_then_staleness_is_k_minus_1():
    x, y = data()
    K, T_w = 3, 4
    cfg = AlgoConfig(algo="asgd", servers=2, warmup_steps=T_w, lr=0.05)
    asgd = ASGDSimulation(cfg, factory, [ShardedLoader(x, y, B, w, K, seed=2) for w in range(K)], world_size=K + 2)
    ssgd = Simulation(AlgoConfig(algo="ssgd", lr=0.05), factory,
                      [ShardedLoader(x, y, B, w, K, seed=2) for w in range(K)], K)
    for _ in range(T_w):
        asgd.step()
        ssgd.step()
        assert np.array_equal(asgd.W, ssgd.W)
    assert asgd.stage == "async" and asgd.s == T_w     # the next iteration is asynchronous
    asgd.step()
    assert asgd.s == T_w + K
    assert asgd.staleness[-K:] == [0, 1, 2]        # the first async round: all pulled the same W
    asgd.step()
    assert asgd.staleness[-K:] == [K - 1] * K
    assert np.array_equal(asgd.L[K - 1], asgd.W) and not np.array_equal(asgd.L[0], asgd.W)


def test_staleness_rate_divides_each_push_by_one_plus_its_staleness():
    """One warm-up step, then the first asynchronous round by hand: every worker computed on the
    same W, so worker w's push is w updates stale and steps with lr / (1 + w)."""
    x, y = data()
    K, lr, mu, lam = 3, 0.05, 0.9, 1e-4
    cfg = AlgoConfig(algo="asgd", warmup_steps=1, lr=lr, momentum=mu, weight_decay=lam, asgd_rate="staleness")
    sim = ASGDSimulation(cfg, factory, [ShardedLoader(x, y, B, w, K, seed=2) for w in range(K)], world_size=K + 1)
    sim.step()
    W, M = sim.W.copy(), sim.M.copy()
    sim.step()
    assert sim.staleness[-K:] == [0, 1, 2]
    replay = [ShardedLoader(x, y, B, w, K, seed=2) for w in range(K)]
    for loader in replay:
        loader.next_batch()                          # the warm-up's batches
    model = factory()
    mask = np.asarray(model.flat.decay_mask())
    grads = []
    for loader in replay:
        model.params[...] = W                        # every worker pulled the warm-up's W
        model.loss_and_grad(*loader.next_batch())
        grads.append(np.array(model.grads, copy=True))
    for w, g in enumerate(grads):
        M = mu * M - (lr / (1 + w)) * (lam * (mask * W) + g)
        W = W + M
    assert np.allclose(sim.W, W, rtol=0, atol=1e-15) and np.allclose(sim.M, M, rtol=0, atol=1e-15)
    plain = ASGDSimulation(AlgoConfig(algo="asgd", warmup_steps=1, lr=lr, momentum=mu, weight_decay=lam,
                                      asgd_rate="plain"), factory,
                           [ShardedLoader(x, y, B, w, K, seed=2) for w in range(K)], world_size=K + 1)
    plain.step()
    plain.step()
    assert not np.allclose(plain.W, W)               # the plain rate is another trajectory


def test_simulate_dispatches_asgd():
    x, y = data()
    sim = simulate(AlgoConfig(algo="asgd", warmup_steps=1), factory,
                   [ShardedLoader(x, y, B, w, 2, seed=0) for w in range(2)], 3, world_size=3)
    assert isinstance(sim, ASGDSimulation) and sim.t == 3 and sim.s == 1 + 2 * 2


def test_shards_cover_the_buffer_and_pairwise_sum_order():
    for n, S in ((10, 1), (10, 3), (2, 2), (7, 4)):
        parts = [shard(n, j, S) for j in range(S)]
        assert parts[0].start == 0 and parts[-1].stop == n
        assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))
        assert max(p.stop - p.start for p in parts) - min(p.stop - p.start for p in parts) <= 1
    xs = [np.array([v]) for v in (1e16, 1.0, -1e16, 1.0)]
    assert pairwise_sum(xs)[0] == (1e16 + 1.0) + (-1e16 + 1.0)


@pytest.mark.parametrize("settings, match", [
    (dict(servers=2), "needs at least 3 ranks"),
    (dict(servers=0), "--servers must be a positive integer"),
    (dict(asgd_order="random"), "asgd-order"),
    (dict(delay=5), "--delay does not apply to --algo asgd"),
    (dict(asgd_rate="inverse"), "asgd-rate"),
])
def test_bad_asgd_settings(settings, match):
    with pytest.raises(UserError, match=match):
        AlgoConfig(algo="asgd", **settings).validate(world_size=2)


def test_asgd_settings_on_another_algorithm_are_rejected():
    with pytest.raises(UserError, match="--servers applies only to --algo asgd"):
        AlgoConfig(algo="ssgd", servers=1).validate(world_size=2)
    with pytest.raises(UserError, match="--asgd-rate applies only to --algo asgd"):
        AlgoConfig(algo="ssd", asgd_rate="staleness").validate(world_size=2)
    resolved = AlgoConfig(algo="asgd").validate(world_size=2)
    assert (resolved.servers, resolved.asgd_order, resolved.asgd_rate) == (1, "arrival", "staleness")
