"""Flat parameter storage: every parameter of a model in ONE contiguous array.

All gradients live in a second array of the same length and layout. Layers hold
views into both, so an allreduce is one call on one buffer, an optimizer step is
a handful of vectorised operations, and a checkpoint is a few datasets.

Layout: tensors are packed in the order the layers declared them (model order,
then each layer's own order, e.g. ``weight`` before ``bias``), each starting at
the running offset, no padding. ``FlatParams.specs`` records name, shape, offset
and whether weight decay applies (weights and BN gamma: yes; biases and BN beta: no).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ParamSpec:
    """One tensor inside the flat buffers."""

    name: str          # e.g. "fc1.weight"
    shape: tuple
    offset: int        # first element in the flat buffer
    decay: bool        # weight decay applies (weights, BN gamma) or not (biases, BN beta)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class FlatParams:
    """The two flat buffers (``data``, ``grad``) and the table of tensors inside them.

    Args:
        declared: ``(name, shape, decay)`` in packing order.
        xp: array module (numpy or cupy).
        dtype: float32 (default) or float64 (gradient checks).
    """

    def __init__(self, declared, xp=np, dtype=np.float32):
        specs, offset = [], 0
        for name, shape, decay in declared:
            spec = ParamSpec(name, tuple(int(s) for s in shape), offset, bool(decay))
            specs.append(spec)
            offset += spec.size
        self.specs = specs
        self.size = offset
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.data = xp.zeros(offset, dtype=self.dtype)
        self.grad = xp.zeros(offset, dtype=self.dtype)

    def view(self, name: str, which: str = "data"):
        """The tensor ``name`` as a view (shape restored) into ``data`` or ``grad``."""
        spec = self.spec(name)
        buf = self.data if which == "data" else self.grad
        return buf[spec.offset:spec.offset + spec.size].reshape(spec.shape)

    def spec(self, name: str) -> ParamSpec:
        for spec in self.specs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def decay_mask(self):
        """A flat 0/1 array of ``data``'s dtype: 1 where weight decay applies."""
        mask = np.zeros(self.size, dtype=self.dtype)
        for spec in self.specs:
            if spec.decay:
                mask[spec.offset:spec.offset + spec.size] = 1
        return self.xp.asarray(mask)
