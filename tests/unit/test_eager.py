"""``--period-rule eager`` (ssdmpi/algos/rules/eager.py, docs/PERIOD_RULE.md 9) without MPI.

- Its reference twin (ssdmpi/verify/eager_twin.py) against a NumPy transcription, written here, of the
  paper's algorithm (Kale, Douillard, Donchev 2025, "Eager Updates For Overlapped Communication and
  Computation in DiLoCo", Algorithm 3) in the paper's own form: each replica keeps its outer model
  ``theta_m``, computes its outer gradient ``Delta_m = theta_m - (inner end)``, dispatches it, and steps
  ``theta_m`` with the outer optimizer (SGD, lr 1) on ``Delta_m/N + (Delta_bar_prev - Delta_m_prev/N)``:
  its current outer gradient with weight ``1/N`` and the average received a period late less its own
  delayed share. The twin's absolute form is equal in exact arithmetic (float64: to rounding).
- Its fused pass: the NumPy blocks and the GPU kernel's body (a fake GPU) give the unfused bits.
- Its linear map: delta-own restarting from ``W + D/N`` (``stability.DAMP`` at ``a = 1/N``), its
  thresholds against a direct scalar simulation of the paper's form, and the figures the docs quote.
- What a run may combine it with.
"""

import numpy as np
import pytest

from ssdmpi.algos import AlgoConfig, registry, stability
from ssdmpi.algos.rules import eager
from ssdmpi.errors import UserError
from ssdmpi.nn import build_model
from ssdmpi.optim import fused
from ssdmpi.verify.reference import Simulation
from tests.unit.test_fused import DTYPES, SMALL, data, fake_gpu, same_bits  # noqa: F401 (fixture)

FEATURES, CLASSES, B = 6, 3, 4
RULE = "eager"


def factory():
    return build_model("mlp", (FEATURES,), CLASSES, widths=(5,), dtype=np.float64, seed=4)


def batches(n_workers, seed=0):
    """``batches(r, t)``: worker ``r``'s own batch at iteration ``t`` (different data on every worker)."""
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(4096, FEATURES)), rng.integers(0, CLASSES, size=4096)
    return lambda r, t: (x[(t * n_workers + r) * B:(t * n_workers + r + 1) * B],
                         y[(t * n_workers + r) * B:(t * n_workers + r + 1) * B])


class PaperAlgorithm3:
    """DiLoCo with eager updates, as the paper writes it, for ``N`` replicas and ``H = k`` inner steps; the inner
    optimizer is momentum SGD on the replica's mean gradient with L2 weight decay on the mask
    (``u <- mu u - eta (lam mask x + g)``, ``x <- x + u``), its state kept across outer steps; the outer
    optimizer SGD with lr 1. ``theta[m]`` the replica's outer model, ``x[m]`` its inner one."""

    def __init__(self, cfg, N, batch):
        self.N, self.k, self.batch = N, cfg.delay, batch
        self.eta, self.mu, self.lam = cfg.lr, cfg.momentum, cfg.weight_decay
        self.model = factory()
        self.mask = np.asarray(self.model.flat.decay_mask())
        theta0 = np.array(self.model.params)
        self.theta = [theta0.copy() for _ in range(N)]
        self.x = [theta0.copy() for _ in range(N)]
        self.u = [np.zeros_like(theta0) for _ in range(N)]
        self.delta_prev = [np.zeros_like(theta0) for _ in range(N)]     # Delta_m^(0) = 0
        self.avg_prev = np.zeros_like(theta0)                             # Delta^(0) = 0: nothing received
        self.received = theta0.copy()            # theta^(0) minus every average received so far
        self.t = 0

    def grad(self, m):
        self.model.params[...] = self.x[m]
        self.model.loss_and_grad(*self.batch(m, self.t))
        return np.array(self.model.grads)

    def step(self):
        for m in range(self.N):                                           # one inner step on every replica
            g = self.grad(m)
            self.u[m] = self.mu * self.u[m] - self.eta * (self.lam * self.mask * self.x[m] + g)
            self.x[m] = self.x[m] + self.u[m]
        self.t += 1
        if self.t % self.k:
            return
        delta = [self.theta[m] - self.x[m] for m in range(self.N)]        # outer gradients, async-sent
        avg = sum(delta) / self.N                                         # their all-reduce, received next time
        self.received = self.received - self.avg_prev                     # block-receive Delta^(t-1)
        for m in range(self.N):
            eager_delta = delta[m] / self.N + (self.avg_prev - self.delta_prev[m] / self.N)
            self.theta[m] = self.theta[m] - eager_delta                   # OuterOpt: SGD, lr 1
            self.x[m] = self.theta[m].copy()                              # the next inner phase starts there
        self.delta_prev, self.avg_prev = delta, avg

    def final_model(self):
        """Every outer gradient applied with weight 1/N (the last all-reduce received), plus the mean of the
        replicas' progress in the current inner phase."""
        return self.received - self.avg_prev + sum(self.x[m] - self.theta[m] for m in range(self.N)) / self.N


