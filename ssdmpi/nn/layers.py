"""Layers, each with its forward and backward side by side.

Layouts: a model takes NCHW images ``(batch, channels, height, width)`` or
vectors ``(batch, features)``. Inside convolutional models, image activations
are CHANNEL-MAJOR with the batch last, ``(channels, height, width, batch)``: a
model starts with :class:`ToChannelMajor` (a free transpose view), its
convolution, pooling and BatchNorm layers (class attribute ``channel_major =
True``) work on that layout -- it makes every convolution one GEMM for the whole
batch, with long contiguous runs in its im2col copies (see ``conv.py``) -- and
it ends with :class:`ToBatchMajor` (or global average pooling, which outputs
``(batch, C)``).
Shapes in ``output_shape`` are per sample (no batch axis), ``(C, H, W)`` for
images whatever the layout.

Contract of every layer:
- ``name``: unique among its siblings; a tensor's full name is the dotted path
  of layer names plus its local name, e.g. ``layer1.0.conv1.weight``.
- ``declare()`` lists the layer's OWN parameters as ``(name, shape, decay, init)``
  where ``init(rng) -> np.ndarray``; the model packs them into flat buffers and
  calls ``bind(params, grads)`` with dicts of views (local name -> array).
- ``children()`` lists sub-layers (composite layers such as residual blocks); the
  model walks the tree to declare, bind, reset and export every layer.
- ``forward(x, train)`` returns the output and keeps what backward needs.
- ``backward(dy)`` returns ``dx`` and WRITES (does not accumulate) the parameter
  gradients into the bound gradient views. When ``input_grad`` is False (the
  model sets it on its first parametrised layer, whose input is the data) it
  skips computing ``dx`` and returns None.
- Only ``ReLU`` (and ``Dropout``) overwrite ``dy`` in place; every other layer
  treats ``dy`` as read-only. ``ReLU`` also overwrites its forward input in
  place, so it must not be a model's first layer (the caller's batch).
- ``output_shape(input_shape)`` maps a per-sample shape to a per-sample shape and
  raises ``ValueError`` naming the layer when the input cannot be accepted.
- ``buffers()`` / ``load_buffers(d)``: non-parameter state (BN running statistics,
  Dropout's RNG state) by local name; ``reset_state(seed)`` re-initialises it.
- ``workspace``: the model's shared :class:`~ssdmpi.nn.workspace.Workspace` for
  transient scratch (a private one when the layer is used on its own).
"""

from __future__ import annotations

import numpy as np

from ssdmpi.nn import init as initializers
from ssdmpi.nn.workspace import Workspace


class Layer:
    """Base class: no parameters, identity shape, no state."""

    name = "layer"
    input_grad = True
    _workspace = None
    # Set by ``Model.backward`` while ``Model.grads_ready`` is armed: a layer whose backward writes its
    # parameter gradients before its input gradient (Linear) calls it in between, so their allreduce
    # can start while the input gradient is computed.
    params_done = None

    def declare(self):
        return []

    def children(self):
        return []

    def bind(self, params: dict, grads: dict) -> None:
        self.p, self.g = params, grads

    @property
    def workspace(self) -> Workspace:
        if self._workspace is None:
            self._workspace = Workspace()
        return self._workspace

    @workspace.setter
    def workspace(self, ws: Workspace) -> None:
        self._workspace = ws

    def output_shape(self, input_shape):
        return tuple(input_shape)

    def forward(self, x, train: bool = True):
        return x

    def backward(self, dy):
        return dy

    def buffers(self) -> dict:
        """Non-parameter state (e.g. BN running statistics) by local name."""
        return {}

    def load_buffers(self, state: dict) -> None:
        pass

    def reset_state(self, seed: int) -> None:
        """Re-initialise non-parameter state (``seed`` is this layer's own, derived from the model's)."""

    def _shape_error(self, expected: str, input_shape):
        return ValueError(f"{self.name}: expected input of shape (batch, {expected}), "
                          f"received (batch, {', '.join(map(str, input_shape))})")


