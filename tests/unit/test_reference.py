"""The reference simulator (ssdmpi/verify/reference.py) against facts that follow from the spec.

These checks do not use the MPI code path: they compare the simulator with plain SGD
loops written here, and with itself under symmetries (N workers on identical data are
one worker).
"""

import numpy as np
import pytest

from ssdmpi.algos import AlgoConfig
from ssdmpi.nn import build_model
from ssdmpi.verify.reference import Simulation, simulate
from tests.fakes import ArrayBatches

FEATURES, CLASSES = 10, 3


def data(n=192, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, FEATURES)), rng.integers(0, CLASSES, size=n)


def factory():
    return build_model("mlp", (FEATURES,), CLASSES, widths=(8,), dtype=np.float64, seed=1)


def same_batch_for_everyone(x, y, B=4):
    """batches(r, t): every worker gets the same batch at iteration t."""
    return lambda r, t: (x[(t * B) % len(x):(t * B) % len(x) + B], y[(t * B) % len(y):(t * B) % len(y) + B])


def sgd_trajectory(x_of, steps, lr, mu=0.0):
    """Plain SGD with momentum on one model (an oracle independent of ssdmpi.optim)."""
    model = factory()
    w, v, out = np.array(model.params), np.zeros(model.num_params), []
    for t in range(steps):
        model.params[...] = w
        model.loss_and_grad(*x_of(0, t))
        v = mu * v - lr * np.array(model.grads)
        w = w + v
        out.append(w.copy())
    return out


def test_ssgd_with_N_workers_equals_one_worker_with_the_global_batch():
    x, y = data()
    N, B = 4, 4
    cfg = AlgoConfig(algo="ssgd", lr=0.05)
    many = simulate(cfg, factory, [ArrayBatches(x, y, B, r, N, seed=3) for r in range(N)], 10)
    one = simulate(cfg, factory, [ArrayBatches(x, y, N * B, 0, 1, seed=3)], 10)
    np.testing.assert_allclose(many.W, one.W, rtol=1e-12, atol=1e-14)
    assert many.s == one.s == 10 and many.stage == "warmup"


@pytest.mark.parametrize("settings", [
    dict(algo="ssd", comm="step", local_update="global-momentum"),
    dict(algo="ssd", comm="period", period_rule="replay", local_update="global-momentum"),
    dict(algo="ssd", comm="period", period_rule="delta-own"),
    dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=2),
    dict(algo="localsgd"),
])
def test_identical_data_on_every_worker_is_one_worker(settings):
    """The mean of N identical gradients (or models) is exact, so N workers == 1 worker bitwise."""
    x, y = data()
    cfg = AlgoConfig(warmup_steps=3, delay=3, lr=0.05, **settings)
    batches = same_batch_for_everyone(x, y)
    four = simulate(cfg, factory, batches, 17, world_size=4)
    one = simulate(cfg, factory, batches, 17, world_size=1)
    assert np.array_equal(four.W, one.W)
    assert all(np.array_equal(L, one.L[0]) for L in four.L)


def test_localsgd_with_one_worker_is_ssgd():
    """Switch rule V <- M: local SGD-momentum of one worker continues the SSGD trajectory exactly."""
    x, y = data()
    batches = same_batch_for_everyone(x, y)
    # 11 iterations = 3 warm-up + 4 periods of 2: the last one ends with an average.
    loc = simulate(AlgoConfig(algo="localsgd", warmup_steps=3, delay=2, lr=0.05), factory, batches, 11, world_size=1)
    ssgd = simulate(AlgoConfig(algo="ssgd", lr=0.05), factory, batches, 11, world_size=1)
    assert np.array_equal(loc.W, ssgd.W) and loc.s == ssgd.s == 11


def test_comm_step_timeline_one_worker_without_momentum_is_sgd_with_W_one_step_behind():
    """5a with N=1, k=1, mu=0, lam=0: L follows plain SGD; W lags by exactly one gradient."""
    x, y = data()
    batches = same_batch_for_everyone(x, y)
    lr, T_w = 0.1, 2
    cfg = AlgoConfig(algo="ssd", comm="step", delay=1, warmup_steps=T_w, lr=lr, momentum=0.0, weight_decay=0.0)
    sgd = sgd_trajectory(batches, 12, lr)
    sim = Simulation(cfg, factory, batches, 1)
    for t in range(12):
        sim.step()
        if t < T_w:
            np.testing.assert_allclose(sim.W, sgd[t], rtol=1e-12)
        else:
            np.testing.assert_allclose(sim.L[0], sgd[t], rtol=1e-12)
            np.testing.assert_allclose(sim.W, sgd[t - 1], rtol=1e-12)   # gradient t still in flight
    sim.finalize()
    np.testing.assert_allclose(sim.W, sgd[-1], rtol=1e-12)


