"""The model registry, the flat-buffer contract, whole-model gradient checks, state export, bad input."""

import numpy as np
import pytest

from ssdmpi.errors import UserError
from ssdmpi.nn import MODELS, build_model
from ssdmpi.verify.gradcheck import check_model

TOLERANCE = 1e-6


def batch(shape, n=4, classes=3, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n,) + tuple(shape)).astype(dtype), rng.integers(0, classes, size=n)


# (id, name, per-sample input, options). Small inputs keep the float64 checks fast.
GRADCHECK_MODELS = [
    ("mlp-image", "mlp", (1, 4, 4), {"widths": (6, 5)}),
    ("mlp-dropout", "mlp", (7,), {"widths": (6,), "dropout": 0.3}),
    ("wide-mlp", "wide-mlp", (5,), {"widths": (8, 8)}),
    ("lenet5-digits", "lenet5", (1, 8, 8), {}),
    ("lenet5-12px", "lenet5", (1, 12, 12), {}),
    ("resnet20-A", "resnet20", (3, 8, 8), {}),
    ("resnet20-B", "resnet20", (3, 8, 8), {"shortcut": "B"}),
]


@pytest.mark.parametrize("name, shape, options", [c[1:] for c in GRADCHECK_MODELS],
                         ids=[c[0] for c in GRADCHECK_MODELS])
def test_model_gradients_match_finite_differences(name, shape, options):
    model = build_model(name, shape, 3, dtype=np.float64, seed=0, **options)
    x, labels = batch(shape)
    errors = check_model(model, x, labels, coords=2)
    assert set(errors) == {spec.name for spec in model.flat.specs}      # every tensor checked
    bad = {k: v for k, v in errors.items() if not v < TOLERANCE}
    assert not bad, f"relative errors above {TOLERANCE}: {bad}"


def test_registry_names_and_unknown_model():
    assert set(MODELS) == {"mlp", "wide-mlp", "lenet5", "resnet20", "gpt"}
    with pytest.raises(UserError, match="unknown model 'vgg'; choose one of gpt, lenet5, mlp, resnet20, wide-mlp"):
        build_model("vgg", (3, 32, 32), 10)
    with pytest.raises(UserError, match="bad option"):
        build_model("lenet5", (1, 28, 28), 10, widths=(3,))
    with pytest.raises(UserError, match="resnet20 needs image inputs"):
        build_model("resnet20", (784,), 10)


@pytest.mark.parametrize("name, shape, options, count", [
    ("mlp", (1, 28, 28), {"widths": (512, 512)}, 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10),
    ("lenet5", (1, 28, 28), {}, 61706),        # the classic 400-120-84 LeNet-5
    ("lenet5", (1, 8, 8), {}, 21386),
    ("lenet5", (3, 32, 32), {}, 83126),
    ("resnet20", (3, 32, 32), {}, 269722),     # the paper's "0.27 M"
    ("resnet20", (3, 32, 32), {"shortcut": "B"}, 272474),
])
def test_parameter_counts(name, shape, options, count):
    assert build_model(name, shape, 10, **options).num_params == count


def test_wide_mlp_preset_is_two_4096_layers():
    from ssdmpi.nn.models import WIDE_MLP_WIDTHS
    # building the 20 M-parameter model takes seconds; check the preset and its structure on a tiny width
    assert WIDE_MLP_WIDTHS == (4096, 4096)    # 784 inputs: 20,037,642 parameters
    model = build_model("wide-mlp", (3,), 2, widths=(4, 4))
    assert model.name == "wide-mlp" and model.num_params == 3 * 4 + 4 + 4 * 4 + 4 + 4 * 2 + 2


def test_flat_buffers_are_one_array_with_views_in_declared_order():
    model = build_model("resnet20", (3, 8, 8), 10)
    assert model.params.ndim == 1 and model.params.size == model.num_params and model.params.dtype == np.float32
    assert model.grads.shape == model.params.shape
    offset = 0
    for spec in model.flat.specs:
        assert spec.offset == offset
        offset += spec.size
    assert offset == model.num_params
    names = [s.name for s in model.flat.specs]
    assert names[:2] == ["conv1.weight", "bn1.weight"] and names[-2:] == ["fc.weight", "fc.bias"]
    assert "layer2.0.conv1.weight" in names
    # a layer's tensor IS a view: writing the flat buffer changes what the layer computes with
    view = model.flat.view("fc.bias")
    model.params[model.flat.spec("fc.bias").offset] = 42.0
    assert view[0] == 42.0


def test_decay_mask_covers_weights_and_bn_gamma_only():
    model = build_model("resnet20", (3, 8, 8), 10, shortcut="B")
    mask = model.flat.decay_mask()
    for spec in model.flat.specs:
        part = mask[spec.offset:spec.offset + spec.size]
        expected = 1.0 if spec.name.endswith("weight") else 0.0     # conv/fc/BN weight (gamma): yes; biases, beta: no
        assert np.all(part == expected), spec.name
    bn = model.flat.spec("layer1.0.bn1.weight")
    assert bn.decay and not model.flat.spec("layer1.0.bn1.bias").decay


