"""The fused updates (ssdmpi/optim/fused.py) against the unfused forms, bit for bit.

Oracle: the ``unfused_*`` functions of ssdmpi/verify/fused_bench.py, the updates as written before
fusing (one whole-buffer NumPy operation each). Checked on the CPU blocks (float32 and float64, sizes
below, at and around the block size, masks whose runs start and end inside blocks, inf/NaN/signed
zeros in the data) and, with no GPU, through a fake CuPy whose ElementwiseKernel runs the kernel's
C body statement by statement in NumPy: that checks the body's operation order and argument order.
"""

import re

import numpy as np
import pytest

from ssdmpi import backend
from ssdmpi.optim import GlobalMomentumLocal, GLUPaper, MomentumSGD, OptState, PlainLocalSGD, fused
from ssdmpi.verify import fused_bench as old

DTYPES = (np.float32, np.float64)
LR, LAM, MU, N, C = 0.05, 3e-3, 0.9, 3, 12.0
SMALL = 64                                  # bytes: 16 float32 / 8 float64 elements per block


def same_bits(a, b) -> bool:
    u = np.dtype(f"u{a.dtype.itemsize}")
    return a.dtype == b.dtype and np.array_equal(np.asarray(a).view(u), np.asarray(b).view(u))


def layer_mask(n, dtype, rng):
    """Runs of 1 (weights) and 0 (biases) of random lengths, like a model's flat decay mask."""
    mask = np.zeros(n, dtype)
    i, on = 0, True
    while i < n:
        run = int(rng.integers(1, 40))
        mask[i:i + run] = on
        i, on = i + run, not on
    return mask


def data(rng, n, dtype, k):
    """``k`` arrays of normal values with inf, -inf, NaN, 0 and -0 sprinkled in."""
    arrs = [rng.standard_normal(n).astype(dtype) for _ in range(k)]
    for a in arrs:
        if n >= 8:
            a[rng.choice(n, 5, replace=False)] = [np.inf, -np.inf, np.nan, 0.0, -0.0]
    return arrs


def run(kind, n, dtype, mask, block_bytes=SMALL, device=None, steps=4, seed=0, dev=np.copy):
    """State arrays after ``steps`` updates of ``kind``: ``(unfused, fused)``, both on the host.

    The unfused side runs on NumPy arrays; the fused side on ``dev(array)`` copies (CuPy for a GPU).
    """
    rng = np.random.default_rng(seed)
    decay = mask * LAM
    a, b, c = (np.empty(n, dtype) for _ in range(3))
    g, Mr, Wg = data(rng, n, dtype, 3)
    dg, dMr, dWg, dmask, ddecay = (dev(x) for x in (g, Mr, Wg, mask, decay))
    states = {"momentum": 2, "global-momentum": 1, "sgd": 1, "glu": 2, "delta-own": 4, "momentum-sum": 3,
              "add-divided": 2, "divide-copy": 2, "merge-restart": 2}[kind]
    h = data(rng, n, dtype, states)                 # unfused state; d: the fused twin
    d = [dev(x) for x in h]
    consts = {"glu": (dmask, ddecay), "delta-own": (dmask,)}.get(kind, (ddecay,))
    plan = fused.Plan(consts, 3, block_bytes, device)
    for s in range(steps):
        lr = LR / (s + 1)
        if kind == "momentum":
            old.unfused_momentum_sgd(*h, g, decay, lr, MU, a)
            fused.momentum_sgd(plan, *d, dg, lr, MU)
        elif kind == "global-momentum":
            old.unfused_momentum_sgd_read_only(*h, g, Mr, decay, lr, MU, a, b)
            fused.momentum_sgd_read_only(plan, *d, dg, dMr, lr, MU)
        elif kind == "sgd":
            old.unfused_plain_local_sgd(*h, g, decay, lr, N, a, b)
            fused.plain_local_sgd(plan, *d, dg, lr, N)
        elif kind == "glu":                          # state (L, P); a snapshot every other step
            snap, f = s % 2 == 0, (1.0 if s % 2 == 0 else 0.5)
            old.unfused_glu_paper(h[0], g, h[1], mask, decay, lr, LAM, C, N, f, snap, a, b, c)
            fused.glu_paper(plan, d[0], dg, d[1], lr * LAM, C, N, -(lr * f), snap)
        elif kind == "momentum-sum":                 # state (W, M, G): G a sum over N ranks, divided as read
            np.divide(h[2], N, out=h[2])             # the oracle: the mean allreduce's own division pass
            old.unfused_momentum_sgd(h[0], h[1], h[2], decay, lr, MU, a)
            fused.momentum_sgd(plan, d[0], d[1], d[2], lr, MU, N)
        elif kind == "add-divided":                  # state (W, R): W += R/N
            np.divide(h[1], N, out=h[1])
            np.add(h[0], h[1], out=h[0])
            fused.add_divided(plan, d[0], d[1], N)
        elif kind == "merge-restart":                # state (L, S): L = W + (L - S); S = W
            old.unfused_rebase(Wg, *h, a)
            fused.rebase(plan, dWg, *d)
            Wg = Wg + np.asarray(g, dtype) * np.asarray(lr, dtype)     # W moves between merges
            dWg = dev(Wg)
        elif kind == "divide-copy":                  # state (L, W): L = L/N; W = L
            np.divide(h[0], N, out=h[0])
            h[1][...] = h[0]
            fused.divide_copy(plan, d[0], d[1], N)
        else:                                        # delta-own: state (U, L, S, D); a boundary each step
            old.unfused_momentum_sgd_expanded(h[0], h[1], g, mask, lr, LAM, MU, a)
            fused.momentum_sgd_expanded(plan, d[0], d[1], dg, lr * LAM, MU, lr)
            old.unfused_post_displacement(Wg, *h[1:], s % 2 == 1)
            fused.post_displacement(plan, dWg, *d[1:], s % 2 == 1)
    return h, [backend.to_host(x) for x in d]


