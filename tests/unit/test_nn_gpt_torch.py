"""PyTorch as the oracle of the gpt model: a plain nanoGPT module (``ssdmpi/verify/torch_gpt.py``)
with the same weights gives the same outputs and gradients, layer by layer and for the whole model.

Tolerances: in float64 the two agree to rounding (elementwise rtol 1e-10, with an absolute floor
of 1e-10 times the tensor's largest value, as sums of mixed signs cancel); in float32, against
PyTorch float32, elementwise 1e-4 of the tensor's scale for logits and every gradient. The
attention twin runs both ways nanoGPT does: PyTorch's fused ``scaled_dot_product_attention``
and the explicit masked softmax. Skipped without PyTorch (a test oracle only).
"""

import numpy as np
import pytest

from ssdmpi.nn import Model, build_model
from ssdmpi.nn.attention import CausalSelfAttention
from ssdmpi.nn.norm import LayerNorm
from ssdmpi.nn.transformer import GELU, MLP, NANOGPT_TIED, Block, nanogpt_name

torch = pytest.importorskip("torch", reason="PyTorch (the test oracle) is not installed")
F = torch.nn.functional

from ssdmpi.verify import torch_gpt  # noqa: E402  (after the skip: it needs torch at call time)

RTOL64 = 1e-10
RTOL32 = 1e-4
VOCAB, CONTEXT = 13, 8
SMALL = {"n_layer": 2, "n_head": 2, "d_model": 8}


def _close(ours, theirs, rtol, what):
    theirs = np.asarray(theirs)
    scale = float(np.abs(theirs).max()) or 1.0
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=rtol * scale, err_msg=what)


def _strip(name):
    """A layer twin's names: the ssdmpi name without the layer's own (``attn.c_attn.weight`` -> ``c_attn.weight``)."""
    return name.split(".", 1)[1]


def _config(dim=8, heads=2, context=6, attention="sdpa"):
    from types import SimpleNamespace
    return SimpleNamespace(n_embd=dim, n_head=heads, block_size=context, dropout=0.0, attention=attention,
                           n_layer=2, vocab_size=VOCAB)


def _layer_twin(make_layer, make_twin, shape, batch=3):
    """Both layers on the same random weights, input and output gradient, float64: outputs, input
    gradients and every parameter gradient."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    layer = make_layer()
    model = Model([layer], shape, dtype=np.float64)
    layer.input_grad = True
    model.params = rng.normal(0.0, 0.5, size=model.num_params)       # not the init: no special values
    twin = make_twin().double()
    torch_gpt.copy_to_torch(model, twin, _strip)
    x = rng.normal(size=(batch,) + shape)
    dy = rng.normal(size=(batch,) + shape)
    out = layer.forward(x.copy())
    dx = layer.backward(dy.copy())
    tx = torch.from_numpy(x.copy()).requires_grad_()
    tout = twin(tx)
    (tout * torch.from_numpy(dy)).sum().backward()
    _close(out, tout.detach().numpy(), RTOL64, "output")
    _close(dx, tx.grad.numpy(), RTOL64, "input gradient")
    theirs = torch_gpt.torch_grads(model, twin, _strip)
    for spec in model.flat.specs:
        sl = slice(spec.offset, spec.offset + spec.size)
        _close(model.grads[sl], theirs[sl], RTOL64, spec.name)
    return model


LAYERS = [
    ("layernorm", lambda: LayerNorm(8, name="ln"), lambda: torch.nn.LayerNorm(8), (6, 8)),
    ("gelu-tanh", lambda: GELU(), lambda: torch.nn.GELU(approximate="tanh"), (6, 8)),
    ("mlp", lambda: MLP(8, name="mlp"), lambda: torch_gpt.modules().MLP(_config()), (6, 8)),
    ("attention-sdpa", lambda: CausalSelfAttention(8, 2, 6, name="attn"),
     lambda: torch_gpt.modules().CausalSelfAttention(_config()), (6, 8)),
    ("attention-math", lambda: CausalSelfAttention(8, 2, 6, name="attn"),
     lambda: torch_gpt.modules().CausalSelfAttention(_config(attention="math")), (6, 8)),
    ("attention-4-heads-short", lambda: CausalSelfAttention(8, 4, 6, name="attn"),
     lambda: torch_gpt.modules().CausalSelfAttention(_config(heads=4, attention="math")), (4, 8)),
    ("block", lambda: Block(8, 2, 6, n_layer=2, name="h"), lambda: torch_gpt.modules().Block(_config()), (6, 8)),
]


@pytest.mark.parametrize("make_layer, make_twin, shape", [c[1:] for c in LAYERS], ids=[c[0] for c in LAYERS])
def test_layer_matches_pytorch_float64(make_layer, make_twin, shape):
    _layer_twin(make_layer, make_twin, shape)


def _gpt_step(model, x, y, attention):
    """The twin's loss, logits (train mode) and flat gradients for one batch."""
    torch.set_num_threads(1)
    twin = torch_gpt.build_torch_gpt(model, attention)
    logits = twin(torch.from_numpy(x))
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1))
    loss.backward()
    return float(loss.detach()), logits.detach().numpy(), torch_gpt.torch_grads(model, twin)


