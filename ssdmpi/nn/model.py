"""A model: a sequence of layers over two flat buffers (parameters, gradients).

``Model.params`` and ``Model.grads`` are the flat buffers (see ``flat.py``); every
layer's tensors are views into them, packed in the order of a depth-first walk
of the layer tree (each layer's own tensors, then its children's). Tensor names
are dotted paths, e.g. ``layer2.0.conv1.weight``.

``loss_and_grad`` runs forward and backward and leaves the MEAN gradient over the
batch in ``grads`` (overwritten, never accumulated). Backward produces ``grads`` from its
end: a top-level layer's tensors are one contiguous slice (``layer_offsets``), and once
its backward has written them, ``grads[offset:]`` is final -- the ``grads_ready`` hook is
told so, which lets a caller post each part's allreduce while backward goes on.

Inputs: ``input_kind = "features"`` (the default) takes float batches ``(batch, *input_shape)``
in the model's dtype, one label per sample; ``"tokens"`` (language models, ``gpt``) takes
integer token ids ``(batch, T)`` with ``T <= input_shape[0]`` (the context) and labels
``(batch, T)``, one per position. The loss is the mean over all ``labels.size`` targets;
``targets_per_sample`` is how many targets a full-length sample has (1, or the context).

State that is not a parameter -- BatchNorm running statistics and each Dropout
layer's RNG state -- is exported by ``buffers()`` and restored by
``load_buffers()``; together with ``params`` that is everything a checkpoint
needs for a bit-for-bit resume.
"""

from __future__ import annotations

import functools
import math
import zlib

import numpy as np

from ssdmpi.nn.flat import FlatParams
from ssdmpi.nn.loss import cross_entropy_sum_and_correct, softmax_cross_entropy
from ssdmpi.nn.workspace import Workspace


def walk(layers, prefix: str = ""):
    """Depth-first ``(full_name, layer)`` over a layer list and all descendants."""
    for layer in layers:
        full = f"{prefix}{layer.name}"
        yield full, layer
        yield from walk(layer.children(), full + ".")


