"""The gpt model and its layers: finite-difference gradients (float64), the token-model contract,
causal masking, the tied head's gradient and the overlap hook, dropout, dtypes, initialisation.

Gradient checks compare the analytic gradient with central differences (eps 1e-6) by the
norm-wise relative error on up to 40 coordinates per tensor (``ssdmpi/verify/gradcheck.py``);
TOLERANCE is the same as the other layers' (tests/unit/test_nn_layers.py).
"""

import math

import numpy as np
import pytest

from ssdmpi.errors import UserError
from ssdmpi.nn import Model, build_model
from ssdmpi.nn import transformer as transformer_module
from ssdmpi.nn.attention import CausalSelfAttention
from ssdmpi.nn.embedding import PositionalEmbedding, TiedHead, TokenEmbedding
from ssdmpi.nn.norm import LayerNorm
from ssdmpi.nn.transformer import GELU, MLP, Block
from ssdmpi.verify.gradcheck import check_layer, check_model, check_token_layer

TOLERANCE = 1e-6
VOCAB, CONTEXT = 11, 6
SMALL = {"n_layer": 2, "n_head": 2, "d_model": 8}


def tokens(n=3, t=CONTEXT, vocab=VOCAB, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, size=(n, t)), rng.integers(0, vocab, size=(n, t))


def small_gpt(dtype=np.float64, seed=0, **options):
    return build_model("gpt", (CONTEXT,), VOCAB, dtype=dtype, seed=seed, **{**SMALL, **options})


def _assert_small(errors):
    bad = {k: v for k, v in errors.items() if not v < TOLERANCE}
    assert not bad, f"relative errors above {TOLERANCE}: {bad}"


# (id, layer factory, per-sample input shape)
LAYERS = [
    ("layernorm", lambda: LayerNorm(6, name="ln"), (5, 6)),
    ("layernorm-vector", lambda: LayerNorm(7, name="ln"), (7,)),
    ("gelu", lambda: GELU(), (7,)),
    ("gelu-tokens", lambda: GELU(), (3, 5)),
    ("positional", lambda: PositionalEmbedding(6, 4), (5, 4)),     # T = 5 < context 6
    ("mlp", lambda: MLP(4), (5, 4)),
    ("mlp-dropout", lambda: MLP(4, dropout=0.3), (5, 4)),
    ("attention", lambda: CausalSelfAttention(8, 2, 6), (6, 8)),
    ("attention-shorter-than-context", lambda: CausalSelfAttention(8, 2, 6), (4, 8)),
    ("attention-one-head", lambda: CausalSelfAttention(6, 1, 5), (5, 6)),
    ("attention-dropout", lambda: CausalSelfAttention(8, 4, 6, dropout=0.3), (6, 8)),
    ("block", lambda: Block(8, 2, 6, n_layer=2), (6, 8)),
    ("block-dropout", lambda: Block(8, 2, 6, n_layer=2, dropout=0.2), (6, 8)),
]


@pytest.mark.parametrize("make, shape", [c[1:] for c in LAYERS], ids=[c[0] for c in LAYERS])
def test_layer_gradients_match_finite_differences(make, shape):
    errors = check_layer(make(), shape, batch=3)
    assert "input" in errors
    _assert_small(errors)


def test_mlp_gradients_in_many_row_blocks(monkeypatch):
    """The GELU passes run in row blocks; with one row per block the gradients still check."""
    monkeypatch.setattr(transformer_module, "ROW_BLOCK_BYTES", 1)
    assert len(transformer_module._row_blocks(np, 15, 32)) == 15
    _assert_small(check_layer(MLP(4), (5, 4), batch=3))
    _assert_small(check_layer(GELU(), (5, 4), batch=3))


def test_token_embedding_gradient_scatters_into_the_rows_of_the_batch():
    errors = check_token_layer(TokenEmbedding(7, 4), context=5, vocab=7, coords=None)
    _assert_small(errors)


