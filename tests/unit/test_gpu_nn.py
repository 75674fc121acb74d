"""NumPy vs CuPy: the same model, weights and batch give the same results on both backends.

Skipped (with the reason) where no GPU is usable. The models initialise on the
host with a seeded NumPy generator and Dropout draws its masks on the host, so
the two backends start from identical numbers and differ only by rounding.
"""

import numpy as np
import pytest

from ssdmpi import backend
from ssdmpi.nn import build_model

cupy, WHY_NOT = backend.probe_cupy()
pytestmark = pytest.mark.skipif(cupy is None, reason=f"no GPU for the CuPy path: {WHY_NOT}")

CASES = [
    ("mlp", (1, 28, 28), {"widths": (64, 32), "dropout": 0.25}),
    ("lenet5", (1, 28, 28), {}),
    ("lenet5", (1, 8, 8), {}),
    ("resnet20", (3, 32, 32), {}),
    ("resnet20", (3, 16, 16), {"shortcut": "B"}),
]


def _both(name, shape, options, dtype, n=16):
    cpu = build_model(name, shape, 10, xp=np, dtype=dtype, seed=3, **options)
    gpu = build_model(name, shape, 10, xp=cupy, dtype=dtype, seed=3, **options)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n,) + shape).astype(dtype)
    labels = rng.integers(0, 10, size=n)
    return cpu, gpu, x, labels


@pytest.mark.parametrize("name, shape, options", CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[1]))}" for c in CASES])
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-3), (np.float64, 1e-9)], ids=["float32", "float64"])
def test_cupy_matches_numpy(name, shape, options, dtype, rtol):
    cpu, gpu, x, labels = _both(name, shape, options, dtype)
    np.testing.assert_array_equal(backend.to_host(gpu.params), cpu.params)      # same initial weights
    assert isinstance(gpu.params, cupy.ndarray) and gpu.params.dtype == dtype

    loss_c = cpu.loss_and_grad(x, labels)
    loss_g = gpu.loss_and_grad(cupy.asarray(x), cupy.asarray(labels))
    assert abs(loss_c - loss_g) <= rtol * max(1.0, abs(loss_c))
    g_c, g_g = cpu.grads, backend.to_host(gpu.grads)
    # norm-wise: float32 ReLU kinks may flip single activations between backends (see test_nn_torch)
    assert np.linalg.norm(g_c - g_g) <= rtol * 10 * np.linalg.norm(g_c)
    for key, value in cpu.buffers().items():
        np.testing.assert_allclose(backend.to_host(gpu.buffers()[key]), value, rtol=rtol, atol=rtol)
    logits_c = cpu.forward(x, train=False)
    logits_g = backend.to_host(gpu.forward(cupy.asarray(x), train=False))
    np.testing.assert_allclose(logits_g, logits_c, rtol=rtol, atol=rtol * np.abs(logits_c).max())
    sum_c, correct_c = cpu.evaluate(x, labels)
    sum_g, correct_g = gpu.evaluate(cupy.asarray(x), cupy.asarray(labels))
    assert abs(sum_c - sum_g) <= rtol * max(1.0, abs(sum_c)) and abs(correct_c - correct_g) <= 1


def test_sgd_steps_stay_together():
    """Ten SGD steps on both backends (float64): the trajectories agree to rounding."""
    cpu, gpu, x, labels = _both("lenet5", (1, 8, 8), {}, np.float64)
    xg, lg = cupy.asarray(x), cupy.asarray(labels)
    for _ in range(10):
        cpu.loss_and_grad(x, labels)
        cpu.params -= 0.05 * cpu.grads
        gpu.loss_and_grad(xg, lg)
        gpu.params -= 0.05 * gpu.grads
    np.testing.assert_allclose(backend.to_host(gpu.params), cpu.params, rtol=1e-9, atol=1e-12)


def test_decay_mask_and_buffers_live_on_the_device():
    gpu = build_model("resnet20", (3, 8, 8), 10, xp=cupy)
    assert isinstance(gpu.flat.decay_mask(), cupy.ndarray)
    state = {k: backend.to_host(v) for k, v in gpu.buffers().items()}
    gpu.load_buffers(state)                               # host arrays load onto the device
    assert all(isinstance(v, cupy.ndarray) for v in gpu.buffers().values())