class Linear(Layer):
    """y = x W^T + b, with W of shape (out, in) as in PyTorch.

    ``init``: ``"default"`` (PyTorch's: U(+-1/sqrt(fan_in)) for W and b),
    ``"kaiming"`` (N(0, 2/fan_in) for W, zero bias) or ``"xavier"`` (Glorot uniform, zero bias).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, name: str = "linear",
                 init: str = "default"):
        self.in_features, self.out_features, self.has_bias, self.name = in_features, out_features, bias, name
        self.init = init

    def declare(self):
        return [("weight", (self.out_features, self.in_features), True, self._init_weight)] + (
            [("bias", (self.out_features,), False, self._init_bias)] if self.has_bias else [])

    def _init_weight(self, rng):
        return init_weight(rng, self.init, (self.out_features, self.in_features),
                           self.in_features, self.out_features)

    def _init_bias(self, rng):
        if self.init == "default":
            return initializers.bias_uniform(rng, (self.out_features,), self.in_features)
        return np.zeros(self.out_features)

    def output_shape(self, input_shape):
        if tuple(input_shape) != (self.in_features,):
            raise self._shape_error(str(self.in_features), input_shape)
        return (self.out_features,)

    def forward(self, x, train: bool = True):
        self.x = x
        y = x @ self.p["weight"].T
        if self.has_bias:
            y += self.p["bias"]
        return y

    def backward(self, dy):
        # dW = dy^T x and dx = dy W: two GEMMs, dW written straight into the flat gradient buffer.
        xp = _xp(dy)
        xp.matmul(dy.T, self.x, out=self.g["weight"])
        if self.has_bias:
            dy.sum(axis=0, out=self.g["bias"])
        if self.params_done is not None:
            self.params_done()
        dx = dy @ self.p["weight"] if self.input_grad else None
        self.x = None
        return dx


class ReLU(Layer):
    """y = max(x, 0), computed IN PLACE on ``x`` (and ``dy``): no activation copies."""

    def __init__(self, name: str = "relu"):
        self.name = name

    def forward(self, x, train: bool = True):
        # x * (x > 0) is ~2x faster than np.maximum(x, 0) (no NaN bookkeeping) and keeps NaNs visible.
        xp = _xp(x)
        self.mask = x > 0
        xp.multiply(x, self.mask, out=x)
        return x

    def backward(self, dy):
        _xp(dy).multiply(dy, self.mask, out=dy)
        self.mask = None
        return dy


class Flatten(Layer):
    """(batch, ...) -> (batch, prod(...)), in C order (NCHW images flatten as channel, row, column)."""

    def __init__(self, name: str = "flatten"):
        self.name = name

    def output_shape(self, input_shape):
        return (int(np.prod(input_shape)),)

    def forward(self, x, train: bool = True):
        self.in_shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy):
        return dy.reshape(self.in_shape)


class _LayoutLayer(Layer):
    """Base of the two layout layers: per-sample shape (C, H, W) in and out."""

    def output_shape(self, input_shape):
        if len(input_shape) != 3:
            raise self._shape_error("channels, height, width", input_shape)
        return tuple(input_shape)


class ToChannelMajor(_LayoutLayer):
    """NCHW (N, C, H, W) -> channel-major (C, H, W, N): a transpose view, no copy (the next
    convolution's im2col reads any strides)."""

    def __init__(self, name: str = "to_chwn"):
        self.name = name

    def forward(self, x, train: bool = True):
        return x.transpose(1, 2, 3, 0)

    def backward(self, dy):
        return dy.transpose(3, 0, 1, 2)


class ToBatchMajor(_LayoutLayer):
    """Channel-major (C, H, W, N) -> NCHW (N, C, H, W), contiguous (so a following Flatten
    orders features as PyTorch does: channel, row, column)."""

    def __init__(self, name: str = "to_nchw"):
        self.name = name

    def forward(self, x, train: bool = True):
        return _xp(x).ascontiguousarray(x.transpose(3, 0, 1, 2))

    def backward(self, dy):
        return dy.transpose(1, 2, 3, 0)


class Dropout(Layer):
    """Inverted dropout: in training, zero each element with probability ``p`` and scale the rest by 1/(1-p).

    The mask is drawn on the HOST from this layer's own seeded NumPy generator
    (PCG64) and copied to the device, so CPU and GPU runs drop the same elements.
    Its generator state is part of ``buffers()`` as ``rng_state`` (a uint64 array
    of 6: state hi/lo, increment hi/lo, has_uint32, uinteger), so a checkpoint
    that saves ``model.buffers()`` resumes bit-for-bit. Identity in evaluation.
    """

    def __init__(self, p: float = 0.5, name: str = "dropout"):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"{name}: dropout probability must be in [0, 1), got {p}")
        self.rate, self.name = float(p), name
        self.rng = np.random.Generator(np.random.PCG64(0))

    def reset_state(self, seed: int) -> None:
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def forward(self, x, train: bool = True):
        if not train or self.rate == 0.0:
            self.mask = None
            return x
        xp = _xp(x)
        keep = self.rng.random(x.shape, dtype=np.float32) >= self.rate
        self.mask = xp.asarray(keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - self.rate)))
        return x * self.mask

    def backward(self, dy):
        if self.mask is None:
            return dy
        _xp(dy).multiply(dy, self.mask, out=dy)
        self.mask = None
        return dy

    def buffers(self) -> dict:
        return {"rng_state": encode_pcg64(self.rng)}

    def load_buffers(self, state: dict) -> None:
        if "rng_state" in state:
            self.rng = decode_pcg64(state["rng_state"])


def encode_pcg64(rng: np.random.Generator) -> np.ndarray:
    """A PCG64 generator's full state as 6 uint64 (the 128-bit state and increment split in halves)."""
    st = rng.bit_generator.state
    mask = (1 << 64) - 1
    s, inc = st["state"]["state"], st["state"]["inc"]
    return np.array([s >> 64, s & mask, inc >> 64, inc & mask, st["has_uint32"], st["uinteger"]], dtype=np.uint64)


def decode_pcg64(words) -> np.random.Generator:
    """Inverse of :func:`encode_pcg64` (accepts a host or device array)."""
    from ssdmpi.backend import to_host
    w = [int(v) for v in to_host(words).reshape(-1)]
    if len(w) != 6:
        raise ValueError(f"Dropout rng_state must have 6 uint64 words, got {len(w)}")
    bg = np.random.PCG64()
    bg.state = {"bit_generator": "PCG64", "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
                "has_uint32": w[4], "uinteger": w[5]}
    return np.random.Generator(bg)


def init_weight(rng, kind: str, shape, fan_in: int, fan_out: int) -> np.ndarray:
    """Weight initialisers by name: ``default`` (PyTorch's), ``kaiming`` (He normal), ``xavier`` (Glorot uniform)."""
    if kind == "default":
        return initializers.kaiming_uniform(rng, shape, fan_in)
    if kind == "kaiming":
        return initializers.kaiming_normal(rng, shape, fan_in)
    if kind == "xavier":
        return initializers.xavier_uniform(rng, shape, fan_in, fan_out)
    raise ValueError(f"unknown weight init {kind!r}; choose default, kaiming or xavier")


def _xp(a):
    from ssdmpi.backend import array_module
    return array_module(a)
