"""A model: a sequence of layers over two flat buffers (parameters, gradients).

``Model.params`` and ``Model.grads`` are the flat buffers (see ``flat.py``); every
layer's tensors are views into them. ``loss_and_grad`` runs forward and backward
and leaves the MEAN gradient over the batch in ``grads``.
"""

from __future__ import annotations

import numpy as np

from ssdmpi.nn.flat import FlatParams
from ssdmpi.nn.loss import cross_entropy_sum_and_correct, softmax_cross_entropy


class Model:
    """Layers in order, over flat parameter/gradient buffers.

    Args:
        layers: the layers, each with a unique ``name`` (used as the tensor prefix).
        input_shape: per-sample input shape, e.g. ``(784,)`` or ``(1, 28, 28)``.
        xp: numpy or cupy. dtype: float32 (default) or float64.
        seed: initialisation seed; the same seed gives the same weights everywhere.
    """

    def __init__(self, layers, input_shape, xp=np, dtype=np.float32, seed: int = 0, name: str = "model"):
        self.layers, self.input_shape, self.xp, self.name = list(layers), tuple(input_shape), xp, name
        self.dtype = np.dtype(dtype)
        shape, declared, inits = self.input_shape, [], []
        for layer in self.layers:
            shape = layer.output_shape(shape)
            for local, pshape, decay, init in layer.declare():
                declared.append((f"{layer.name}.{local}", pshape, decay))
                inits.append(init)
        self.output_shape = shape
        self.flat = FlatParams(declared, xp=xp, dtype=self.dtype)
        for layer in self.layers:
            names = [local for local, *_ in layer.declare()]
            layer.bind({n: self.flat.view(f"{layer.name}.{n}") for n in names},
                       {n: self.flat.view(f"{layer.name}.{n}", "grad") for n in names})
        self._inits = inits
        self.initialize(seed)

    @property
    def params(self):
        """The flat parameter buffer (1-D)."""
        return self.flat.data

    @property
    def grads(self):
        """The flat gradient buffer (1-D), same layout as ``params``."""
        return self.flat.grad

    @property
    def num_params(self) -> int:
        return self.flat.size

    def initialize(self, seed: int) -> None:
        """Fill the parameters from a seeded host RNG (identical on CPU and GPU, on every rank)."""
        rng = np.random.default_rng(seed)
        host = np.empty(self.flat.size, dtype=self.dtype)
        for spec, init in zip(self.flat.specs, self._inits):
            host[spec.offset:spec.offset + spec.size] = np.asarray(init(rng), dtype=np.float64).reshape(-1)
        self.flat.data[...] = self.xp.asarray(host)
        for layer in self.layers:
            layer.load_buffers({k: self.xp.zeros_like(v) + (1 if k.endswith("var") else 0)
                                for k, v in layer.buffers().items()})

    def check_batch(self, x) -> None:
        """``ValueError`` naming the first layer when ``x`` is not a float batch of ``input_shape``."""
        first = self.layers[0].name
        if x.ndim != len(self.input_shape) + 1 or tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"{first}: expected input of shape (batch, {', '.join(map(str, self.input_shape))}), "
                             f"received {tuple(x.shape)}")
        if x.dtype != self.dtype:
            raise ValueError(f"{first}: expected input of dtype {self.dtype}, received {x.dtype}")

    def forward(self, x, train: bool = True):
        """Logits for the batch ``x`` (per-sample shape ``input_shape``)."""
        self.check_batch(x)
        for layer in self.layers:
            x = layer.forward(x, train)
        return x

    def backward(self, dlogits) -> None:
        """Back-propagate ``dlogits``; overwrites ``grads``."""
        dy = dlogits
        for layer in reversed(self.layers):
            dy = layer.backward(dy)

    def loss_and_grad(self, x, labels) -> float:
        """Forward + backward on one batch; returns the mean loss, leaves the mean gradient in ``grads``."""
        logits = self.forward(x, train=True)
        loss, dlogits = softmax_cross_entropy(logits, labels)
        self.backward(dlogits)
        return loss

    def evaluate(self, x, labels) -> tuple[float, int]:
        """``(loss sum, correct count)`` of the batch in inference mode."""
        return cross_entropy_sum_and_correct(self.forward(x, train=False), labels)

    def buffers(self) -> dict:
        """Non-parameter state (BN running statistics) as ``{"layer.name": array}`` (views)."""
        return {f"{layer.name}.{k}": v for layer in self.layers for k, v in layer.buffers().items()}

    def load_buffers(self, state: dict) -> None:
        """Restore what ``buffers()`` exported (copies into the existing arrays)."""
        for layer in self.layers:
            prefix = layer.name + "."
            layer.load_buffers({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
