"""Layers, each with its forward and backward side by side.

Contract of every layer:
- ``declare()`` lists its parameters as ``(name, shape, decay, init)`` where
  ``init(rng) -> np.ndarray``; the model packs them into flat buffers and calls
  ``bind(params, grads)`` with dicts of views (name -> array).
- ``forward(x, train)`` returns the output and keeps what backward needs.
- ``backward(dy)`` returns ``dx`` and WRITES (does not accumulate) the parameter
  gradients into the bound gradient views.
- ``output_shape(input_shape)`` maps a per-sample shape to a per-sample shape and
  raises ``ValueError`` naming the layer when the input cannot be accepted.
"""

from __future__ import annotations

import numpy as np

from ssdmpi.nn import init as initializers


class Layer:
    """Base class: no parameters, identity shape."""

    name = "layer"

    def declare(self):
        return []

    def bind(self, params: dict, grads: dict) -> None:
        self.p, self.g = params, grads

    def output_shape(self, input_shape):
        return tuple(input_shape)

    def check_input(self, x, expected_shape) -> None:
        """``ValueError`` naming this layer when ``x`` does not have per-sample shape ``expected_shape``."""
        if tuple(x.shape[1:]) != tuple(expected_shape) or x.ndim != len(expected_shape) + 1:
            raise ValueError(f"{self.name}: expected input of shape (batch, {', '.join(map(str, expected_shape))}), "
                             f"received {tuple(x.shape)}")

    def buffers(self) -> dict:
        """Non-parameter state (e.g. BN running statistics) by local name."""
        return {}

    def load_buffers(self, state: dict) -> None:
        pass


class Linear(Layer):
    """y = x W^T + b, W of shape (out, in) as in PyTorch."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, name: str = "linear"):
        self.in_features, self.out_features, self.has_bias, self.name = in_features, out_features, bias, name

    def declare(self):
        fan_in = self.in_features
        out = [("weight", (self.out_features, self.in_features), True,
                lambda rng: initializers.kaiming_uniform(rng, (self.out_features, self.in_features), fan_in))]
        if self.has_bias:
            out.append(("bias", (self.out_features,), False,
                        lambda rng: initializers.bias_uniform(rng, (self.out_features,), fan_in)))
        return out

    def output_shape(self, input_shape):
        if tuple(input_shape) != (self.in_features,):
            raise ValueError(f"{self.name}: expected input of shape (batch, {self.in_features}), "
                             f"received (batch, {', '.join(map(str, input_shape))})")
        return (self.out_features,)

    def forward(self, x, train: bool = True):
        self.x = x
        y = x @ self.p["weight"].T
        if self.has_bias:
            y += self.p["bias"]
        return y

    def backward(self, dy):
        # dW = dy^T x and dx = dy W: two GEMMs, written straight into the flat gradient buffer.
        xp = _xp(dy)
        xp.matmul(dy.T, self.x, out=self.g["weight"])
        if self.has_bias:
            dy.sum(axis=0, out=self.g["bias"])
        dx = dy @ self.p["weight"]
        self.x = None
        return dx


class ReLU(Layer):
    """y = max(x, 0)."""

    def __init__(self, name: str = "relu"):
        self.name = name

    def forward(self, x, train: bool = True):
        self.mask = x > 0
        return x * self.mask

    def backward(self, dy):
        dx = dy * self.mask
        self.mask = None
        return dx


class Flatten(Layer):
    """(batch, ...) -> (batch, prod(...))."""

    def __init__(self, name: str = "flatten"):
        self.name = name

    def output_shape(self, input_shape):
        return (int(np.prod(input_shape)),)

    def forward(self, x, train: bool = True):
        self.in_shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy):
        return dy.reshape(self.in_shape)


def _xp(a):
    from ssdmpi.backend import array_module
    return array_module(a)
