"""A dataset's normalisation as a record: what turns raw inputs into the inputs a model trained on.

Every classification dataset is normalised by one rule (``ssdmpi/data/datasets.py``)::

    x = (raw * scale - mean[c]) / std[c]        for each channel c (each feature, for (N, D) data)

with ``mean``/``std`` the train split's statistics. "Raw" means the values as the source holds
them: ``digits`` pixel values 0..16 (``scale`` 1/16); ``mnist``, ``fashion-mnist`` (IDX) and
``cifar10`` uint8 pixels 0..255 (1/255); an HDF5 file's arrays as stored, and arrays given to
``ssdmpi.train``, as given (uint8: 1/255, floats: 1); ``synthetic`` its generated floats (1).

A checkpoint records the run's in its metadata as ``normalisation`` (``record``), so that
``ssdmpi.load_model(run).predict(raw)`` and ``ssdmpi export`` need no training data::

    {"rule": "x = (raw * scale - mean[c]) / std[c]", "scale": 0.0625, "mean": [...], "std": [...],
     "axis": "channel", "raw": "values 0..16"}
"""

from __future__ import annotations

import dataclasses

from ssdmpi.errors import UserError

RULE = "x = (raw * scale - mean[c]) / std[c]"


def describe_raw(scale: float) -> str:
    """What raw values are, for a ``scale``: ``uint8 0..255``, ``values 0..16``, ``as stored``."""
    if abs(scale - 1 / 255) < 1e-15:
        return "uint8 0..255"
    if abs(scale - 1.0) < 1e-15:
        return "floats, as stored"
    return f"values 0..{1 / scale:g}"


@dataclasses.dataclass(frozen=True)
class Normalisation:
    """``scale``, and per channel (or feature) ``mean`` and ``std``: the rule above."""

    scale: float
    mean: tuple
    std: tuple

    @classmethod
    def of(cls, dataset) -> Normalisation | None:
        """A dataset's (an ``ssdmpi.data.Dataset``); None for one without statistics (text)."""
        if not getattr(dataset, "mean", None):
            return None
        return cls(float(dataset.scale), tuple(float(m) for m in dataset.mean), tuple(float(s) for s in dataset.std))

    @classmethod
    def from_record(cls, record: dict) -> Normalisation:
        """Back from ``to_record()``'s mapping; ``UserError`` if it is not one."""
        try:
            norm = cls(float(record["scale"]), tuple(float(m) for m in record["mean"]),
                       tuple(float(s) for s in record["std"]))
        except (KeyError, TypeError, ValueError):
            raise UserError(f"not a normalisation record (need scale, mean, std): {record!r}") from None
        if len(norm.mean) != len(norm.std) or not norm.mean:
            raise UserError(f"a normalisation record needs as many means as standard deviations: {record!r}")
        return norm

    def to_record(self) -> dict:
        """The JSON-able mapping a checkpoint and an export store (module docstring)."""
        return {"rule": RULE, "scale": self.scale, "mean": list(self.mean), "std": list(self.std),
                "axis": "channel", "raw": describe_raw(self.scale)}

    def apply(self, raw, input_shape, dtype):
        """``raw`` (N samples as the source holds them) normalised for a model of per-sample
        ``input_shape``, as a ``dtype`` NumPy array of shape ``(N, *input_shape)``. Accepted:
        ``(N, *input_shape)``, ``(N, H, W)`` for one-channel images, or each sample flattened,
        ``(N, prod(input_shape))``. Computed in float64 and rounded once (for uint8 inputs, the
        same numbers the training data had). ``UserError`` (one line) for another shape."""
        import numpy as np

        x = np.asarray(raw)
        shape = tuple(int(s) for s in input_shape)
        size = int(np.prod(shape))
        if x.ndim >= 1 and x.shape[1:] != shape:
            if (x.ndim == 2 and x.shape[1] == size) or (x.ndim == len(shape) and shape[0] == 1
                                                        and x.shape[1:] == shape[1:]):
                x = x.reshape((len(x),) + shape)
        if x.ndim != len(shape) + 1 or x.shape[1:] != shape:
            raise UserError(f"inputs of shape {tuple(np.shape(raw))} do not fit this model: it takes (N, "
                            f"{', '.join(map(str, shape))})" + (f" or (N, {size})" if len(shape) > 1 else ""))
        if x.dtype.kind not in "uif":
            raise UserError(f"inputs must be numbers (uint8 or float), got {x.dtype}")
        channels = len(self.mean)
        if shape[0] != channels:
            raise UserError(f"the normalisation has {channels} channels but the model's inputs {shape[0]}")
        where = (1, channels) + (1,) * (len(shape) - 1)
        mean = np.asarray(self.mean, np.float64).reshape(where)
        std = np.asarray(self.std, np.float64).reshape(where)
        return ((x.astype(np.float64) * self.scale - mean) / std).astype(dtype)


def record(dataset) -> dict | None:
    """What a checkpoint stores as its ``normalisation``: ``Normalisation.of(dataset).to_record()``."""
    norm = Normalisation.of(dataset)
    return None if norm is None else norm.to_record()