def test_tied_head_and_embedding_gradient_is_the_sum_of_both_parts():
    """Embedding -> positions -> tied head: the shared weight's gradient (every coordinate,
    rows seen in the batch and rows not seen) against finite differences of the loss."""
    wte = TokenEmbedding(VOCAB, 4)
    model = Model([wte, PositionalEmbedding(CONTEXT, 4), TiedHead(wte)], (CONTEXT,), dtype=np.float64,
                  input_kind="tokens")
    assert [s.name for s in model.flat.specs] == ["wte.weight", "wpe.weight"]      # one tensor, tied
    x, y = tokens(n=2, vocab=VOCAB - 3)            # ids 8..10 never appear: their rows get the head's part only
    errors = check_model(model, x, y, coords=None)
    _assert_small(errors)


@pytest.mark.parametrize("options, weights", [({}, "init"), ({}, "random"), ({"dropout": 0.2}, "random"),
                                              ({"n_layer": 1, "n_head": 1}, "init")],
                         ids=["init", "random-weights", "dropout", "one-layer-one-head"])
def test_gpt_gradients_match_finite_differences(options, weights):
    """Every coordinate of every tensor (the key bias's gradient is exactly 0 -- softmax ignores a
    shift shared by a row -- so a few sampled coordinates there would compare rounding noise).
    ``random``: weights N(0, 0.3^2) instead of the small initial ones, for peaked attention."""
    model = small_gpt(**options)
    if weights == "random":
        model.params = np.random.default_rng(5).normal(0.0, 0.3, size=model.num_params)
    x, y = tokens()
    errors = check_model(model, x, y, coords=None)
    assert set(errors) == {spec.name for spec in model.flat.specs}      # every tensor checked
    _assert_small(errors)


def test_gradient_check_catches_a_missing_tied_part():
    """The check can fail: drop the head's part of the tied gradient (the embedding overwrites)."""
    model = small_gpt()
    model.layers[0].tied = False
    x, y = tokens()
    errors = check_model(model, x, y, coords=3)
    assert errors["wte.weight"] > 0.1
    assert errors["wpe.weight"] < TOLERANCE


def test_gelu_is_the_tanh_approximation():
    """Against GELU written as GPT-2 writes it, across several row blocks (float64)."""
    rng = np.random.default_rng(0)
    x = rng.normal(scale=3.0, size=(300, 256))
    gelu = GELU()
    y = gelu.forward(x.copy())
    c = math.sqrt(2 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x ** 3))
    np.testing.assert_allclose(y, 0.5 * x * (1 + t), rtol=1e-13, atol=1e-15)
    dy = rng.normal(size=x.shape)
    dx = gelu.backward(dy)
    exact = 0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * c * (1 + 3 * 0.044715 * x ** 2)
    np.testing.assert_allclose(dx, dy * exact, rtol=1e-12, atol=1e-14)


def test_future_tokens_do_not_change_earlier_logits():
    model = small_gpt()
    x, _ = tokens()
    base = model.forward(x, train=False)
    for t0 in range(1, CONTEXT):
        changed = x.copy()
        changed[:, t0] = (changed[:, t0] + 1) % VOCAB
        logits = model.forward(changed, train=False)
        np.testing.assert_allclose(logits[:, :t0], base[:, :t0], rtol=0, atol=1e-13)
        assert np.all(np.abs(logits[:, t0:] - base[:, t0:]).max(axis=-1) > 1e-6)     # the rest did change


def test_a_shorter_window_gives_the_prefix_of_the_full_one():
    model = small_gpt()
    x, _ = tokens()
    full = model.forward(x, train=False)
    for t in (1, 3):
        np.testing.assert_allclose(model.forward(x[:, :t], train=False), full[:, :t], rtol=1e-12, atol=1e-14)