def test_loss_and_grad_overwrites_and_returns_the_mean():
    model = build_model("mlp", (6,), 3, dtype=np.float64, widths=(5,))
    x, labels = batch((6,), n=8)
    loss = model.loss_and_grad(x, labels)
    first = model.grads.copy()
    model.loss_and_grad(x, labels)
    np.testing.assert_array_equal(model.grads, first)                  # not accumulated
    # the mean: the gradient of the full batch is the mean of the two halves' gradients
    model.loss_and_grad(x[:4], labels[:4])
    half1 = model.grads.copy()
    loss2 = model.loss_and_grad(x[4:], labels[4:])
    np.testing.assert_allclose((half1 + model.grads) / 2, first, rtol=1e-12, atol=1e-15)
    loss_sum, correct = model.evaluate(x, labels)
    assert abs(loss_sum / 8 - loss) < 1e-12 and 0 <= correct <= 8
    assert loss2 > 0


def test_float32_in_float32_out():
    model = build_model("resnet20", (3, 8, 8), 10)
    x, labels = batch((3, 8, 8), dtype=np.float32, classes=10)
    logits = model.forward(x)
    assert logits.dtype == np.float32 and logits.shape == (4, 10)
    model.loss_and_grad(x, labels)
    assert model.grads.dtype == np.float32 and np.all(np.isfinite(model.grads))


def test_forward_does_not_modify_the_input():
    for name, shape in (("mlp", (1, 5, 5)), ("lenet5", (1, 8, 8)), ("resnet20", (3, 8, 8))):
        model = build_model(name, shape, 10)
        x, labels = batch(shape, dtype=np.float32, classes=10)
        before = x.copy()
        model.loss_and_grad(x, labels)
        np.testing.assert_array_equal(x, before)


def test_same_seed_same_weights_and_different_seed_different():
    a = build_model("lenet5", (1, 8, 8), 10, seed=3)
    b = build_model("lenet5", (1, 8, 8), 10, seed=3)
    c = build_model("lenet5", (1, 8, 8), 10, seed=4)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)


def test_bn_running_statistics_export_import_round_trip():
    model = build_model("resnet20", (3, 8, 8), 10, seed=0)
    x, labels = batch((3, 8, 8), n=6, dtype=np.float32, classes=10)
    model.loss_and_grad(x, labels)                                    # moves the running statistics
    state = {k: np.array(v, copy=True) for k, v in model.buffers().items()}
    assert "layer3.2.bn2.running_var" in state and len(state) == 2 * 19
    assert not np.allclose(state["bn1.running_mean"], 0)
    reference = model.forward(x, train=False)

    fresh = build_model("resnet20", (3, 8, 8), 10, seed=0)
    fresh.params = model.params
    assert not np.allclose(fresh.forward(x, train=False), reference)  # default statistics differ
    fresh.load_buffers(state)
    np.testing.assert_array_equal(fresh.forward(x, train=False), reference)
    with pytest.raises(KeyError, match="bn1.running_mean"):
        fresh.load_buffers({k: v for k, v in state.items() if k != "bn1.running_mean"})