def test_replay_one_worker_without_momentum_replays_each_period_one_period_late():
    """5b replay with N=1, mu=0, lam=0: at the end of period j, W = W_switch - lr*(gradients of periods < j)."""
    x, y = data()
    batches = same_batch_for_everyone(x, y)
    lr, T_w, k = 0.1, 2, 3
    cfg = AlgoConfig(algo="ssd", comm="period", period_rule="replay", delay=k, warmup_steps=T_w, lr=lr,
                     momentum=0.0, weight_decay=0.0)
    sim = Simulation(cfg, factory, batches, 1)
    probe = factory()
    for _ in range(T_w):
        sim.step()
    W_switch, period_sums = sim.W.copy(), []
    for m in range(4 * k):
        probe.params[...] = sim.L[0]                          # the gradient this iteration will use
        probe.loss_and_grad(*batches(0, sim.t))
        if m % k == 0:
            period_sums.append(np.zeros_like(sim.W))
        period_sums[-1] += np.array(probe.grads)
        sim.step()
        if (m + 1) % k == 0:
            j = m // k
            expected = W_switch - lr * sum(period_sums[:j], np.zeros_like(W_switch))
            np.testing.assert_allclose(sim.W, expected, rtol=1e-12, atol=1e-14)
            assert np.array_equal(sim.L[0], sim.W)           # reset L <- W at the period end


@pytest.mark.parametrize("rule", [dict(period_rule="delta-own"),
                                  dict(period_rule="delta-merge", merge_delay=1, merge_momentum=0.0),
                                  dict(period_rule="delta-merge", merge_delay=2, merge_momentum=0.0)])
def test_delta_one_worker_keeps_its_own_trajectory(rule):
    """5b delta with N=1: L <- W + own displacement in flight is exactly where L already was (without
    the momentum merge, which restarts the velocity from the period's mean step)."""
    x, y = data()
    batches = same_batch_for_everyone(x, y)
    lr, mu, T_w = 0.05, 0.9, 3
    cfg = AlgoConfig(algo="ssd", comm="period", delay=3, warmup_steps=T_w, lr=lr, momentum=mu, weight_decay=0.0,
                     **rule)
    sgd = sgd_trajectory(batches, 15, lr, mu)
    sim = Simulation(cfg, factory, batches, 1)
    for t in range(15):
        sim.step()
        np.testing.assert_allclose(sim.L[0] if sim.L else sim.W, sgd[t], rtol=1e-10, atol=1e-12)


def test_simulate_callback_can_stop_and_sees_each_step():
    x, y = data()
    seen = []
    sim = simulate(AlgoConfig(algo="ssd", warmup_steps=2, delay=2, lr=0.05), factory,
                   [ArrayBatches(x, y, 4, r, 2) for r in range(2)], 100,
                   callback=lambda s: seen.append((s.t, s.stage)) or s.t == 5)
    assert sim.t == 5 and seen[0] == (1, "warmup") and seen[-1] == (5, "delay") and len(sim.losses) == 2


def test_loaders_must_match_world_size():
    x, y = data()
    with pytest.raises(ValueError):
        Simulation(AlgoConfig(algo="ssgd"), factory, [ArrayBatches(x, y, 4, 0, 2)], 2)


def test_accuracy_of_any_weights_leaves_the_simulation_alone():
    x, y = data()
    cfg = AlgoConfig(algo="ssd", warmup_steps=2, delay=2, lr=0.05)
    sims = [simulate(cfg, factory, [ArrayBatches(x, y, 4, r, 2) for r in range(2)], 6) for _ in range(2)]
    acc, loss = sims[0].accuracy(sims[0].L[1], x, y, batch_size=50)
    model = factory()
    model.params[...] = sims[1].L[1]
    logits = model.forward(x, train=False)
    assert acc == pytest.approx(np.mean(logits.argmax(1) == y)) and loss > 0
    for sim in sims:                             # the evaluated simulation continues exactly like its twin
        sim.step()
    assert np.array_equal(sims[0].W, sims[1].W) and np.array_equal(sims[0].L[0], sims[1].L[0])