def close(a, b, what):
    scale = max(1.0, float(np.abs(b).max()))
    assert np.abs(a - b).max() <= 1e-11 * scale, f"{what}: max |diff| {np.abs(a - b).max():.3g}"


@pytest.mark.parametrize("N", [1, 2, 4])
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("extra", [0, 1])          # training ends on a period's end, or one iteration into one
def test_the_twin_is_the_papers_algorithm(N, k, extra):
    cfg = AlgoConfig(algo="ssd", comm="period", period_rule=RULE, delay=k, warmup_steps=0, lr=0.1,
                     weight_decay=1e-3)
    batch = batches(N)
    sim = Simulation(cfg, factory, batch, N)
    paper = PaperAlgorithm3(cfg.validate(N), N, batch)
    steps = 6 * k + extra                                                  # six outer steps
    for t in range(steps):
        sim.step()
        paper.step()
        for r in range(N):
            close(sim.L[r], paper.x[r], f"L[{r}] at t={t}")
            if (t + 1) % k == 0:
                close(sim.S[r], paper.theta[r], f"S[{r}] (the outer model) at t={t}")
        if (t + 1) % k == 0:                                               # W: every average received
            close(sim.W, paper.received, f"W at t={t}")
    assert sim.s == (steps // k - 1) * k                                   # the last sum is still in flight
    sim.finalize()
    close(sim.W, paper.final_model(), "W after finalize")
    assert float(np.abs(sim.W - factory().params).max()) > 1e-3            # it trained


def test_W_changes_only_at_a_period_end_from_the_second_on():
    """The first period end has nothing in flight; every later one adds the previous period's mean."""
    N, k, T_w = 2, 3, 2
    cfg = AlgoConfig(algo="ssd", comm="period", period_rule=RULE, delay=k, warmup_steps=T_w, lr=0.1)
    sim = Simulation(cfg, factory, batches(N, seed=1), N)
    for _ in range(T_w):
        sim.step()
    changed = []
    for t in range(T_w, T_w + 5 * k):
        W, s = sim.W.copy(), sim.s
        sim.step()
        if not np.array_equal(sim.W, W):
            changed.append(t - T_w)
            assert sim.s == s + k
    assert changed == [2 * k - 1, 3 * k - 1, 4 * k - 1, 5 * k - 1]


# --- the fused pass --------------------------------------------------------------------------------

def unfused(W, L, S, D, n):
    np.subtract(L, S, out=D)
    L[...] = W + D / n
    S[...] = L


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_fused_pass_gives_the_unfused_bits(dtype, n):
    size = SMALL // np.dtype(dtype).itemsize * 5 + 3                       # six blocks, the last one short
    mask = np.ones(size, dtype)
    W, L, S = data(np.random.default_rng(n), size, dtype, 3)
    ref = [a.copy() for a in (W, L, S)] + [np.empty(size, dtype)]
    D = np.empty(size, dtype)
    with np.errstate(all="ignore"):
        eager.post_eager(fused.Plan((mask,), 0, SMALL), W, L, S, D, n)
        unfused(*ref, n)
    assert all(same_bits(a, b) for a, b in zip((W, L, S, D), ref))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gpu_kernel_body_gives_the_unfused_bits(fake_gpu, dtype):  # noqa: F811 (the fixture)
    size = 300
    W, L, S = data(np.random.default_rng(9), size, dtype, 3)
    ref = [a.copy() for a in (W, L, S)] + [np.empty(size, dtype)]
    D = np.empty(size, dtype)
    plan = fused.Plan((np.ones(size, dtype),), 0, device=True)
    with np.errstate(all="ignore"):
        eager.post_eager(plan, W, L, S, D, 3)
        unfused(*ref, 3)
    assert "ssdmpi_post_eager" in fused._built
    assert all(same_bits(a, b) for a, b in zip((W, L, S, D), ref))


# --- the linear map --------------------------------------------------------------------------------

MU = 0.9
MAP = registry.RULES[RULE].linear_map


@pytest.mark.parametrize("N", [2, 3, 4])
@pytest.mark.parametrize("k", [2, 5, 10])
def test_the_map_is_delta_own_restarting_from_W_plus_D_over_N(N, k):
    x = stability.grid(0.005, 3.0, 0.05)
    damp = stability.LinearMap(lambda x, k, N, mu: stability.DAMP.build(x, k, N, mu, damping=1.0 / N))
    a = stability.spectral_radius(stability.period_map(MAP, x, k, N))
    b = stability.spectral_radius(stability.period_map(damp, x, k, N))
    assert np.abs(a - b).max() < 1e-9


def simulate(x, k, N, periods=3000):
    """The paper's form on one scalar weight per replica (loss ``h w^2/2``, ``eta h = x``, no noise): the
    largest magnitude in the state after each outer step. Start: every replica at 1, velocities apart."""
    theta = [1.0] * N
    w = list(theta)
    u = [0.1 * (r + 1) * (-1) ** r for r in range(N)]
    delta_prev, avg_prev = [0.0] * N, 0.0
    out = []
    for _ in range(periods):
        for _ in range(k):
            for r in range(N):
                u[r] = MU * u[r] - x * w[r]
                w[r] = w[r] + u[r]
        delta = [theta[r] - w[r] for r in range(N)]
        avg = sum(delta) / N
        for r in range(N):
            theta[r] -= delta[r] / N + (avg_prev - delta_prev[r] / N)
        w = list(theta)
        delta_prev, avg_prev = delta, avg
        out.append(max(abs(v) for v in theta + u))
    return out


# Just above a threshold the growth per period is small where the threshold is: 20000 periods there.
@pytest.mark.parametrize("N,k,periods", [(2, 2, 20000), (2, 5, 20000), (2, 10, 3000), (2, 20, 3000), (4, 5, 20000),
                                         (4, 32, 3000)])
def test_bounded_below_the_threshold_and_growing_above(N, k, periods):
    x = stability.threshold(MAP, k, N=N)
    assert 0 < x < stability.X_MAX
    below, above = simulate(x / 1.01, k, N, periods), simulate(x * 1.01, k, N, periods)
    assert max(below[-100:]) < 1.0, (N, k, x, below[-1])
    assert not above[-1] < 100.0, (N, k, x, above[-1])                     # grown (or overflowed)


def test_the_figures_the_docs_quote():
    """docs/ALGORITHM.md section 13 and docs/PERIOD_RULE.md section 9 (momentum 0.9)."""
    figures = {2: (0.114, 0.088, 0.0808, 1.54, 3.1, 3.52), 4: (0.0724, 0.0523, 0.0365, 0.0265, 0.0238, 2.36)}
    for N, row in figures.items():
        for k, ref in zip((2, 3, 5, 10, 20, 32), row):
            assert float(f"{stability.threshold(MAP, k, N=N):.3g}") == ref, (N, k)     # as the tables round


# --- what a run may combine it with ----------------------------------------------------------------

@pytest.mark.parametrize("settings, message", [
    (dict(delay="auto"), "--delay auto"),
    (dict(merge_delay=2), "--merge-delay"),
    (dict(local_update="sgd"), "--local-update"),
])
def test_settings_it_does_not_take_are_refused(settings, message):
    with pytest.raises(UserError, match=message):
        AlgoConfig(algo="ssd", comm="period", period_rule=RULE, warmup_steps=20, **settings).validate(2)


def test_it_is_not_the_default_and_runs_adamw():
    assert registry.RULES[RULE].default is False and registry.RULES["delta-merge"].default
    cfg = AlgoConfig(algo="ssd", comm="period", period_rule=RULE, delay=2, warmup_steps=1, optimizer="adamw",
                     lr=0.01)
    sim = Simulation(cfg, factory, batches(2, seed=2), 2)
    for _ in range(7):
        sim.step()
    assert sim.s == 1 + 2 * 2 and all(U["count"] == 7 for U in sim.U)