class Model:
    """Layers in order, over flat parameter/gradient buffers.

    Args:
        layers: the top-level layers, each with a unique ``name`` (the tensor-name prefix).
        input_shape: per-sample input shape, e.g. ``(784,)`` or ``(1, 28, 28)`` (NCHW images).
        xp: numpy or cupy. dtype: float32 (default) or float64 (gradient checks).
        seed: initialisation seed; the same seed gives the same weights everywhere
            (and seeds each Dropout layer from it and the layer's name).
        input_kind: ``"features"`` or ``"tokens"`` (module docstring).
    """

    def __init__(self, layers, input_shape, xp=np, dtype=np.float32, seed: int = 0, name: str = "model",
                 input_kind: str = "features"):
        self.layers, self.input_shape, self.xp, self.name = list(layers), tuple(input_shape), xp, name
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"{name}: dtype must be float32 or float64, got {self.dtype}")
        if input_kind not in ("features", "tokens"):
            raise ValueError(f"{name}: input_kind must be 'features' or 'tokens', got {input_kind!r}")
        if input_kind == "tokens" and len(self.input_shape) != 1:
            raise ValueError(f"{name}: a token model's input_shape is (context,), got {self.input_shape}")
        self.input_kind = input_kind
        self.targets_per_sample = self.input_shape[0] if input_kind == "tokens" else 1
        shape = self.input_shape
        for layer in self.layers:
            shape = layer.output_shape(shape)
        self.output_shape = shape
        self.named_layers = list(walk(self.layers))
        names = [full for full, _ in self.named_layers]
        if len(set(names)) != len(names):
            raise ValueError(f"{name}: layer names must be unique among siblings: {names}")
        declared, inits, owners = [], [], []
        for full, layer in self.named_layers:
            for local, pshape, decay, init in layer.declare():
                declared.append((f"{full}.{local}", pshape, decay))
                inits.append(init)
                owners.append((layer, local))
        self.flat = FlatParams(declared, xp=xp, dtype=self.dtype)
        self.workspace = Workspace(xp)
        for full, layer in self.named_layers:
            locals_ = [local for local, *_ in layer.declare()]
            layer.bind({n: self.flat.view(f"{full}.{n}") for n in locals_},
                       {n: self.flat.view(f"{full}.{n}", "grad") for n in locals_})
            layer.workspace = self.workspace
        # The input is data, not something to differentiate: layers before the first one with
        # parameters are skipped in backward, and that one does not compute its dx.
        self._first_trainable = next((i for i, layer in enumerate(self.layers)
                                      if any(lay.declare() for _, lay in walk([layer]))), len(self.layers))
        for i, layer in enumerate(self.layers):
            layer.input_grad = i > self._first_trainable
        # Flat offset of each top-level layer's first tensor (a layer without tensors: the next
        # one's); grads[layer_offsets[i]:] is final once layer i's backward has run.
        self.layer_offsets, end = [0] * len(self.layers), self.flat.size
        for i in reversed(range(len(self.layers))):
            own = [self.flat.spec(f"{full}.{local}").offset for full, lay in walk([self.layers[i]])
                   for local, *_ in lay.declare()]
            end = self.layer_offsets[i] = min(own, default=end)
        self._inits = inits
        # Called (no arguments) after each top-level layer of a training forward and backward:
        # the algorithms hook the Communicator's progress() in here, so a nonblocking allreduce
        # keeps moving during the compute instead of only when the caller waits for it.
        self.between_layers = None
        # Called with ``offset`` after each top-level layer of a backward: ``grads[offset:]`` is
        # final (a bucketed allreduce posts the parts that are; ssdmpi/algos/overlap.py).
        self.grads_ready = None
        self.initialize(seed)

    def __repr__(self) -> str:
        """One line per top-level layer (output shape, parameters), then the total, like PyTorch's summary."""
        shape, rows = self.input_shape, []
        for layer in self.layers:
            shape = layer.output_shape(shape)
            count = sum(int(math.prod(p)) for _, lay in walk([layer]) for _, p, *_ in lay.declare())
            rows.append((layer.name, type(layer).__name__, f"(B, {', '.join(map(str, shape))})", count))
        width = max([len(r[0]) + len(r[1]) + 3 for r in rows] + [10])
        lines = [f"{self.name}: input (B, {', '.join(map(str, self.input_shape))}), {self.dtype}"]
        lines += [f"  {f'{n} ({t})':<{width}} -> {s:<20} {c:>10,} params" for n, t, s, c in rows]
        lines.append(f"  total: {self.num_params:,} parameters")
        return "\n".join(lines)

    @property
    def params(self):
        """The flat parameter buffer (1-D)."""
        return self.flat.data

    @params.setter
    def params(self, value) -> None:
        # ``model.params -= lr * g`` works in place; assigning another array copies into the buffer
        # (layers hold views of it, so the buffer itself is never replaced).
        if value is not self.flat.data:
            self.flat.data[...] = value

    @property
    def grads(self):
        """The flat gradient buffer (1-D), same layout as ``params``."""
        return self.flat.grad

    @grads.setter
    def grads(self, value) -> None:
        if value is not self.flat.grad:
            self.flat.grad[...] = value

    @property
    def num_params(self) -> int:
        return self.flat.size

    def initialize(self, seed: int) -> None:
        """Fill the parameters from a seeded host RNG (identical on CPU and GPU, on every rank),
        and reset the non-parameter state (:meth:`reset_state`)."""
        rng = np.random.default_rng(seed)
        host = np.empty(self.flat.size, dtype=self.dtype)
        for spec, init in zip(self.flat.specs, self._inits):
            host[spec.offset:spec.offset + spec.size] = np.asarray(init(rng), dtype=np.float64).reshape(-1)
        self.flat.data[...] = self.xp.asarray(host)
        self.flat.grad[...] = 0
        self.reset_state(seed)

    def reset_state(self, seed: int) -> None:
        """Reset all non-parameter state: BN running statistics to (0, 1), each Dropout
        generator to a stream derived from ``seed`` and the layer's full name."""
        for full, layer in self.named_layers:
            layer.reset_state(_layer_seed(seed, full))

    def seed_dropout(self, seed: int) -> None:
        """Reseed only the Dropout generators (e.g. ``seed + rank`` for independent masks per rank)."""
        from ssdmpi.nn.layers import Dropout
        for full, layer in self.named_layers:
            if isinstance(layer, Dropout):
                layer.reset_state(_layer_seed(seed, full))

    def check_batch(self, x) -> None:
        """``ValueError`` when ``x`` is not a batch of ``input_shape`` in ``dtype`` (token models: integer
        ids ``(batch, T)``, ``T <= context``); the message names the model and its first layer with
        parameters (the one the data feeds), e.g. ``lenet5.conv1``."""
        first = self.layers[min(self._first_trainable, len(self.layers) - 1)].name
        where = f"{self.name}.{first}"
        if self.input_kind == "tokens":
            context = self.input_shape[0]
            if x.ndim != 2 or not 1 <= x.shape[1] <= context:
                raise ValueError(f"{where}: expected token ids of shape (batch, T) with 1 <= T <= {context}, "
                                 f"received {tuple(x.shape)}")
            if x.dtype.kind not in "iu":
                raise ValueError(f"{where}: expected integer token ids, received {x.dtype} (shape {tuple(x.shape)})")
            return
        if x.ndim != len(self.input_shape) + 1 or tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"{where}: expected input of shape (batch, {', '.join(map(str, self.input_shape))}), "
                             f"received {tuple(x.shape)}")
        if x.dtype != self.dtype:
            raise ValueError(f"{where}: expected input of dtype {self.dtype}, received {x.dtype} "
                             f"(shape {tuple(x.shape)})")

    def forward(self, x, train: bool = True):
        """Logits (batch, classes) for the batch ``x`` (per-sample shape ``input_shape``, dtype ``dtype``);
        token models: ``(batch, T, vocab)`` for ids ``(batch, T)``.

        ``train``: BatchNorm uses batch statistics (and updates running ones), Dropout drops.
        ``x`` is not modified.
        """
        self.check_batch(x)
        hook = self.between_layers if train else None
        for layer in self.layers:
            x = layer.forward(x, train)
            if hook is not None:
                hook()
        return x

    def backward(self, dlogits) -> None:
        """Back-propagate ``dlogits`` (consumed: may be overwritten); overwrites ``grads``, last
        layer first, telling ``grads_ready(layer_offsets[i])`` after each top-level layer ``i`` --
        and, for a layer that writes its parameter gradients before its input gradient (Linear),
        already in between (``Layer.params_done``)."""
        dy = dlogits
        hook, ready = self.between_layers, self.grads_ready
        for i in reversed(range(self._first_trainable, len(self.layers))):
            layer = self.layers[i]
            if ready is not None:
                layer.params_done = functools.partial(ready, self.layer_offsets[i])
                try:
                    dy = layer.backward(dy)
                finally:
                    layer.params_done = None
                ready(self.layer_offsets[i])
            else:
                dy = layer.backward(dy)
            if hook is not None:
                hook()

    def loss_and_grad(self, x, labels):
        """Forward + backward on one batch; returns the mean loss over its ``labels.size`` targets (a
        float on NumPy, a 0-d device array on CuPy: see ``softmax_cross_entropy``), leaves the mean
        gradient in ``grads``."""
        logits = self.forward(x, train=True)
        loss, dlogits = softmax_cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        self.backward(dlogits.reshape(logits.shape))
        return loss

    def evaluate(self, x, labels) -> tuple[float, int]:
        """``(loss sum, correct count)`` over the batch's ``labels.size`` targets in inference mode
        (does not touch ``grads``)."""
        logits = self.forward(x, train=False)
        return cross_entropy_sum_and_correct(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    def buffers(self) -> dict:
        """Non-parameter state as ``{"full.layer.name.key": array}``.

        BN ``running_mean``/``running_var``: live views on the model's device (copy them if
        you need a snapshot). Dropout ``rng_state``: a host uint64 snapshot (6 words).
        """
        return {f"{full}.{k}": v for full, layer in self.named_layers for k, v in layer.buffers().items()}

    def load_buffers(self, state: dict) -> None:
        """Restore what ``buffers()`` exported (copies into the existing arrays).

        Raises ``KeyError`` naming the missing entries if ``state`` lacks any of them.
        """
        missing = sorted(set(self.buffers()) - set(state))
        if missing:
            raise KeyError(f"{self.name}: buffers missing from the state: {', '.join(missing)}")
        for full, layer in self.named_layers:
            prefix = full + "."
            own = {k[len(prefix):]: v for k, v in state.items()
                   if k.startswith(prefix) and "." not in k[len(prefix):]}
            layer.load_buffers(own)


def _layer_seed(seed: int, full_name: str) -> int:
    """A 64-bit seed for one layer, from the model seed and the layer's full name."""
    return int(np.random.SeedSequence([int(seed), zlib.crc32(full_name.encode())]).generate_state(1, np.uint64)[0])