def test_delta_own_invariants_of_period_rule_md():
    """PERIOD_RULE.md 3: at each boundary with p >= 1, W <- W + (the sum in flight)/N and every worker
    restarts from L_r = W + D_r, D_r = L_r - S_r its own displacement of the period (computed here from
    the spec's local step, independently of the simulator); mean_r L_r = W + the new in-flight mean;
    after finalize (mid-period), W = mean_r L_r (exact arithmetic; float64 here)."""
    x, y = data()
    N, k, T_w, B = 3, 4, 2, 4
    cfg = AlgoConfig(algo="ssd", comm="period", period_rule="delta-own", delay=k, warmup_steps=T_w, lr=0.05)

    def batches(r, t):                                                    # a different batch per worker
        at = ((t * N + r) * B) % (len(x) - B)
        return x[at:at + B], y[at:at + B]

    sim = Simulation(cfg, factory, batches, N)
    probe = factory()
    mu, lam, mask = sim.cfg.momentum, sim.cfg.weight_decay, np.asarray(probe.flat.decay_mask())   # resolved
    for _ in range(T_w):
        sim.step()
    checked = 0
    for m in range(5 * k):
        S_before = [S.copy() for S in sim.S]
        boundary = (m + 1) % k == 0
        if boundary:
            W0, pending0, eta, D = sim.W.copy(), sim.pending, sim.sched(sim.t), []
            for r in range(N):                                            # the period's last local step, by hand
                probe.params[...] = sim.L[r]
                probe.loss_and_grad(*batches(r, sim.t))
                U = mu * sim.U[r] - eta * lam * mask * sim.L[r] - eta * np.array(probe.grads)
                D.append(sim.L[r] + U - S_before[r])
        sim.step()
        if boundary and pending0 is not None:
            np.testing.assert_allclose(sim.W, W0 + pending0, rtol=1e-12, atol=1e-13)
            for r in range(N):
                np.testing.assert_allclose(sim.L[r], sim.W + D[r], rtol=1e-12, atol=1e-13)   # L_r = W + D_r
            np.testing.assert_allclose(sim.pending, sum(D) / N, rtol=1e-12, atol=1e-13)
            np.testing.assert_allclose(sum(sim.L) / N, sim.W + sim.pending, rtol=1e-12, atol=1e-13)
            checked += 1
        elif not boundary:
            assert all(np.array_equal(a, b) for a, b in zip(S_before, sim.S))
    assert checked == 4
    sim.step()                                                            # one into the next period
    sim.finalize()
    np.testing.assert_allclose(sim.W, sum(sim.L) / N, rtol=1e-12, atol=1e-13)
    assert sim.pending is None


def worker_batches(x, y, N, B=4):
    """batches(r, t): a different batch per worker and iteration."""
    def batches(r, t):
        at = ((t * N + r) * B) % (len(x) - B)
        return x[at:at + B], y[at:at + B]
    return batches


