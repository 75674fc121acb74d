"""``--optimizer adamw`` (ssdmpi/optim/optimizers/adamw.py) against independent oracles.

- the step against ``torch.optim.AdamW`` in float64 (param groups for the decay mask, a changing lr,
  with and without ``torch.nn.utils.clip_grad_norm_``; skipped without torch);
- the fused pass against the unfused form of ssdmpi/verify/fused_bench.py bit for bit (CPU blocks,
  and the CuPy kernel's body through tests/unit/test_fused.py's fake CuPy);
- the read-only step, the momentum merge (against the reference simulator's own AdamW), the
  allocation-free hot path, the state's checkpoint keys;
- the flags: ``--beta1`` and friends with ``--optimizer adamw`` only, plain-SGD local updates refused,
  ``--print-config`` showing the settings.
"""

import numpy as np
import pytest

from ssdmpi.algos import AlgoConfig
from ssdmpi.errors import UserError
from ssdmpi.optim import fused
from ssdmpi.optim.optimizers.adamw import KERNEL, AdamW, adamw_pass
from ssdmpi.verify import fused_bench as old
from ssdmpi.verify.reference import AdamWTwin
from tests.conftest import run_cli
from tests.unit.test_fused import DTYPES, SMALL, data, fake_gpu, layer_mask, same_bits  # noqa: F401 (fixture)
from tests.unit.test_optim import ALLOC_PARAMS, traced_peak

N_PARAMS = 50


def problem(seed=0):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=N_PARAMS)
    mask = (rng.random(N_PARAMS) < 0.7).astype(np.float64)
    grads = [rng.normal(size=N_PARAMS) for _ in range(12)]
    return W, mask, grads


