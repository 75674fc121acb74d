"""The average of several ranks' model buffers: the BatchNorm running statistics the global
model ``W`` is evaluated with (``ssdmpi/run/evaluation.py`` in training, ``checkpoint.read_model`` for
``ssdmpi eval`` and ``ssdmpi.load_model``).

Every rank's statistics come from its own batches and ``W`` is the average of all ranks'
training, so ``W`` takes their mean. Only float buffers are averaged (not the Dropout
generators' states). The arithmetic, the same wherever it runs: the statistics summed in
float64 (a few float32 values sum exactly there, so the order of the sum does not change the
bits: an MPI sum gives the same as a loop), divided by the number of ranks, rounded once to
each buffer's dtype.
"""

from __future__ import annotations

import numpy as np


def packed(buffers: dict) -> tuple[np.ndarray, list]:
    """``(flat, names)``: the float buffers of ``buffers`` (host arrays) in name order as one
    float64 vector with a final 1 (the count, for sums over ranks), and their names."""
    names = sorted(k for k, v in buffers.items() if np.asarray(v).dtype.kind == "f")
    parts = [np.asarray(buffers[k], dtype=np.float64).ravel() for k in names]
    return np.concatenate(parts + [np.ones(1)]), names


def unpacked(flat: np.ndarray, names: list, like: dict) -> dict:
    """A sum of ``packed`` vectors divided by its count (its last element), as ``{name: array}``
    in the dtypes and shapes of ``like``'s buffers."""
    out, at = {}, 0
    for k in names:
        ref = np.asarray(like[k])
        out[k] = (flat[at:at + ref.size] / flat[-1]).astype(ref.dtype).reshape(ref.shape)
        at += ref.size
    return out


def average(buffers: list) -> dict:
    """The mean of several ranks' buffer dicts (host arrays), float buffers only."""
    flat, names = packed(buffers[0])
    for other in buffers[1:]:
        flat += packed(other)[0]
    return unpacked(flat, names, buffers[0]) if names else {}
