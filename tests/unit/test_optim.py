"""The optimizers of ALGORITHM.md sections 3 and 4 against independent oracles.

- the global update against PyTorch's SGD (momentum, weight decay on the decay group only;
  skipped without torch), against one step computed by hand and against the closed form of
  momentum SGD with a constant gradient (both without torch);
- the local updates against the spec's formulas written literally in float64
  (another rounding order, so allclose, not bitwise);
- no update allocates a buffer of the weights' size per step (tracemalloc, which NumPy
  reports its array allocations to).
"""

import tracemalloc

import numpy as np
import pytest

from ssdmpi import backend
from ssdmpi.optim import GlobalMomentumLocal, GLUPaper, MomentumSGD, OptState, PlainLocalSGD, make_local_update

N_PARAMS = 50


def problem(seed=0):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=N_PARAMS)
    mask = (rng.random(N_PARAMS) < 0.7).astype(np.float64)      # ~70% "weights", rest "biases"
    grads = [rng.normal(size=N_PARAMS) for _ in range(12)]
    return W, mask, grads


@pytest.mark.parametrize("mu,lam", [(0.9, 1e-4), (0.0, 0.0), (0.5, 0.1)])
def test_global_update_equals_pytorch_sgd(mu, lam):
    """Section 3 with constant eta == torch.optim.SGD(momentum=mu) with weight decay on the mask group."""
    torch = pytest.importorskip("torch", reason="PyTorch is this test's oracle (pip install torch==2.13.0)")
    W, mask, grads = problem()
    lr = 0.1
    M = np.zeros_like(W)
    opt = MomentumSGD(mask, mu, lam)
    dec, nodec = mask == 1, mask == 0
    p_dec = torch.tensor(W[dec], requires_grad=True)
    p_nod = torch.tensor(W[nodec], requires_grad=True)
    topt = torch.optim.SGD([{"params": [p_dec], "weight_decay": lam}, {"params": [p_nod], "weight_decay": 0.0}],
                           lr=lr, momentum=mu)
    W = W.copy()
    for G in grads:
        opt.update(W, OptState(velocity=M), G, lr)
        p_dec.grad, p_nod.grad = torch.tensor(G[dec]), torch.tensor(G[nodec])
        topt.step()
    np.testing.assert_allclose(W[dec], p_dec.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(W[nodec], p_nod.detach().numpy(), rtol=1e-12, atol=1e-13)


def test_global_update_one_step_by_hand():
    W = np.array([1.0, 2.0, -1.0])
    M = np.array([0.5, 0.0, 1.0])
    mask = np.array([1.0, 0.0, 1.0])
    G = np.array([0.1, 0.2, 0.3])
    MomentumSGD(mask, 0.9, 0.01).update(W, OptState(velocity=M), G, 0.5)
    # M = 0.9*M - 0.5*(0.01*mask*W + G)
    expected_M = np.array([0.45 - 0.5 * (0.01 + 0.1), -0.5 * 0.2, 0.9 - 0.5 * (-0.01 + 0.3)])
    np.testing.assert_allclose(M, expected_M, rtol=1e-15)
    np.testing.assert_allclose(W, np.array([1.0, 2.0, -1.0]) + expected_M, rtol=1e-15)


@pytest.mark.parametrize("mu", [0.0, 0.9])
def test_global_update_with_a_constant_gradient_follows_the_closed_form(mu):
    """lam = 0, constant G and eta: M_t = -eta*G*(1 - mu^t)/(1 - mu), W_t = W_0 + M_1 + ... + M_t."""
    W0, mask, grads = problem(7)
    G, lr, steps = grads[0], 0.05, 20
    W, M = W0.copy(), np.zeros(N_PARAMS)
    opt = MomentumSGD(mask, mu, 0.0)
    for _ in range(steps):
        opt.update(W, OptState(velocity=M), G, lr)
    t = np.arange(1, steps + 1)
    factors = (1 - mu ** t) / (1 - mu)                  # M_t = -lr * G * factors[t-1]
    np.testing.assert_allclose(M, -lr * G * factors[-1], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(W, W0 - lr * G * factors.sum(), rtol=1e-12, atol=1e-14)


def test_global_momentum_local_update_is_section_4b():
    W, mask, grads = problem(1)
    rng = np.random.default_rng(5)
    M = rng.normal(size=N_PARAMS) * 0.1
    M_before = M.copy()
    L = W.copy()
    upd = GlobalMomentumLocal(MomentumSGD(mask, 0.9, 1e-3), OptState(velocity=M))
    for m, g in enumerate(grads):
        expected = L + 0.9 * M - 0.05 * (g + 1e-3 * mask * L)
        upd.step(L, g, m, 0.05)
        np.testing.assert_allclose(L, expected, rtol=1e-14, atol=1e-15)
    assert np.array_equal(M, M_before), "the local update must not write the global momentum"


def test_plain_local_sgd_is_section_4c():
    W, mask, grads = problem(2)
    N, lam, eta_l = 4, 1e-3, 0.2
    L = W.copy()
    upd = PlainLocalSGD(N, lam, mask)
    for m, g in enumerate(grads):
        expected = L - eta_l * (g / N + lam * mask * L)     # gbar = g/(B*N) = (mean gradient)/N
        upd.step(L, g, m, eta_l)
        np.testing.assert_allclose(L, expected, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("k", [1, 3])
def test_glu_paper_is_section_4a_with_snapshot_before_the_update(k):
    W, mask, grads = problem(3)
    N, lam, C, eta_l = 2, 1e-2, 12.0, 0.1
    L = W.copy()
    upd = GLUPaper(N, k, C, lam, mask)
    upd.begin(L)
    P = L.copy()                                    # ssdmpi choice: P <- L at the switch
    for m, g in enumerate(grads):
        snap = m % k == 0
        lam_vec = lam * mask                        # decay only where the mask is 1, in both places
        Gs = ((1 - eta_l * lam_vec) * P - L) / C
        f = 1.0 if snap else 0.5
        delta = -eta_l * f * (2 * (g / N) + lam_vec * L + 0.5 * Gs)
        if snap:
            P = L.copy()                            # BEFORE adding Delta
        expected = L + delta
        upd.step(L, g, m, eta_l)
        np.testing.assert_allclose(L, expected, rtol=1e-13, atol=1e-14)
        np.testing.assert_array_equal(upd.P, P)


def test_glu_state_round_trip():
    W, mask, grads = problem(4)
    a, b = GLUPaper(2, 3, 12.0, 1e-4, mask), GLUPaper(2, 3, 12.0, 1e-4, mask)
    La, Lb = W.copy(), None
    a.begin(La)
    for m, g in enumerate(grads[:4]):
        a.step(La, g, m, 0.1)
    b.load_state_dict({k: v.copy() for k, v in a.state_dict().items()})
    Lb = La.copy()
    for m, g in enumerate(grads[4:], start=4):
        a.step(La, g, m, 0.1)
        b.step(Lb, g, m, 0.1)
    assert np.array_equal(La, Lb)


def test_make_local_update_rejects_unknown_names():
    mask = np.ones(3)
    with pytest.raises(ValueError):
        make_local_update("adam", optimizer=MomentumSGD(mask, 0.9, 0.0), global_state=OptState(velocity=np.zeros(3)),
                          world_size=1, delay=1, weight_decay=0.0, glu_divisor=12.0, decay_mask=mask)


ALLOC_PARAMS = 1 << 18          # float32: 1 MiB per buffer, far above the interpreter's own allocations


def traced_peak(fn) -> int:
    """Peak bytes allocated (tracemalloc) while ``fn()`` runs, above what was allocated before."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def hot_path_steps():
    """name -> a zero-argument step of each update on float32 buffers of ALLOC_PARAMS (state kept across calls)."""
    rng = np.random.default_rng(5)
    W, M, g = (rng.standard_normal(ALLOC_PARAMS, dtype=np.float32) for _ in range(3))
    mask = (rng.random(ALLOC_PARAMS) < 0.7).astype(np.float32)
    sgd = MomentumSGD(mask, 0.9, 1e-4)
    local = {"global-momentum": GlobalMomentumLocal(MomentumSGD(mask, 0.9, 1e-4), OptState(velocity=M)),
             "sgd": PlainLocalSGD(2, 1e-4, mask), "glu-paper": GLUPaper(2, 2, 12.0, 1e-4, mask)}
    local["glu-paper"].begin(W)
    counter = iter(range(10**6))       # m: GLU alternates snapshot and non-snapshot steps
    steps = {"momentum-sgd": lambda: sgd.update(W, OptState(velocity=M), g, 0.1)}
    for name, upd in local.items():
        steps[name] = lambda upd=upd: upd.step(W, g, next(counter), 0.1)
    return steps


@pytest.mark.parametrize("name", ["momentum-sgd", "global-momentum", "glu-paper", "sgd"])
def test_a_step_allocates_no_buffer_of_the_weights_size(name):
    """The hot path works in place in scratch buffers allocated once (float32, as in training)."""
    step = hot_path_steps()[name]
    step()                                           # warm-up: anything lazily set up on first use
    peak = max(traced_peak(step) for _ in range(2))  # GLU: a snapshot step and a plain one
    assert peak < ALLOC_PARAMS * 4 // 8, f"{name}: {peak} bytes allocated during one step"


def test_the_allocation_check_sees_one_temporary(monkeypatch):
    """The check above can fail: a step with one float32 temporary of the weights' size is caught."""
    def allocating_step(self, W, state, G, lr, divisor=None):
        M = state["velocity"]
        tmp = W * self._decay                        # a new array, as a careless rewrite would make
        tmp += G
        tmp *= lr
        M *= self.mu
        M -= tmp
        W += M

    monkeypatch.setattr(MomentumSGD, "update", allocating_step)
    step = hot_path_steps()["momentum-sgd"]
    step()
    assert traced_peak(step) >= ALLOC_PARAMS * 4


def test_cupy_matches_numpy():
    """The same updates on a GPU (CuPy) give the NumPy numbers (when a GPU is usable)."""
    cupy, why = backend.probe_cupy()
    if cupy is None:
        pytest.skip(why)
    W, mask, grads = problem(6)
    outs = []
    for xp in (np, cupy):
        Wx, Mx, mx = xp.asarray(W), xp.zeros(N_PARAMS), xp.asarray(mask)
        sgd, glu = MomentumSGD(mx, 0.9, 1e-3), GLUPaper(2, 3, 12.0, 1e-3, mx)
        Lx = Wx.copy()
        glu.begin(Lx)
        for m, g in enumerate(grads):
            gx = xp.asarray(g)
            sgd.update(Wx, OptState(velocity=Mx), gx, 0.1)
            glu.step(Lx, gx, m, 0.1)
        outs.append((backend.to_host(Wx), backend.to_host(Lx)))
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-12)
    np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-12)