def test_the_contract_loss_mean_over_all_positions_grads_overwritten_evaluate_sums():
    model = small_gpt()
    assert model.input_kind == "tokens" and model.targets_per_sample == CONTEXT
    assert build_model("mlp", (4,), 3).input_kind == "features"
    assert build_model("mlp", (4,), 3).targets_per_sample == 1
    x, y = tokens(n=4)
    logits = model.forward(x, train=True)
    assert logits.shape == (4, CONTEXT, VOCAB) and model.output_shape == (CONTEXT, VOCAB)
    loss = model.loss_and_grad(x, y)
    first = model.grads.copy()
    model.loss_and_grad(x, y)
    np.testing.assert_array_equal(model.grads, first)                       # overwritten, not accumulated
    # the mean over B*T: the full batch's gradient is the mean of its two halves'
    model.loss_and_grad(x[:2], y[:2])
    half = model.grads.copy()
    model.loss_and_grad(x[2:], y[2:])
    np.testing.assert_allclose((half + model.grads) / 2, first, rtol=1e-10, atol=1e-14)
    # the loss against a direct per-position cross-entropy
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    direct = -np.take_along_axis(logp, y[..., None], axis=-1).mean()
    assert isinstance(loss, float) and abs(loss - direct) < 1e-12
    loss_sum, correct = model.evaluate(x, y)
    assert abs(loss_sum / y.size - loss) < 1e-12
    assert correct == int((logits.argmax(axis=-1) == y).sum()) and 0 <= correct <= y.size


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.uint8, np.uint16])
def test_any_integer_dtype_is_accepted(dtype):
    model = small_gpt()
    x, y = tokens()
    np.testing.assert_array_equal(model.forward(x.astype(dtype), train=False), model.forward(x, train=False))
    model.loss_and_grad(x.astype(dtype), y.astype(dtype))


def test_bad_token_batches_raise_value_errors_naming_the_model():
    model = small_gpt()
    x, _ = tokens()
    with pytest.raises(ValueError, match=r"^gpt.wte: expected integer token ids, received float32"):
        model.forward(x.astype(np.float32))
    with pytest.raises(ValueError, match=r"^gpt.wte: expected token ids of shape \(batch, T\) with 1 <= T <= 6, "
                                         r"received \(3, 7\)"):
        model.forward(np.zeros((3, CONTEXT + 1), dtype=np.int64))
    with pytest.raises(ValueError, match=r"received \(3, 6, 1\)"):
        model.forward(x[..., None])
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 11\), received ids from 0 to 11"):
        model.forward(np.full((1, 3), VOCAB) - np.array([[VOCAB, 0, 0]]))
    with pytest.raises(ValueError, match="received ids from -1"):
        model.forward(-np.ones((1, 2), dtype=np.int64))


def test_bad_options_are_user_errors():
    with pytest.raises(UserError, match="d_model 10 must be a multiple of n_head 3"):
        build_model("gpt", (8,), 11, d_model=10, n_head=3)
    with pytest.raises(UserError, match="context 16 does not match the data's 8 positions"):
        build_model("gpt", (8,), 11, context=16)
    with pytest.raises(UserError, match="gpt needs token windows"):
        build_model("gpt", (1, 8, 8), 11)
    with pytest.raises(UserError, match="bad option widths"):
        build_model("gpt", (8,), 11, widths=(3,))
    with pytest.raises(UserError, match="n_layer must be at least 1"):
        build_model("gpt", (8,), 11, n_layer=0)
    with pytest.raises(UserError, match=r"dropout must be in \[0, 1\)"):
        build_model("gpt", (8,), 11, dropout=1.0)
    assert build_model("gpt", (8,), 11, context=8, **SMALL).num_params == small_count(8, 11, **SMALL)


def small_count(context, vocab, n_layer, n_head, d_model):
    """Parameters of nanoGPT's GPT, counted by hand: per block two LayerNorms (2d each), c_attn
    (d x 3d + 3d), c_proj (d x d + d), c_fc (d x 4d + 4d), c_proj (4d x d + d); embeddings
    (vocab + context) x d; the final LayerNorm 2d; the tied head nothing."""
    d = d_model
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return n_layer * block + (vocab + context) * d + 2 * d


def test_the_preset_size():
    """The byte-level preset: vocab 256, context 128, the default sizes (4 layers, 6 heads, 192 wide)."""
    model = build_model("gpt", (128,), 256)
    assert model.num_params == small_count(128, 256, 4, 6, 192) == 1_853_568


