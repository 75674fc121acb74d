"""The outer optimizer (ssdmpi/optim/outer.py) against its formula, written out here, and against
``torch.optim.SGD`` (nesterov and heavy-ball); the reference simulator's twin against the same formula at
the merges of localsgd and delta-merge; where its settings apply and the one-line refusals elsewhere."""

import numpy as np
import pytest

from ssdmpi.algos import AlgoConfig, registry
from ssdmpi.algos.resize import merge_displacements
from ssdmpi.nn import build_model
from ssdmpi.optim import fused
from ssdmpi.optim.outer import OuterOptimizer, build, describe
from ssdmpi.verify.reference import Simulation
from tests.conftest import assert_one_line_error, run_cli
from tests.unit.test_fused import fake_gpu  # noqa: F401 (the fixture: CuPy's kernels run by NumPy)

FEATURES, CLASSES = 10, 3
KINDS = [(True, 0.7, 0.9), (False, 0.5, 0.8), (True, 1.3, 0.0)]     # (nesterov, lr, momentum)


def formula(W, b, g, nesterov, lr, mu):
    """One ``torch.optim.SGD`` step (dampening 0, no weight decay) on the pseudo-gradient ``g``, its
    documented form: ``b <- mu*b + g``; ``W <- W - lr*(g + mu*b)`` (nesterov) or ``W - lr*b``."""
    b = mu * b + g
    return W - lr * ((g + mu * b) if nesterov else b), b


def arrays(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=n).astype(dtype) for _ in range(3)]


def blocks(count, dtype) -> int:
    """A size of ``count`` of the fused passes' blocks and a ragged piece of one more."""
    return count * fused.BLOCK_BYTES // np.dtype(dtype).itemsize + 5


SIZE = {dtype: blocks(3, dtype) for dtype in (np.float64, np.float32)}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("nesterov, lr, mu", KINDS)
@pytest.mark.parametrize("n", [None, 1, 3])
def test_the_displacement_step_is_the_formula_bit_for_bit(dtype, nesterov, lr, mu, n):
    """``step(W, b, R, n)``: the sum ``R`` over ``n`` ranks made the mean in place, the pseudo-gradient its
    negative; three steps in a row, over every block of the pass."""
    size = SIZE[dtype]
    W, b, _ = arrays(size, dtype)
    opt = OuterOptimizer(np.ones(size, dtype), nesterov, lr, mu)
    for step in range(3):
        R = arrays(size, dtype, seed=step + 1)[0]
        mean = R / n if n not in (None, 1) else R.copy()
        want_W, want_b = formula(W, b, -mean, nesterov, lr, mu)
        opt.step(W, b, R, n)
        assert np.array_equal(R, mean) and np.array_equal(W, want_W) and np.array_equal(b, want_b), step
        host_W, host_b = opt.host_step(want_W, want_b, mean)          # the host form: the same bits
        opt.step(want_W, want_b, mean.copy())
        assert np.array_equal(host_W, want_W) and np.array_equal(host_b, want_b)
        W, b = host_W, host_b


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("nesterov, lr, mu", KINDS)
def test_the_gpu_kernels_are_the_formula_bit_for_bit(fake_gpu, dtype, nesterov, lr, mu):  # noqa: F811
    """Each CuPy kernel, statement by statement in the buffers' dtype, gives the formula's bits (and so the
    NumPy passes')."""
    size = 300
    W, b, _ = arrays(size, dtype)
    Wa, ba = W.copy(), b.copy()
    opt = OuterOptimizer(np.ones(size, dtype), nesterov, lr, mu)
    opt._plan = fused.Plan((np.ones(size, dtype),), 2, device=True)     # the buffers as if on a GPU
    for step in range(3):
        R, L, _ = arrays(size, dtype, seed=step + 1)
        mean = R / 2
        want_W, want_b = formula(W, b, -mean, nesterov, lr, mu)
        opt.step(W, b, R, 2)
        assert np.array_equal(W, want_W) and np.array_equal(b, want_b) and np.array_equal(R, mean)
        want_W, want_b = formula(Wa, ba, Wa - L / 3, nesterov, lr, mu)
        opt.average_step(Wa, ba, L, 3)
        assert np.array_equal(Wa, want_W) and np.array_equal(ba, want_b) and np.array_equal(L, Wa)
    assert set(fused._built) == {"ssdmpi_outer_step", "ssdmpi_outer_average_step"}