KINDS = ("momentum", "global-momentum", "sgd", "glu", "delta-own", "momentum-sum", "add-divided", "divide-copy",
         "merge-restart")


def check(kind, n, dtype, mask, **kw):
    with np.errstate(all="ignore"):
        before, after = run(kind, n, dtype, mask, **kw)
    for a, b in zip(before, after):
        assert same_bits(a, b), f"{kind} n={n} {np.dtype(dtype).name}: fused differs from unfused"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 5, 7, 8, 9, 16, 17, 100, 1003])
def test_fused_equals_unfused_bitwise(kind, dtype, n):
    """Sizes below, at and not a multiple of the block (8 or 16 elements), masks with runs across blocks."""
    rng = np.random.default_rng(n)
    check(kind, n, dtype, layer_mask(n, dtype, rng))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fill", [0.0, 1.0, "random"])
def test_uniform_and_scattered_masks(kind, fill):
    """All blocks uniform (one 1-element operand each) or nearly all mixed (every element its own)."""
    n = 203
    rng = np.random.default_rng(1)
    mask = (rng.random(n) < 0.5).astype(np.float32) if fill == "random" else np.full(n, fill, np.float32)
    check(kind, n, np.float32, mask)


@pytest.mark.parametrize("kind", KINDS)
def test_default_block_size_with_a_ragged_tail(kind):
    n = fused.BLOCK_BYTES // 4 * 2 + 123
    check(kind, n, np.float32, layer_mask(n, np.float32, np.random.default_rng(2)), block_bytes=fused.BLOCK_BYTES,
          steps=2)


def test_plan_reads_a_one_element_operand_only_where_the_mask_is_bitwise_uniform():
    mask = np.zeros(40, np.float32)
    mask[10:30] = 1.0
    mask[36] = -0.0                                     # == 0.0, but other bits: not uniform
    plan = fused.Plan((mask,), 1, block_bytes=20)       # blocks of 5
    sizes = [ops[0].size for _, ops, _ in plan.blocks]
    assert sizes == [1, 1, 1, 1, 1, 1, 1, 5]
    assert [float(ops[0][0]) for _, ops, _ in plan.blocks[:7]] == [0, 0, 1, 1, 1, 1, 0]
    assert [v[0].size for _, _, v in plan.blocks] == [5] * 8
    assert not plan.device and plan.n == 40