def test_layout_names_decay_and_the_tied_weight_first():
    model = small_gpt()
    names = [s.name for s in model.flat.specs]
    assert names[:4] == ["wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias"]
    assert names[-2:] == ["ln_f.weight", "ln_f.bias"] and "lm_head.weight" not in names
    assert model.flat.spec("wte.weight").offset == 0
    assert "h.1.mlp.c_proj.weight" in names and "h.1.attn.c_attn.bias" in names
    mask = model.flat.decay_mask()
    linear_weights = ("c_attn.weight", "c_proj.weight", "c_fc.weight")
    for spec in model.flat.specs:
        expected = 1.0 if spec.name.endswith(linear_weights) else 0.0
        assert np.all(mask[spec.offset:spec.offset + spec.size] == expected), spec.name
    assert [layer.name for layer in model.layers] == ["wte", "wpe", "h.0", "h.1", "ln_f", "lm_head"]
    assert [layer.name for layer in small_gpt(dropout=0.1).layers][:3] == ["wte", "wpe", "drop"]


def test_initialisation_is_nanogpts():
    model = build_model("gpt", (64,), 256, n_layer=4, n_head=4, d_model=128, seed=1)
    view = model.flat.view
    residual_std = 0.02 / math.sqrt(2 * 4)
    for name, std in (("wte.weight", 0.02), ("wpe.weight", 0.02), ("h.0.attn.c_attn.weight", 0.02),
                      ("h.3.mlp.c_fc.weight", 0.02), ("h.1.attn.c_proj.weight", residual_std),
                      ("h.2.mlp.c_proj.weight", residual_std)):
        w = view(name)
        assert abs(float(w.mean())) < 0.1 * std and abs(float(w.std()) / std - 1) < 0.05, name
    for spec in model.flat.specs:
        if spec.name.endswith("bias"):
            assert np.all(view(spec.name) == 0), spec.name
        if spec.name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            assert np.all(view(spec.name) == 1), spec.name
    np.testing.assert_array_equal(build_model("gpt", (64,), 256, n_layer=4, n_head=4, d_model=128, seed=1).params,
                                  model.params)                              # seeded


def test_grads_reported_ready_are_final_with_the_tied_head():
    """``grads_ready(offset)``: ``grads[offset:]`` never changes afterwards. The tied weight (offset
    0) gets the head's part first and the embedding's last, so offset 0 comes only at the end."""
    model = small_gpt()
    x, y = tokens()
    seen = []
    wte_size = model.flat.spec("wte.weight").size

    def ready(offset):
        seen.append((offset, model.grads[offset:].copy(), model.grads[:wte_size].copy()))

    model.grads_ready = ready
    model.loss_and_grad(x, y)
    final = model.grads.copy()
    assert len(seen) == len(model.layers)
    for offset, snapshot, _ in seen:
        np.testing.assert_array_equal(snapshot, final[offset:], err_msg=f"grads[{offset}:] changed after ready")
    assert seen[-1][0] == 0 and all(offset > 0 for offset, *_ in seen[:-1])
    # the tied weight did change after the head's report: reporting it then would have been wrong
    head_report = seen[0][2]
    assert not np.allclose(head_report, final[:wte_size])


def test_bucketed_allreduce_posts_only_final_gradients():
    """The overlap (ssdmpi/algos/overlap.py) with one-byte buckets posts each layer's slice as soon as
    it is reported; every posted slice equals the final gradient."""
    from ssdmpi.algos.overlap import BackwardAllreduce

    class RecordingComm:
        def __init__(self):
            self.posted = []

        def allreduce_start(self, part, average=False):
            self.posted.append((part, part.copy()))
            return self

        def wait(self):
            pass

    model = small_gpt()
    comm = RecordingComm()
    overlap = BackwardAllreduce(model, comm, bucket_bytes=1)
    x, y = tokens()
    overlap.start()
    model.loss_and_grad(x, y)
    overlap.finish().wait()
    assert len(comm.posted) == len(set(model.layer_offsets) - {model.num_params})
    covered = 0
    for part, at_post in comm.posted:
        np.testing.assert_array_equal(at_post, part)
        covered += part.size
    assert covered == model.num_params