def test_a_long_pass_calls_the_progress_hook():
    """The passes poke an allreduce in flight every ``fused.POLL_BLOCKS`` blocks, as the inner updates do."""
    size = blocks(2 * fused.POLL_BLOCKS, np.float32)
    W, b, R = arrays(size, np.float32)
    polls = []
    opt = OuterOptimizer(np.ones(size, np.float32), True, 0.7, 0.9)
    opt.poll = lambda: polls.append(1)
    opt.step(W, b, R, 2)
    opt.average_step(W, b, R, 2)
    assert len(polls) == 4


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("nesterov, lr, mu", KINDS)
@pytest.mark.parametrize("n", [1, 4])
def test_the_average_step_is_the_formula_bit_for_bit(dtype, nesterov, lr, mu, n):
    """``average_step(W, b, L, n)``: ``L`` the sum of ``n`` ranks' models, the pseudo-gradient ``W - L/n``;
    afterwards ``L = W``."""
    size = SIZE[dtype]
    W, b, _ = arrays(size, dtype)
    opt = OuterOptimizer(np.ones(size, dtype), nesterov, lr, mu)
    for step in range(3):
        L = arrays(size, dtype, seed=step + 1)[0]
        want_W, want_b = formula(W, b, W - L / n, nesterov, lr, mu)
        opt.average_step(W, b, L, n)
        assert np.array_equal(W, want_W) and np.array_equal(b, want_b) and np.array_equal(L, W), step