def test_bn_running_statistics_follow_pytorch_momentum():
    """running = 0.9 * running + 0.1 * batch statistic (variance unbiased), from (0, 1)."""
    model = build_model("resnet20", (3, 6, 6), 10, dtype=np.float64)
    x, labels = batch((3, 6, 6), n=5, classes=10)
    model.forward(x)
    conv_out = model.layers[1].forward(model.layers[0].forward(x))   # conv1 on the channel-major batch
    per_channel = conv_out.reshape(16, -1)
    np.testing.assert_allclose(model.buffers()["bn1.running_mean"], 0.1 * per_channel.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(model.buffers()["bn1.running_var"], 0.9 + 0.1 * per_channel.var(axis=1, ddof=1),
                               rtol=1e-12)


def test_dropout_is_seeded_and_resumes_bit_for_bit():
    def run(model, x, labels, steps):
        out = []
        for _ in range(steps):
            model.loss_and_grad(x, labels)
            model.params -= 0.1 * model.grads
            out.append(model.params.copy())
        return out

    x, labels = batch((7,), n=16, dtype=np.float32)
    a = build_model("mlp", (7,), 3, widths=(32,), dropout=0.5, seed=1)
    b = build_model("mlp", (7,), 3, widths=(32,), dropout=0.5, seed=1)
    straight = run(a, x, labels, 4)
    np.testing.assert_array_equal(run(b, x, labels, 4)[-1], straight[-1])   # same seed, same masks

    # resume: run 2 steps, save params + buffers (incl. the Dropout RNG state), restore into a new model
    c = build_model("mlp", (7,), 3, widths=(32,), dropout=0.5, seed=1)
    run(c, x, labels, 2)
    saved_params, saved_buffers = c.params.copy(), {k: np.array(v, copy=True) for k, v in c.buffers().items()}
    assert saved_buffers["dropout1.rng_state"].dtype == np.uint64
    d = build_model("mlp", (7,), 3, widths=(32,), dropout=0.5, seed=99)
    d.params = saved_params
    d.load_buffers(saved_buffers)
    np.testing.assert_array_equal(run(d, x, labels, 2)[-1], straight[-1])

    # a different dropout seed gives different masks; evaluation is deterministic (no dropout)
    e = build_model("mlp", (7,), 3, widths=(32,), dropout=0.5, seed=1)
    e.seed_dropout(1234)
    assert not np.array_equal(run(e, x, labels, 1)[-1], straight[0])
    np.testing.assert_array_equal(a.forward(x, train=False), a.forward(x, train=False))


@pytest.mark.parametrize("name, shape, bad_shape, first", [
    ("mlp", (1, 28, 28), (4, 784), "mlp.fc1"),
    ("lenet5", (1, 28, 28), (4, 3, 28, 28), "lenet5.conv1"),
    ("resnet20", (3, 32, 32), (4, 32, 32, 3), "resnet20.conv1"),
])
def test_wrong_shape_raises_value_error_naming_layer_expected_and_received(name, shape, bad_shape, first):
    model = build_model(name, shape, 10)
    expected = ", ".join(map(str, shape))
    with pytest.raises(ValueError, match=rf"^{first}: expected input of shape \(batch, {expected}\), "
                                         rf"received \({', '.join(map(str, bad_shape))}\)"):
        model.forward(np.zeros(bad_shape, dtype=np.float32))


def test_wrong_dtype_raises_value_error():
    model = build_model("mlp", (1, 28, 28), 10)
    with pytest.raises(ValueError, match=r"mlp.fc1: expected input of dtype float32, received float64 "
                                         r"\(shape \(2, 1, 28, 28\)\)"):
        model.forward(np.zeros((2, 1, 28, 28)))
    with pytest.raises(ValueError, match="received int64"):
        model.loss_and_grad(np.zeros((2, 1, 28, 28), dtype=np.int64), np.zeros(2, dtype=np.int64))


def test_lenet5_adapts_to_small_images():
    assert build_model("lenet5", (1, 8, 8), 10).layers[4].padding == 2       # conv2 pads on 8x8 digits
    assert build_model("lenet5", (1, 28, 28), 10).layers[4].padding == 0     # classic on 28x28
    with pytest.raises(UserError, match="at least 4x4"):
        build_model("lenet5", (1, 3, 3), 10)


def test_evaluation_leaves_bn_statistics_and_gradients_alone():
    model = build_model("resnet20", (3, 8, 8), 10)
    x, labels = batch((3, 8, 8), dtype=np.float32, classes=10)
    model.loss_and_grad(x, labels)
    stats = {k: np.array(v, copy=True) for k, v in model.buffers().items()}
    grads = model.grads.copy()
    model.evaluate(x, labels)
    model.forward(x, train=False)
    for key, value in model.buffers().items():
        np.testing.assert_array_equal(value, stats[key])
    np.testing.assert_array_equal(model.grads, grads)


@pytest.mark.parametrize("name, shape", [("mlp", (1, 6, 6)), ("lenet5", (1, 8, 8)), ("resnet20", (3, 8, 8))])
def test_no_float64_upcast_anywhere_in_a_float32_step(name, shape):
    """Every activation and every input gradient of every layer stays float32."""
    model = build_model(name, shape, 10, dropout=0.2) if name == "mlp" else build_model(name, shape, 10)
    seen = []
    for full, layer in model.named_layers:
        for method in ("forward", "backward"):
            original = getattr(layer, method)

            def traced(a, *args, _original=original, _where=f"{full}.{method}", **kwargs):
                out = _original(a, *args, **kwargs)
                seen.append((_where, a.dtype, None if out is None else out.dtype))
                return out
            setattr(layer, method, traced)
    x, labels = batch(shape, dtype=np.float32, classes=10)
    model.loss_and_grad(x, labels)
    assert len(seen) > 2 * len(model.layers) - 2
    wrong = [s for s in seen if s[1] != np.float32 or s[2] not in (None, np.float32)]
    assert not wrong, wrong


def test_assigning_params_copies_into_the_flat_buffer():
    model = build_model("mlp", (4,), 2, widths=(3,))
    buffer, view = model.params, model.flat.view("fc1.weight")
    model.params = np.zeros(model.num_params, dtype=np.float32)
    assert model.params is buffer and np.all(view == 0)          # layers still see the same memory
    model.params += 1.0
    assert model.params is buffer and np.all(view == 1)
