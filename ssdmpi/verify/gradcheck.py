"""Finite-difference gradient checks (float64) for layers and models.

Central differences, ``(f(t + eps) - f(t - eps)) / (2 eps)``, on chosen coordinates,
compared with the analytic gradient by the norm-wise relative error
``||a - n|| / (||a|| + ||n||)`` (0 when both vanish). Used by the unit tests; also
handy when writing a new layer.
"""

from __future__ import annotations

import numpy as np

from ssdmpi.nn.loss import softmax_cross_entropy
from ssdmpi.nn.model import Model, walk


def relative_error(analytic, numeric) -> float:
    a, n = np.asarray(analytic, dtype=np.float64), np.asarray(numeric, dtype=np.float64)
    denom = np.linalg.norm(a) + np.linalg.norm(n)
    return 0.0 if denom == 0 else float(np.linalg.norm(a - n) / denom)


def _central_difference(f, array, indices, eps):
    flat = array.reshape(-1)
    out = np.empty(len(indices))
    for k, i in enumerate(indices):
        saved = flat[i]
        flat[i] = saved + eps
        up = f()
        flat[i] = saved - eps
        down = f()
        flat[i] = saved
        out[k] = (up - down) / (2 * eps)
    return out


def _pick(size: int, count: int | None, rng) -> np.ndarray:
    if count is None or count >= size:
        return np.arange(size)
    return np.sort(rng.choice(size, size=count, replace=False))


def check_layer(layer, input_shape, batch: int = 3, seed: int = 0, eps: float = 1e-6,
                coords: int | None = 40, train: bool = True) -> dict:
    """Relative errors of ``layer``'s input gradient (``"input"``) and of each parameter tensor.

    The layer is wrapped in a float64 :class:`Model` (to own flat buffers), fed a
    random batch of per-sample ``input_shape`` (channel-major for layers marked
    ``channel_major``), and checked on the scalar
    ``sum(forward(x) * R)`` for a fixed random ``R``. Non-parameter state (BN
    running statistics, Dropout's generator) is restored before every forward, so
    each evaluation sees the same function. ``coords`` limits the coordinates
    checked per tensor (None: all).
    """
    rng = np.random.default_rng(seed)
    model = Model([layer], input_shape, dtype=np.float64, seed=seed)
    for _, lay in walk([layer]):
        lay.input_grad = True
    if len(input_shape) == 3 and getattr(layer, "channel_major", False):
        x = rng.normal(size=tuple(input_shape) + (batch,))   # channel-major (C, H, W, N) images
    else:
        x = rng.normal(size=(batch,) + tuple(input_shape))
    state = {k: np.array(v, copy=True) for k, v in model.buffers().items()}
    proj = rng.normal(size=layer.forward(x.copy(), train).shape)

    def f():
        model.load_buffers(state)
        return float(np.sum(layer.forward(x.copy(), train) * proj))

    f()
    model.load_buffers(state)
    layer.forward(x.copy(), train)
    dx = layer.backward(proj.copy())
    errors = {}
    idx = _pick(x.size, coords, rng)
    errors["input"] = relative_error(np.asarray(dx).reshape(-1)[idx], _central_difference(f, x, idx, eps))
    analytic = model.grads.copy()
    for spec in model.flat.specs:
        idx = _pick(spec.size, coords, rng) + spec.offset
        errors[spec.name] = relative_error(analytic[idx], _central_difference(f, model.params, idx, eps))
    return errors


def check_model(model: Model, x, labels, seed: int = 0, eps: float = 1e-6, coords: int | None = 4) -> dict:
    """Relative error of ``loss_and_grad``'s gradient per parameter tensor (``coords`` coordinates each).

    ``model`` must be float64. Buffers are restored before every evaluation.
    """
    if model.dtype != np.float64:
        raise ValueError("gradient checks need a float64 model (build_model(..., dtype=np.float64))")
    rng = np.random.default_rng(seed)
    state = {k: np.array(v, copy=True) for k, v in model.buffers().items()}

    def f():   # the loss only: no backward needed for the numeric side
        model.load_buffers(state)
        logits = model.forward(x, train=True)
        return softmax_cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))[0]

    model.loss_and_grad(x, labels)
    analytic = model.grads.copy()
    errors = {}
    for spec in model.flat.specs:
        idx = _pick(spec.size, coords, rng) + spec.offset
        errors[spec.name] = relative_error(analytic[idx], _central_difference(f, model.params, idx, eps))
    return errors


def check_token_layer(layer, context: int, vocab: int, batch: int = 3, seed: int = 0, eps: float = 1e-6,
                      coords: int | None = 40, train: bool = True) -> dict:
    """Relative errors of each parameter tensor of a layer that takes token ids ``(batch, context)``
    (a :class:`~ssdmpi.nn.embedding.TokenEmbedding`): like :func:`check_layer`, on
    ``sum(forward(ids) * R)``, without an input gradient (ids are not differentiable)."""
    rng = np.random.default_rng(seed)
    model = Model([layer], (context,), dtype=np.float64, seed=seed, input_kind="tokens")
    ids = rng.integers(0, vocab, size=(batch, context))
    proj = rng.normal(size=layer.forward(ids, train).shape)

    def f():
        return float(np.sum(layer.forward(ids, train) * proj))

    layer.forward(ids, train)
    layer.backward(proj.copy())
    analytic = model.grads.copy()
    errors = {}
    for spec in model.flat.specs:
        idx = _pick(spec.size, coords, rng) + spec.offset
        errors[spec.name] = relative_error(analytic[idx], _central_difference(f, model.params, idx, eps))
    return errors