@pytest.mark.parametrize("nesterov, lr, mu", KINDS)
def test_the_step_is_torch_sgd_on_the_pseudo_gradient(nesterov, lr, mu):
    """Against ``torch.optim.SGD(momentum=mu, nesterov=...)`` with the pseudo-gradient as ``.grad``, five steps
    in float64 (PyTorch may fuse a multiply-add: equal to 1e-12, not bitwise), both forms. Nesterov without
    momentum is plain SGD (PyTorch refuses the combination)."""
    torch = pytest.importorskip("torch")
    size = 1000
    W0 = arrays(size, np.float64)[0]
    p = torch.nn.Parameter(torch.tensor(W0.copy()))
    sgd = torch.optim.SGD([p], lr=lr, momentum=mu, nesterov=nesterov and mu > 0)
    opt = OuterOptimizer(np.ones(size), nesterov, lr, mu)
    W, b = W0.copy(), np.zeros(size)
    Wa, ba = W0.copy(), np.zeros(size)
    for step in range(5):
        mean_model = W + 0.01 * arrays(size, np.float64, seed=step + 1)[0]
        g = W - mean_model                                # what torchft's DiLoCo sets as the gradient
        p.grad = torch.tensor(g.copy())
        sgd.step()
        opt.step(W, b, -g)                                # from the mean displacement
        opt.average_step(Wa, ba, mean_model * 3.0, 3)     # from the sum of 3 ranks' models
        want = p.detach().numpy()
        np.testing.assert_allclose(W, want, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(Wa, want, rtol=1e-12, atol=1e-12)
        if mu:
            np.testing.assert_allclose(b, sgd.state[p]["momentum_buffer"].numpy(), rtol=1e-12, atol=1e-14)


def test_lr_1_momentum_0_is_no_outer_optimizer():
    """The identity (either kind) and a run where the settings do not apply build nothing: the algorithms
    then run their plain average (tests/mpi/test_outer.py checks it bit for bit)."""
    mask = np.ones(4)
    for kind in ("sgd", "nesterov"):
        assert build(AlgoConfig(algo="localsgd", outer_optimizer=kind).validate(2), mask) is None
    assert build(AlgoConfig(algo="ssgd").validate(2), mask) is None
    assert build(AlgoConfig(algo="localsgd", outer_lr=1.0, outer_momentum=0.5).validate(2), mask) is not None
    assert describe({"outer_optimizer": "nesterov", "outer_lr": 1.0, "outer_momentum": 0.0}) == ""
    assert describe({"algo": "localsgd"}) == ""
    assert describe({"outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9}) == \
        ", outer nesterov lr 0.7 momentum 0.9"


def test_ckpt_inspect_names_the_outer_step():
    """``ckpt inspect``'s words for an algorithm (its spec's ``inspect``) name a non-plain outer step."""
    cfg = {"algo": "localsgd", "delay": 5, "outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9}
    assert registry.ALGORITHMS["localsgd"].inspect(cfg) == "k=5, outer nesterov lr 0.7 momentum 0.9"
    assert registry.ALGORITHMS["ssd"].inspect({**cfg, "algo": "ssd", "comm": "period"}) == \
        "comm period, k=5, outer nesterov lr 0.7 momentum 0.9"
    assert registry.ALGORITHMS["localsgd"].inspect({"delay": 5}) == "k=5"


def test_a_resize_merges_through_the_outer_step():
    """On another number of ranks delta-merge's held mean and the partial period's mean displacement are
    merged through the outer step in turn (the formula), the buffer advanced; without one, added."""
    rng = np.random.default_rng(0)
    W, Rp, L, S, b = (rng.normal(size=6) for _ in range(5))
    state = {"W": W, "period.has_Rp": 1, "period.Rp": Rp, "L": L, "period.S": S, "s": 10, "outer.momentum": b}
    opt = OuterOptimizer(np.ones(6), True, 0.7, 0.9)

    def outer(W, mean):
        W, state["outer.momentum"] = opt.host_step(W, state["outer.momentum"], mean)
        return W

    merge_displacements(state, 5, outer)
    W1, b1 = formula(W, b, -Rp, True, 0.7, 0.9)
    W2, b2 = formula(W1, b1, -(L - S), True, 0.7, 0.9)
    np.testing.assert_allclose(state["W"], W2, rtol=1e-14)
    np.testing.assert_allclose(state["outer.momentum"], b2, rtol=1e-14)
    assert state["s"] == 15 and state["period.has_Rp"] == 0 and np.array_equal(state["L"], state["W"])
    plain = {"W": W, "period.has_Rp": 1, "period.Rp": Rp, "L": L, "period.S": S, "s": 10}
    merge_displacements(plain, 5)
    np.testing.assert_allclose(plain["W"], W + Rp + (L - S), rtol=1e-14)


# --- the reference twin against the formula ---------------------------------------------------------

def factory():
    return build_model("mlp", (FEATURES,), CLASSES, widths=(8,), dtype=np.float64, seed=1)


def worker_batches(N, B=4, n=192):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, FEATURES)), rng.integers(0, CLASSES, size=n)

    def batches(r, t):
        at = ((t * N + r) * B) % (n - B)
        return x[at:at + B], y[at:at + B]
    return batches


@pytest.mark.parametrize("nesterov, lr, mu", KINDS[:2])
def test_the_twin_of_localsgd_takes_the_outer_step_from_the_start_of_the_period(nesterov, lr, mu):
    """At each period end every worker's last local step is taken here by hand (momentum SGD), and the
    simulator's new W is the formula's step from the W the period started from with the pseudo-gradient
    ``W - mean_r L_r``; every L is that W; in between W and the buffer do not move."""
    N, k, T_w = 3, 3, 2
    batches = worker_batches(N)
    cfg = AlgoConfig(algo="localsgd", delay=k, warmup_steps=T_w, lr=0.05,
                     outer_optimizer="nesterov" if nesterov else "sgd", outer_lr=lr, outer_momentum=mu)
    sim = Simulation(cfg, factory, batches, N)
    probe = factory()
    mom, lam, mask = sim.cfg.momentum, sim.cfg.weight_decay, np.asarray(probe.flat.decay_mask())
    for _ in range(T_w):
        sim.step()
    b, checked = np.zeros_like(sim.W), 0
    for m in range(4 * k):
        W0, eta = sim.W.copy(), sim.sched(sim.t)
        ends = []
        for r in range(N):
            probe.params[...] = sim.L[r]
            probe.loss_and_grad(*batches(r, sim.t))
            V = mom * sim.V[r] - eta * (lam * (mask * sim.L[r]) + np.array(probe.grads))
            ends.append(sim.L[r] + V)
        sim.step()
        if (m + 1) % k == 0:
            want, b = formula(W0, b, W0 - sum(ends) / N, nesterov, lr, mu)
            np.testing.assert_allclose(sim.W, want, rtol=1e-12, atol=1e-13)
            np.testing.assert_allclose(sim.B, b, rtol=1e-12, atol=1e-13)
            assert all(np.array_equal(L, sim.W) for L in sim.L)
            checked += 1
        else:
            assert np.array_equal(sim.W, W0) and np.allclose(sim.B, b, rtol=0, atol=1e-13)
    assert checked == 4


@pytest.mark.parametrize("k, d", [(4, 1), (4, 3), (3, 3)])
def test_the_twin_of_delta_merge_steps_w_at_each_merge_and_keeps_the_invariant(k, d):
    """W moves exactly at the merges, by the formula's step from the mean posted ``d`` iterations before
    (pseudo-gradient its negative), the buffer with it; after every iteration every rank's own progress
    is still on top: ``mean_r L_r = W + (the mean in flight) + mean_r (L_r - S_r)``."""
    N, T_w = 3, 2
    nesterov, lr, mu = KINDS[0]
    sim = Simulation(AlgoConfig(algo="ssd", comm="period", period_rule="delta-merge", delay=k, merge_delay=d,
                                warmup_steps=T_w, lr=0.05, outer_optimizer="nesterov", outer_lr=lr,
                                outer_momentum=mu), factory, worker_batches(N), N)
    for _ in range(T_w):
        sim.step()
    b, posted, merges = np.zeros_like(sim.W), None, 0
    for m in range(5 * k + d - 1):
        W0 = sim.W.copy()
        sim.step()
        if m + 1 - d >= k and (m + 1 - d) % k == 0:
            want, b = formula(W0, b, -posted, nesterov, lr, mu)
            np.testing.assert_allclose(sim.W, want, rtol=1e-12, atol=1e-13)
            np.testing.assert_allclose(sim.B, b, rtol=1e-12, atol=1e-13)
            merges += 1
        else:
            assert np.array_equal(sim.W, W0)
        if (m + 1) % k == 0:
            posted = sim.pending
        inflight = 0 if sim.pending is None else sim.pending
        np.testing.assert_allclose(sum(sim.L) / N, sim.W + inflight + sum(L - S for L, S in zip(sim.L, sim.S)) / N,
                                   rtol=1e-12, atol=1e-13)
    assert merges == 4


# --- where the settings apply ------------------------------------------------------------------------

def test_the_settings_apply_to_localsgd_delta_merge_and_delta_own_only():
    applies = {name: registry.resolve({"warmup_steps": 1, **values}, 2).outer_lr
               for name, values in {"localsgd": {"algo": "localsgd"}, "delta-merge": {"algo": "ssd"},
                                    "delta-own": {"algo": "ssd", "period_rule": "delta-own"},
                                    "replay": {"algo": "ssd", "period_rule": "replay"},
                                    "step": {"algo": "ssd", "comm": "step"}, "odsgd": {"algo": "odsgd"},
                                    "ssgd": {"algo": "ssgd"}}.items()}
    assert applies == {"localsgd": 1.0, "delta-merge": 1.0, "delta-own": 1.0, "replay": None, "step": None,
                       "odsgd": None, "ssgd": None}


REFUSED = [
    (["--algo", "ssgd", "--outer-lr", "0.7"], "--outer-lr applies only to --algo ssd --comm period --period-rule "
     "delta-merge or delta-own, or --algo localsgd; drop it"),
    (["--comm", "period", "--period-rule", "replay", "--outer-momentum", "0.9"],
     "--outer-momentum applies only to --algo ssd --comm period --period-rule delta-merge or delta-own, or --algo "
     "localsgd; drop it"),
    (["--comm", "step", "--outer-optimizer", "nesterov"], "--outer-optimizer applies only to"),
    (["--delay", "auto", "--warmup-steps", "10", "--outer-lr", "0.7"], "--delay auto chooses k and the merge delay"),
    (["--algo", "localsgd", "--outer-lr", "0"], "--outer-lr must be > 0.0, got 0"),
    (["--algo", "localsgd", "--outer-momentum", "1"], "--outer-momentum must be < 1.0"),
]


@pytest.mark.parametrize("argv, message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_setting_where_it_means_nothing_is_one_line(argv, message):
    assert_one_line_error(run_cli(["train", "--steps", "1"] + argv), message)


def test_a_bad_outer_optimizer_is_refused_by_the_parser():
    result = run_cli(["train", "--steps", "1", "--algo", "localsgd", "--outer-optimizer", "adam"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--outer-optimizer" in result.stderr and "nesterov" in result.stderr