@pytest.mark.parametrize("k", [2, 4])
def test_delta_merge_with_d_equal_k_is_delta_own(k):
    """Merged d = k iterations after posting (at the next period's end, before the next post), the
    cheap merge ``L <- W + (L - S); S <- W`` is delta-own's ``L <- W + D`` (PERIOD_RULE.md 3) in exact
    arithmetic: float64 trajectories agree to rounding, W and every L after every iteration (without
    the momentum merge, which delta-own does not have)."""
    x, y = data()
    N = 3
    batches = worker_batches(x, y, N)
    sims = [Simulation(AlgoConfig(algo="ssd", comm="period", delay=k, warmup_steps=2, lr=0.05, **rule), factory,
                       batches, N) for rule in (dict(period_rule="delta-own"),
                                                dict(period_rule="delta-merge", merge_delay=k, merge_momentum=0.0))]
    for _ in range(2 + 5 * k + 1):
        for sim in sims:
            sim.step()
        np.testing.assert_allclose(sims[1].W, sims[0].W, rtol=1e-10, atol=1e-12)
        assert sims[1].s == sims[0].s
        if sims[0].L is not None:
            for a, b in zip(sims[1].L, sims[0].L):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    for sim in sims:
        sim.finalize()
    np.testing.assert_allclose(sims[1].W, sims[0].W, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("k, d", [(4, 1), (4, 3), (5, 2)])
def test_delta_merge_merges_d_iterations_after_each_post_and_keeps_the_mean(k, d):
    """W changes exactly at the merges (d iterations after each period end, by the mean posted there);
    after every iteration mean_r L_r = W + (the mean in flight) + mean_r (L_r - S_r); finalize gives
    W = mean_r L_r (float64, exact up to rounding)."""
    x, y = data()
    N, T_w = 3, 2
    sim = Simulation(AlgoConfig(algo="ssd", comm="period", period_rule="delta-merge", delay=k, merge_delay=d,
                                warmup_steps=T_w, lr=0.05), factory, worker_batches(x, y, N), N)
    for _ in range(T_w):
        sim.step()
    posted, merges = None, 0
    for m in range(5 * k + d - 1):
        W0, pending0 = sim.W.copy(), sim.pending
        sim.step()
        merge = m + 1 - d >= k and (m + 1 - d) % k == 0
        if merge:
            assert pending0 is posted is not None
            np.testing.assert_allclose(sim.W, W0 + posted, rtol=0, atol=0)
            merges += 1
        else:
            assert np.array_equal(sim.W, W0)
        if (m + 1) % k == 0:
            posted = sim.pending
            assert posted is not None and posted is not pending0
        else:
            assert sim.pending is (None if merge else pending0)
        inflight = 0 if sim.pending is None else sim.pending
        np.testing.assert_allclose(sum(sim.L) / N, sim.W + inflight + sum(L - S for L, S in zip(sim.L, sim.S)) / N,
                                   rtol=1e-12, atol=1e-13)
    assert merges == 4 and sim.s == T_w + 4 * k                          # the warm-up steps, then k per merge
    sim.step()
    sim.finalize()
    np.testing.assert_allclose(sim.W, sum(sim.L) / N, rtol=1e-12, atol=1e-13)
    assert sim.pending is None


@pytest.mark.parametrize("settings", [
    dict(algo="ssgd"),
    dict(algo="ssd", comm="step", local_update="global-momentum"),
    dict(algo="ssd", comm="step", local_update="glu-paper"),
    dict(algo="ssd", comm="period", period_rule="replay", local_update="global-momentum"),
    dict(algo="ssd", comm="period", period_rule="delta-own"),
    dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=1),
    dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=2),
    dict(algo="localsgd"),
    dict(algo="asgd", servers=1, asgd_order="round-robin"),
])
def test_finalized_W_is_what_finalize_gives_there_and_changes_nothing(settings):
    """At every iteration (warm-up, each place in a period), ``finalized_W()`` is the ``W`` of a second
    simulation stopped there and finalized; asking for it all along leaves the run bitwise as without."""
    x, y = data()
    N, T_w, k, steps = 3, 2, 3, 13
    world = N + settings.get("servers", 0)
    takes_k = settings["algo"] in ("ssd", "localsgd")
    cfg = AlgoConfig(warmup_steps=T_w, lr=0.05, **settings, **(dict(delay=k) if takes_k else {}))
    asked = []
    watched = simulate(cfg, factory, worker_batches(x, y, N), steps, world_size=world,
                       callback=lambda sim: asked.append(np.array(sim.finalized_W(), copy=True)) and False)
    plain = simulate(cfg, factory, worker_batches(x, y, N), steps, world_size=world)
    for name in ("W", "M", "s", "t", "pending"):
        a, b = getattr(watched, name, None), getattr(plain, name, None)
        assert (a is None and b is None) or np.array_equal(a, b), name
    assert (watched.L is plain.L is None) or all(np.array_equal(a, b) for a, b in zip(watched.L, plain.L))
    for t in range(1, steps + 1):
        stopped = simulate(cfg, factory, worker_batches(x, y, N), t, world_size=world)
        stopped.finalize()
        assert np.array_equal(asked[t - 1], stopped.W), t
    assert not np.array_equal(asked[T_w + 1], asked[T_w + 2])      # the weights move: the check can fail