def test_dropout_is_off_in_evaluation_and_seeded_in_training():
    plain = small_gpt()
    dropped = small_gpt(dropout=0.5)
    np.testing.assert_array_equal(plain.params, dropped.params)             # dropout adds no parameters
    x, y = tokens()
    np.testing.assert_array_equal(dropped.forward(x, train=False), plain.forward(x, train=False))
    assert dropped.evaluate(x, y) == plain.evaluate(x, y)
    assert not np.allclose(dropped.forward(x, train=True), plain.forward(x, train=True))
    keys = set(dropped.buffers())
    assert {"drop.rng_state", "h.0.attn.attn_dropout.rng_state", "h.0.attn.resid_dropout.rng_state",
            "h.1.mlp.dropout.rng_state"} <= keys and not plain.buffers()


def test_dropout_resumes_bit_for_bit():
    def run(model, x, y, steps):
        for _ in range(steps):
            model.loss_and_grad(x, y)
            model.params -= 0.1 * model.grads
        return model.params.copy()

    x, y = tokens(n=4)
    straight = run(small_gpt(np.float32, seed=1, dropout=0.3), x, y, 4)
    first = small_gpt(np.float32, seed=1, dropout=0.3)
    run(first, x, y, 2)
    params, buffers = first.params.copy(), {k: np.array(v, copy=True) for k, v in first.buffers().items()}
    resumed = small_gpt(np.float32, seed=7, dropout=0.3)
    resumed.params = params
    resumed.load_buffers(buffers)
    np.testing.assert_array_equal(run(resumed, x, y, 2), straight)
    other = small_gpt(np.float32, seed=1, dropout=0.3)
    other.seed_dropout(99)
    assert not np.array_equal(run(other, x, y, 4), straight)


def test_float32_forward_and_gradients_are_close_to_float64():
    exact = small_gpt(np.float64)
    single = small_gpt(np.float32)
    np.testing.assert_array_equal(single.params, exact.params.astype(np.float32))
    exact.params = single.params.astype(np.float64)
    x, y = tokens(n=4)
    l32, l64 = single.forward(x, train=False), exact.forward(x, train=False)
    assert l32.dtype == np.float32
    np.testing.assert_allclose(l32, l64, rtol=1e-4, atol=1e-5 * np.abs(l64).max())
    single.loss_and_grad(x, y)
    exact.loss_and_grad(x, y)
    assert single.grads.dtype == np.float32
    rel = np.linalg.norm(single.grads - exact.grads) / np.linalg.norm(exact.grads)
    assert rel < 1e-4


def test_no_float64_anywhere_in_a_float32_step():
    model = small_gpt(np.float32, dropout=0.1)
    seen = []
    for full, layer in model.named_layers:
        for method in ("forward", "backward"):
            original = getattr(layer, method)

            def traced(a, *args, _original=original, _where=f"{full}.{method}", **kwargs):
                out = _original(a, *args, **kwargs)
                seen.append((_where, out.dtype if out is not None else None))
                return out
            setattr(layer, method, traced)
    x, y = tokens()
    model.loss_and_grad(x, y)
    assert len(seen) > 2 * len(model.layers)
    wrong = [s for s in seen if s[1] not in (None, np.float32)]
    assert not wrong, wrong


def test_cupy_matches_numpy():
    from ssdmpi import backend

    cupy, why = backend.probe_cupy()
    if cupy is None:
        pytest.skip(f"no GPU for the CuPy path: {why}")
    x, y = tokens(n=4)
    for dtype, rtol in ((np.float32, 2e-3), (np.float64, 1e-9)):
        cpu = small_gpt(dtype, dropout=0.2)
        gpu = build_model("gpt", (CONTEXT,), VOCAB, xp=cupy, dtype=dtype, seed=0, dropout=0.2, **SMALL)
        loss_c = cpu.loss_and_grad(x, y)
        loss_g = gpu.loss_and_grad(cupy.asarray(x), cupy.asarray(y))
        assert abs(float(loss_g) - loss_c) <= rtol * abs(loss_c)
        np.testing.assert_allclose(backend.to_host(gpu.grads), cpu.grads, rtol=rtol,
                                   atol=rtol * float(np.abs(cpu.grads).max()))