def _batch(n=4, t=CONTEXT, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, size=(n, t)), rng.integers(0, VOCAB, size=(n, t))


@pytest.mark.parametrize("attention", ["sdpa", "math"])
@pytest.mark.parametrize("t", [CONTEXT, 5])
def test_gpt_matches_pytorch_float64(attention, t):
    model = build_model("gpt", (CONTEXT,), VOCAB, dtype=np.float64, seed=0, **SMALL)
    model.params = np.random.default_rng(1).normal(0.0, 0.2, size=model.num_params)
    x, y = _batch(t=t)
    t_loss, t_logits, t_grads = _gpt_step(model, x, y, attention)
    logits = model.forward(x, train=True)
    loss = model.loss_and_grad(x, y)
    assert abs(loss - t_loss) < 1e-12
    _close(logits, t_logits, RTOL64, "logits")
    for spec in model.flat.specs:
        sl = slice(spec.offset, spec.offset + spec.size)
        _close(model.grads[sl], t_grads[sl], RTOL64, spec.name)


def test_gpt_matches_pytorch_float32():
    """Float32 against PyTorch float32 at nanoGPT's initialisation, a longer context and more layers."""
    model = build_model("gpt", (32,), 64, seed=0, n_layer=3, n_head=4, d_model=32)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 64, size=(4, 32)), rng.integers(0, 64, size=(4, 32))
    t_loss, t_logits, t_grads = _gpt_step(model, x, y, "sdpa")
    logits = model.forward(x, train=True)
    loss = model.loss_and_grad(x, y)
    assert logits.dtype == np.float32 and model.grads.dtype == np.float32
    assert abs(loss - t_loss) <= 1e-5 * abs(t_loss)
    _close(logits, t_logits, RTOL32, "logits")
    for spec in model.flat.specs:
        sl = slice(spec.offset, spec.offset + spec.size)
        _close(model.grads[sl], t_grads[sl], RTOL32, spec.name)


def test_dropout_model_in_evaluation_matches_pytorch_eval():
    model = build_model("gpt", (CONTEXT,), VOCAB, dtype=np.float64, seed=0, dropout=0.3, **SMALL)
    twin = torch_gpt.build_torch_gpt(model).eval()
    x, _ = _batch()
    with torch.no_grad():
        _close(model.forward(x, train=False), twin(torch.from_numpy(x)).numpy(), RTOL64, "eval logits")


def test_state_dict_names_are_nanogpts():
    model = build_model("gpt", (CONTEXT,), VOCAB, **SMALL)
    twin = torch_gpt.build_torch_gpt(model)
    names = {nanogpt_name(spec.name) for spec in model.flat.specs}
    assert names | set(NANOGPT_TIED) == set(twin.state_dict())
    assert "transformer.h.1.attn.c_attn.weight" in names and "transformer.wte.weight" in names
    assert twin.lm_head.weight is twin.transformer.wte.weight                  # the twin ties as nanoGPT does
    for spec in model.flat.specs:
        assert tuple(twin.state_dict()[nanogpt_name(spec.name)].shape) == spec.shape, spec.name


def test_twin_detects_a_different_model():
    """The comparison can fail: perturb one ssdmpi weight after copying and the logits differ."""
    model = build_model("gpt", (CONTEXT,), VOCAB, dtype=np.float64, **SMALL)
    twin = torch_gpt.build_torch_gpt(model).eval()
    model.params[model.flat.spec("h.1.attn.c_attn.weight").offset + 3] += 0.5
    x, _ = _batch()
    with torch.no_grad():
        assert not np.allclose(model.forward(x, train=False), twin(torch.from_numpy(x)).numpy())