def test_weight_decay_only_where_the_mask_is_one():
    """With M = G = 0 the global step is pure decay: masked elements shrink, the others do not move."""
    n = 50
    mask = layer_mask(n, np.float32, np.random.default_rng(3))
    W = np.random.default_rng(4).uniform(1, 2, n).astype(np.float32)
    W0, M = W.copy(), np.zeros(n, np.float32)
    MomentumSGD(mask, 0.9, 0.1).update(W, OptState(velocity=M), np.zeros(n, np.float32), 0.5)
    on = mask == 1
    assert on.any() and (~on).any()
    assert np.array_equal(W[~on], W0[~on]) and np.all(W[on] < W0[on])
    L = W0.copy()
    PlainLocalSGD(2, 0.1, mask).step(L, np.zeros(n, np.float32), 0, 0.5)
    assert np.array_equal(L[~on], W0[~on]) and np.all(L[on] < W0[on])


def test_classes_use_the_fused_updates_bitwise():
    """MomentumSGD and the local-update classes give the unfused numbers (default block size)."""
    rng = np.random.default_rng(5)
    n = fused.BLOCK_BYTES // 4 + 777
    mask = layer_mask(n, np.float32, rng)
    decay = mask * LAM
    W, M, g, L, P = (rng.standard_normal(n).astype(np.float32) for _ in range(5))
    a, b, c = (np.empty(n, np.float32) for _ in range(3))
    W0, M0, L0, L1, L2, P0 = W.copy(), M.copy(), L.copy(), L.copy(), L.copy(), L.copy()
    MomentumSGD(mask, MU, LAM).update(W, OptState(velocity=M), g, LR)
    old.unfused_momentum_sgd(W0, M0, g, decay, LR, MU, a)
    GlobalMomentumLocal(MomentumSGD(mask, MU, LAM), OptState(velocity=M)).step(L, g, 0, LR)
    old.unfused_momentum_sgd_read_only(L0, g, M, decay, LR, MU, a, b)
    PlainLocalSGD(N, LAM, mask).step(L1, g, 0, LR)
    old.unfused_plain_local_sgd(L2, g, decay, LR, N, a, b)
    glu = GLUPaper(N, 2, C, LAM, mask)
    glu.P[...] = P
    Lg = P0.copy()
    glu.step(Lg, g, 1, LR)
    old.unfused_glu_paper(P0, g, P.copy(), mask, decay, LR, LAM, C, N, 0.5, False, a, b, c)
    for x, y in ((W, W0), (M, M0), (L, L0), (L1, L2), (Lg, P0)):
        assert same_bits(x, y)


@pytest.mark.parametrize("bad", ["strided", "dtype", "size", "2d"])
def test_buffers_must_be_flat_contiguous_of_the_plans_size_and_dtype(bad):
    mask = np.ones(10, np.float32)
    opt = MomentumSGD(mask, 0.9, 1e-4)
    W = {"strided": np.zeros(20, np.float32)[::2], "dtype": np.zeros(10, np.float64),
         "size": np.zeros(11, np.float32), "2d": np.zeros((2, 5), np.float32)}[bad]
    with pytest.raises(ValueError, match="fused update needs 1-D contiguous float32 buffers of 10 elements"):
        opt.update(W, OptState(velocity=np.zeros(10, np.float32)), np.zeros(10, np.float32), 0.1)


# --- the GPU path without a GPU ------------------------------------------------------------------


class FakeKernel:
    """Runs an ElementwiseKernel's body with NumPy, one C statement at a time (each one ufunc)."""

    def __init__(self, in_params, out_params, operation, name, **kwargs):
        self.params = [p.split()[1] for p in (in_params + ", " + out_params).split(", ")]
        self.outs = [p.split()[1] for p in out_params.split(", ")]
        self.body, self.name, self.kwargs = operation, name, kwargs

    def __call__(self, *args):
        assert len(args) == len(self.params)
        ns = dict(zip(self.params, args))
        ns["T"] = next(a for a in args if isinstance(a, np.ndarray)).dtype.type
        ns["sqrt"] = np.sqrt                       # CUDA's sqrt, correctly rounded like NumPy's
        for stmt in filter(None, (s.strip() for s in self.body.split(";"))):
            cond = re.fullmatch(r"if \((\w+)\) (.*)", stmt)
            if cond and not ns[cond[1]]:
                continue
            target, expr = re.fullmatch(r"(?:T )?(\w+) = (.*)", cond[2] if cond else stmt).groups()
            ns[target] = np.copy(eval(re.sub(r"\(T\)([\d.]+)", r"T(\1)", expr), {}, ns))
        for name, arr in zip(self.params, args):
            if name in self.outs:
                arr[...] = ns[name]


