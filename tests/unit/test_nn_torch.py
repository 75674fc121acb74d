"""PyTorch as the oracle: same weights, same batch -> same logits, loss, gradients and BN statistics.

PyTorch is a test oracle only (never imported by ssdmpi at run time); these tests
skip with a reason when it is not installed. ``build_torch_model`` builds the
twin with the same tensor names and copies the weights in.
"""

import numpy as np
import pytest

from ssdmpi.nn import build_model
from ssdmpi.verify.gradcheck import relative_error
from ssdmpi.verify.torch_ref import torch_available

HAVE_TORCH, WHY = torch_available()
pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason=f"PyTorch oracle unavailable: {WHY}")

CASES = [
    ("mlp", "mlp", (1, 28, 28), {"widths": (512, 512)}, 32),
    ("lenet5", "lenet5", (1, 28, 28), {}, 16),
    ("lenet5-digits", "lenet5", (1, 8, 8), {}, 16),
    ("resnet20", "resnet20", (3, 32, 32), {}, 8),
    ("resnet20-B", "resnet20", (3, 32, 32), {"shortcut": "B"}, 8),
]


def _torch_step(model, x, labels):
    """Loss, train-mode gradients (flat, ssdmpi order), then eval-mode logits and the twin's buffers."""
    import torch
    import torch.nn.functional as F

    from ssdmpi.verify.torch_ref import build_torch_model, torch_grads

    torch.set_num_threads(1)
    twin = build_torch_model(model)
    loss = F.cross_entropy(twin(torch.from_numpy(x.copy())), torch.from_numpy(labels))
    loss.backward()
    twin.eval()
    with torch.no_grad():
        logits = twin(torch.from_numpy(x.copy())).numpy()
    return float(loss.detach()), torch_grads(model, twin), logits, {k: v.numpy() for k, v in twin.state_dict().items()}


def _assert_close(ours, theirs, rtol, what):
    """Elementwise, with an absolute floor relative to the tensor's scale (sums of mixed signs cancel)."""
    scale = float(np.abs(theirs).max()) or 1.0
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=rtol * scale, err_msg=what)


def _inputs(shape, n):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n,) + shape).astype(np.float32), rng.integers(0, 10, size=n)


@pytest.mark.parametrize("name, shape, options, n", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_float32_matches_pytorch(name, shape, options, n):
    """ssdmpi in float32 against PyTorch in float32 and in float64 (the exact answer for the same
    float32 weights and batch).

    Forward outputs, loss and BN statistics match to float32 accuracy. Gradients of the
    plain networks do too, elementwise. In a ResNet a few pre-activations sit within float32
    rounding of a ReLU kink, so float32 and float64 can disagree about the sign of one
    activation and the gradient legitimately changes by ~1e-3 (PyTorch's float32 differs
    from the float64 answer in the same way); there the gradients are compared norm-wise.
    """
    x, labels = _inputs(shape, n)
    model = build_model(name, shape, 10, seed=0, **options)
    exact = build_model(name, shape, 10, dtype=np.float64, seed=0, **options)
    exact.params = model.params.astype(np.float64)

    # the twins copy the model's state, so they step first (before ssdmpi moves its BN statistics)
    t_loss, t_grads, t_logits, t_state = _torch_step(model, x, labels)               # PyTorch float32
    o_loss, o_grads, o_logits, o_state = _torch_step(exact, x.astype(np.float64), labels)   # float64 oracle
    loss = model.loss_and_grad(x, labels)
    logits = model.forward(x, train=False)

    assert abs(loss - t_loss) <= 1e-5 * max(1.0, abs(t_loss))
    assert abs(loss - o_loss) <= 1e-5 * max(1.0, abs(o_loss))
    _assert_close(logits, t_logits, 1e-4, "eval logits vs PyTorch float32")
    _assert_close(logits, o_logits, 1e-4, "eval logits vs float64 oracle")
    for spec in model.flat.specs:
        sl = slice(spec.offset, spec.offset + spec.size)
        if name == "resnet20":
            assert relative_error(model.grads[sl], o_grads[sl]) < 2e-2, f"gradient of {spec.name} vs float64"
            assert relative_error(model.grads[sl], t_grads[sl]) < 2e-2, f"gradient of {spec.name} vs PyTorch"
        else:
            _assert_close(model.grads[sl], o_grads[sl], 1e-4, f"gradient of {spec.name} vs float64 oracle")
            _assert_close(model.grads[sl], t_grads[sl], 1e-4, f"gradient of {spec.name} vs PyTorch float32")
    if name == "resnet20":
        assert relative_error(model.grads, o_grads) < 1e-2
    for key, value in model.buffers().items():
        _assert_close(value, t_state[key], 1e-4, key)


@pytest.mark.parametrize("name, shape, options, n", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_float64_matches_pytorch_to_rounding(name, shape, options, n):
    """In float64 the two agree to ~1e-14: any real difference (a wrong layer) would show here."""
    x, labels = _inputs(shape, n)
    model = build_model(name, shape, 10, dtype=np.float64, seed=0, **options)
    t_loss, t_grads, t_logits, t_state = _torch_step(model, x.astype(np.float64), labels)
    loss = model.loss_and_grad(x.astype(np.float64), labels)
    logits = model.forward(x.astype(np.float64), train=False)
    assert abs(loss - t_loss) < 1e-12
    np.testing.assert_allclose(logits, t_logits, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.grads, t_grads, rtol=1e-9, atol=1e-12 * np.abs(t_grads).max())
    for key, value in model.buffers().items():
        np.testing.assert_allclose(value, t_state[key], rtol=1e-12, atol=1e-15)


def test_twin_detects_a_different_model():
    """The comparison can fail: perturb one ssdmpi weight after copying and the logits differ."""
    import torch

    from ssdmpi.verify.torch_ref import build_torch_model

    model = build_model("lenet5", (1, 8, 8), 10, dtype=np.float64)
    twin = build_torch_model(model)
    model.params[model.flat.spec("conv2.weight").offset] += 0.5
    x = np.random.default_rng(0).normal(size=(4, 1, 8, 8))
    with torch.no_grad():
        assert not np.allclose(model.forward(x, train=False), twin.eval()(torch.from_numpy(x)).numpy())