@pytest.mark.parametrize("clip", [0.0, 1.5, 100.0])
@pytest.mark.parametrize("betas,wd", [((0.9, 0.95), 0.1), ((0.8, 0.999), 0.0), ((0.95, 0.9), 0.3)])
def test_adamw_equals_pytorch_adamw(clip, betas, wd):
    """Several steps at a changing lr == torch.optim.AdamW with weight decay on the mask group only
    (and clip_grad_norm_ over both groups first: the global norm)."""
    torch = pytest.importorskip("torch", reason="PyTorch is this test's oracle (pip install torch==2.13.0)")
    W, mask, grads = problem()
    opt = AdamW(mask, betas[0], betas[1], 1e-8, wd, clip)
    state = opt.init(W)
    dec, nodec = mask == 1, mask == 0
    p_dec = torch.tensor(W[dec], requires_grad=True)
    p_nod = torch.tensor(W[nodec], requires_grad=True)
    topt = torch.optim.AdamW([{"params": [p_dec], "weight_decay": wd}, {"params": [p_nod], "weight_decay": 0.0}],
                             lr=0.01, betas=betas, eps=1e-8)
    W = W.copy()
    clipped = 0
    for i, G in enumerate(grads):
        lr = 0.01 / (1 + 0.3 * i)
        for group in topt.param_groups:
            group["lr"] = lr
        clipped += opt.clip_factor(G) < 1.0
        opt.update(W, state, G.copy(), lr)
        p_dec.grad, p_nod.grad = torch.tensor(G[dec]), torch.tensor(G[nodec])
        if clip:
            torch.nn.utils.clip_grad_norm_([p_dec, p_nod], clip)
        topt.step()
    assert state["count"] == len(grads) == int(topt.state[p_dec]["step"])
    assert clipped == (len(grads) if clip == 1.5 else 0)        # 1.5 clips every step, 100 none
    np.testing.assert_allclose(W[dec], p_dec.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(W[nodec], p_nod.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(state["m"][dec], topt.state[p_dec]["exp_avg"].numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(state["v"][nodec], topt.state[p_nod]["exp_avg_sq"].numpy(), rtol=1e-12, atol=1e-14)


def test_the_first_step_by_hand():
    """count 1: m = 0.1 g, v = 0.05 g^2, bias-corrected m^ = g, v^ = g^2: W <- W(1 - lr wd) - lr g/(|g| + eps)."""
    W, mask, G = np.array([1.0, 2.0, -1.0]), np.array([1.0, 0.0, 1.0]), np.array([0.5, -0.2, 4.0])
    opt = AdamW(mask, 0.9, 0.95, 1e-8, 0.1)
    state = opt.init(W)
    opt.update(W, state, G, 0.01)
    expected = np.array([1.0, 2.0, -1.0]) * np.array([1 - 0.001, 1.0, 1 - 0.001]) - 0.01 * G / (np.abs(G) + 1e-8)
    np.testing.assert_allclose(W, expected, rtol=1e-13)
    np.testing.assert_allclose(state["m"], 0.1 * G, rtol=1e-15)
    np.testing.assert_allclose(state["v"], 0.05 * G * G, rtol=1e-15)


def test_a_summed_gradient_with_a_divisor_is_the_mean_and_clipping_sees_the_mean():
    W, mask, grads = problem(1)
    for clip in (0.0, 0.5):
        a, b = W.copy(), W.copy()
        opt = AdamW(mask, 0.9, 0.95, 1e-8, 0.1, clip)
        sa, sb = opt.init(W), opt.init(W)
        for G in grads[:4]:
            total, mean = G * 3.0, G * 3.0 / 3
            opt.update(a, sa, total, 0.01, divisor=3)
            opt.update(b, sb, mean, 0.01)
            assert same_bits(total, mean)                 # divided in place, as the mean allreduce would
        assert same_bits(a, b) and same_bits(sa["m"], sb["m"]) and same_bits(sa["v"], sb["v"])


def test_read_only_is_the_step_the_state_would_give_and_leaves_the_state():
    W, mask, grads = problem(2)
    opt = AdamW(mask, 0.9, 0.95, 1e-8, 0.1, 0.7)
    state = opt.init(W)
    for G in grads[:3]:
        opt.update(W.copy(), state, G, 0.01)
    before = state.copy()
    L, g = W + 0.01, grads[5].copy()
    read_only = L.copy()
    opt.update_read_only(read_only, state, g, 0.02)
    assert state["count"] == before["count"] == 3
    assert same_bits(state["m"], before["m"]) and same_bits(state["v"], before["v"]) and same_bits(g, grads[5])
    stepped, moved = L.copy(), before.copy()
    opt.update(stepped, moved, g, 0.02)
    assert same_bits(read_only, stepped) and moved["count"] == 4


def test_the_merge_is_the_reference_simulators_bitwise():
    """``merge_mean_step`` (delta-merge's --merge-momentum with AdamW) against the simulator's own AdamW."""
    W, mask, grads = problem(3)
    opt = AdamW(mask, 0.9, 0.95, 1e-8, 0.1)
    state = opt.init(W)
    for G in grads[:5]:
        opt.update(W, state, G, 0.01)
    twin = AdamWTwin(AlgoConfig(optimizer="adamw").validate(1), mask)
    mean = grads[6] * 0.01
    ref = twin.merge({"m": state["m"].copy(), "v": state["v"].copy(), "count": 5}, mean, 0.5, 3, 0.01, W)
    opt.merge_mean_step(state, mean, 0.5, 3, lr=0.01, params=W)
    assert same_bits(state["m"], ref["m"]) and same_bits(state["v"], ref["v"]) and state["count"] == 5
    kept = state.copy()
    opt.merge_mean_step(state, mean, 0.0, 3, lr=0.01, params=W)          # a = 0: each rank keeps its own m
    opt.merge_mean_step(state, mean, 0.5, 3, lr=0.0, params=W)           # lr 0: nothing to estimate from
    assert same_bits(state["m"], kept["m"])


def test_state_is_m_v_and_an_integer_count_under_checkpoint_keys():
    W, mask, grads = problem(4)
    opt = AdamW(mask, 0.9, 0.95, 1e-8, 0.1)
    state = opt.init(W)
    opt.update(W, state, grads[0], 0.01)
    entries = state.entries("M")
    assert list(entries) == ["M.m", "M.v", "M.count"] and entries["M.count"] == 1
    fresh = opt.init(W)
    fresh.load_entries({k: (np.array(v) if k != "M.count" else np.int64(v)) for k, v in entries.items()}, "M", np)
    assert fresh["count"] == 1 and type(fresh["count"]) is int and same_bits(fresh["m"], state["m"])
    assert [b is state["m"] or b is state["v"] for b in state.buffers()] == [True, True]


def test_sliced_and_linear_momentum():
    W, mask, grads = problem(5)
    opt = AdamW(mask, 0.85, 0.95, 1e-8, 0.1)
    assert opt.linear_momentum == 0.85 and opt.local_form() is opt
    whole, part = W.copy(), W[10:30].copy()
    sw, sp = opt.init(whole), opt.sliced(slice(10, 30)).init(part)
    sub = opt.sliced(slice(10, 30))
    for G in grads[:3]:
        opt.update(whole, sw, G, 0.01)
        sub.update(part, sp, G[10:30].copy(), 0.01)
    assert same_bits(whole[10:30], part)            # elementwise without clipping: a slice is the same


def run_fused(n, dtype, mask, write, n_div, clip_c, block_bytes=SMALL, device=None, steps=3, seed=0):
    rng = np.random.default_rng(seed)
    inv = 1 - mask
    a, d, e = (np.empty(n, dtype) for _ in range(3))
    with np.errstate(all="ignore"):
        h = data(rng, n, dtype, 4)                       # W, m, v, G (inf/NaN/signed zeros included)
        h[2] = np.abs(h[2])
        dv = [x.copy() for x in h]
        plan = fused.Plan((mask, inv), 4, block_bytes, device)
        for s in range(steps):
            lr, c = 0.01 / (s + 1), s + 1
            scal = (1 - lr * 0.1, 1 - 0.9, 1 - 0.95, 0.95, (1 - 0.95 ** c) ** 0.5, 1e-8, -(lr / (1 - 0.9 ** c)))
            old.unfused_adamw(*h, mask, inv, *scal, n_div, clip_c, write, a, d, e)
            adamw_pass(plan, *dv, *scal, n_div, clip_c, write)
    return h, dv


CASES = [(True, None, 1.0), (True, 3, 1.0), (True, None, 0.37), (False, None, 1.0), (False, None, 0.37)]


@pytest.mark.parametrize("write,n_div,clip_c", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 8, 9, 17, 100, 1003])
def test_fused_equals_unfused_bitwise(write, n_div, clip_c, dtype, n):
    mask = layer_mask(n, dtype, np.random.default_rng(n))
    for x, y in zip(*run_fused(n, dtype, mask, write, n_div, clip_c)):
        assert same_bits(x, y)


@pytest.mark.parametrize("fill", [0.0, 1.0])
def test_uniform_masks_and_the_default_block(fill):
    n = fused.BLOCK_BYTES // 4 * 2 + 123
    mask = np.full(n, fill, np.float32)
    for x, y in zip(*run_fused(n, np.float32, mask, True, 2, 0.5, block_bytes=fused.BLOCK_BYTES, steps=2)):
        assert same_bits(x, y)


@pytest.mark.parametrize("write,n_div,clip_c", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_kernel_body_equals_unfused_bitwise(fake_gpu, write, n_div, clip_c, dtype):  # noqa: F811
    n = 300
    mask = layer_mask(n, dtype, np.random.default_rng(6))
    for x, y in zip(*run_fused(n, dtype, mask, write, n_div, clip_c, device=True)):
        assert same_bits(x, y)
    assert set(fused._built) == {KERNEL[0]}


def test_a_step_allocates_no_buffer_of_the_weights_size():
    """update (with a divisor, with clipping) and the read-only step work in the plan's scratch (float32)."""
    rng = np.random.default_rng(5)
    W, g = (rng.standard_normal(ALLOC_PARAMS, dtype=np.float32) for _ in range(2))
    mask = (rng.random(ALLOC_PARAMS) < 0.7).astype(np.float32)
    plain, clipped = AdamW(mask, 0.9, 0.95, 1e-8, 0.1), AdamW(mask, 0.9, 0.95, 1e-8, 0.1, 1.0)
    state = plain.init(W)
    steps = {"update": lambda: plain.update(W, state, g, 1e-3),
             "update with a divisor": lambda: plain.update(W, state, g, 1e-3, divisor=1),
             "clipped, a summed gradient": lambda: clipped.update(W, state, g, 1e-3, divisor=2),
             "read only, clipped": lambda: clipped.update_read_only(W, state, g, 1e-3)}
    for name, step in steps.items():
        step()
        peak = traced_peak(step)
        assert peak < ALLOC_PARAMS * 4 // 8, f"{name}: {peak} bytes allocated during one step"


def test_a_global_norm_over_the_whole_gradient():
    """clip_factor: min(1, C/(||g|| + 1e-6)) of the flat buffer's 2-norm."""
    g = np.array([3.0, 4.0])
    assert AdamW(np.ones(2), 0.9, 0.95, 1e-8, 0.0, 1.0).clip_factor(g) == 1.0 / (5.0 + 1e-6)
    assert AdamW(np.ones(2), 0.9, 0.95, 1e-8, 0.0, 10.0).clip_factor(g) == 1.0
    assert AdamW(np.ones(2), 0.9, 0.95, 1e-8, 0.0, 0.0).clip_factor(g) == 1.0


# --- the settings -------------------------------------------------------------------------------

@pytest.mark.parametrize("settings,needle", [
    (dict(optimizer="adamw", momentum=0.5), "--momentum applies only to --optimizer sgd; drop it"),
    (dict(beta1=0.5), "--beta1 applies only to --optimizer adamw; drop it"),
    (dict(grad_clip=1.0), "--grad-clip applies only to --optimizer adamw; drop it"),
    (dict(optimizer="adamw", beta2=1.0), "--beta2 must be < 1.0"),
    (dict(optimizer="adamw", eps=0.0), "--eps must be > 0"),
    (dict(optimizer="adamw", comm="step", local_update="glu-paper"),
     "--local-update glu-paper is a plain SGD step of its own and does not fit --optimizer adamw's global steps; "
     "use --local-update global-momentum"),
    (dict(optimizer="adamw", comm="step", local_update="sgd"), "--local-update sgd is a plain SGD step"),
    (dict(algo="asgd", servers=2, optimizer="adamw", grad_clip=1.0),
     "--grad-clip needs the whole gradient's norm, and each of --servers 2 holds a slice of it"),
])
def test_settings_that_do_not_fit_are_refused_in_one_line(settings, needle):
    with pytest.raises(UserError, match=None) as err:
        AlgoConfig(**settings).validate(4)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_defaults_and_what_applies():
    cfg = AlgoConfig(optimizer="adamw").validate(2)
    assert (cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.grad_clip, cfg.momentum) == \
        (0.9, 0.95, 1e-8, 0.1, 0.0, None)
    sgd = AlgoConfig().validate(2)
    assert (sgd.beta1, sgd.grad_clip, sgd.weight_decay) == (None, None, 1e-4)


def test_cli_refuses_in_one_line_exit_2_and_prints_the_adamw_settings(tmp_path):
    for args, needle in ((["--optimizer", "adamw", "--momentum", "0.5"], "--momentum applies only to --optimizer sgd"),
                         (["--optimizer", "sgd", "--beta1", "0.5"], "--beta1 applies only to --optimizer adamw")):
        result = run_cli(["train", *args, "--steps", "1"], cwd=tmp_path)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and needle in lines[0], result.stderr
        assert "Traceback" not in result.stderr
    shown = run_cli(["train", "--print-config", "--optimizer", "adamw", "--beta1", "0.8", "--grad-clip", "1"],
                    cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    keys = {line.split(":")[0]: line.split(":", 1)[1].split("#")[0].strip() for line in shown.stdout.splitlines()
            if ":" in line and not line.startswith(" ")}
    assert (keys["optimizer"], keys["beta1"], keys["beta2"], keys["eps"], keys["grad_clip"], keys["weight_decay"],
            keys["momentum"]) == ("adamw", "0.8", "0.95", "1.0e-08", "1.0", "0.1", "null")


def test_real_gpu_kernel_equals_numpy_bitwise():
    """On a machine with a GPU: AdamW's compiled kernel gives the NumPy bits (update and read-only; without
    clipping: the norm's dot product is summed in another order on the GPU)."""
    from ssdmpi import backend

    cupy, why = backend.probe_cupy()
    if cupy is None:
        pytest.skip(why)
    n = 100_003
    for dtype in DTYPES:
        rng = np.random.default_rng(8)
        mask = layer_mask(n, dtype, rng)
        W, G = (rng.standard_normal(n).astype(dtype) for _ in range(2))
        out = []
        for xp in (np, cupy):
            opt = AdamW(xp.asarray(mask), 0.9, 0.95, 1e-8, 0.1)
            Wx, state = xp.asarray(W), opt.init(xp.asarray(W))
            for step in range(3):
                opt.update(Wx, state, xp.asarray(G) * (step + 1), 1e-3, divisor=2)
            Lx = Wx.copy()
            opt.update_read_only(Lx, state, xp.asarray(G), 1e-3)
            out.append([backend.to_host(a) for a in (Wx, state["m"], state["v"], Lx)])
        assert all(same_bits(a, b) for a, b in zip(*out)), np.dtype(dtype).name