class FakeCupy:
    ElementwiseKernel = FakeKernel
    __version__ = "fake"


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(backend, "_cupy_probe", (FakeCupy, "fake GPU"))
    monkeypatch.setattr(fused, "_built", {})


def test_elementwise_is_none_without_a_gpu(monkeypatch):
    monkeypatch.setattr(backend, "_cupy_probe", (None, "no GPU"))
    assert backend.elementwise("k", "T x", "T y", "y = x;") is None


def test_elementwise_builds_a_kernel_without_fma_contraction(fake_gpu):
    k = backend.elementwise("ssdmpi_k", "T x, T a", "T y", "y = y * a; y = y + x;")
    assert isinstance(k, FakeKernel) and k.name == "ssdmpi_k" and k.body == "y = y * a; y = y + x;"
    assert "--fmad=false" in k.kwargs["options"] and k.kwargs["no_return"] is True
    x, y = np.float32([1, 2]), np.float32([3, 4])
    k(x, np.float32(2), y)
    assert y.tolist() == [7, 10]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_kernel_bodies_equal_unfused_bitwise(fake_gpu, kind, dtype):
    """Each kernel body, statement by statement in the buffers' dtype, gives the unfused bits."""
    n = 300
    check(kind, n, dtype, layer_mask(n, dtype, np.random.default_rng(6)), device=True)
    assert set(fused._built) <= set(fused.KERNELS) and fused._built


def test_kernels_are_built_once_and_lazily(fake_gpu):
    mask = np.ones(4, np.float32)
    plan = fused.Plan((mask,), 1, device=True)
    assert fused._built == {} and plan.blocks == []
    W, M, G = (np.ones(4, np.float32) for _ in range(3))
    fused.momentum_sgd(plan, W, M, G, 0.1, 0.9)
    k = fused._built["ssdmpi_momentum_sgd"]
    fused.momentum_sgd(plan, W, M, G, 0.1, 0.9)
    assert fused._built == {"ssdmpi_momentum_sgd": k}


def test_device_buffers_without_cupy_is_an_error(monkeypatch):
    monkeypatch.setattr(backend, "_cupy_probe", (None, "no GPU"))
    monkeypatch.setattr(fused, "_built", {})
    plan = fused.Plan((np.ones(3, np.float32),), 1, device=True)
    with pytest.raises(RuntimeError, match="buffers are on a GPU but CuPy is not usable"):
        fused.momentum_sgd(plan, *(np.ones(3, np.float32) for _ in range(3)), 0.1, 0.9)


def test_real_gpu_kernels_equal_numpy_bitwise():
    """On a machine with a GPU: the compiled kernels give the NumPy (unfused) bits."""
    cupy, why = backend.probe_cupy()
    if cupy is None:
        pytest.skip(why)
    n = 100_003
    for dtype in DTYPES:
        mask = layer_mask(n, dtype, np.random.default_rng(7))
        for kind in KINDS:
            with np.errstate(all="ignore"):
                ref, dev = run(kind, n, dtype, mask, dev=cupy.asarray)
            for a, b in zip(ref, dev):
                assert same_bits(a, b), f"{kind} {np.dtype(dtype).name}: GPU kernel differs from NumPy"


def test_a_plans_poll_is_called_every_poll_blocks_and_changes_no_bits():
    """``--progress test`` drives an allreduce in flight from inside the update passes."""
    n = SMALL // 4 * (3 * fused.POLL_BLOCKS + 5)           # 53 blocks of 16 float32
    mask = layer_mask(n, np.float32, np.random.default_rng(8))
    W, M, G = data(np.random.default_rng(9), n, np.float32, 3)
    ref = [x.copy() for x in (W, M, G)]
    calls = []
    plan = fused.Plan((mask * LAM,), 1, SMALL)
    plan.poll = lambda: calls.append(1)
    with np.errstate(all="ignore"):
        fused.momentum_sgd(plan, W, M, G, LR, MU, 2)
        np.divide(ref[2], 2, out=ref[2])
        old.unfused_momentum_sgd(ref[0], ref[1], ref[2], mask * LAM, LR, MU, np.empty(n, np.float32))
    assert len(plan.blocks) == 3 * fused.POLL_BLOCKS + 5 and len(calls) == 3
    assert all(same_bits(a, b) for a, b in zip((W, M, G), ref))
