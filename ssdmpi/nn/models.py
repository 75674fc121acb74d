"""The model registry: ``build_model(name, ...)``.

| name | what |
|---|---|
| ``mlp`` | input -> widths... -> classes, ReLU between (default widths (256,)) |
| ``wide-mlp`` | ``mlp`` with widths (4096, 4096): ~20 M parameters, for communication-bound experiments |
"""

from __future__ import annotations

import numpy as np

from ssdmpi.errors import UserError
from ssdmpi.nn.layers import Flatten, Linear, ReLU
from ssdmpi.nn.model import Model


def mlp(input_shape, num_classes, widths=(256,), **kwargs) -> Model:
    layers = [Flatten(name="flatten")]
    fan_in = int(np.prod(input_shape))
    for i, width in enumerate(widths):
        layers += [Linear(fan_in, width, name=f"fc{i + 1}"), ReLU(name=f"relu{i + 1}")]
        fan_in = width
    layers.append(Linear(fan_in, num_classes, name=f"fc{len(widths) + 1}"))
    return Model(layers, input_shape, name="mlp", **kwargs)


def wide_mlp(input_shape, num_classes, **kwargs) -> Model:
    model = mlp(input_shape, num_classes, widths=(4096, 4096), **kwargs)
    model.name = "wide-mlp"
    return model


MODELS = {"mlp": mlp, "wide-mlp": wide_mlp}


def build_model(name: str, input_shape, num_classes: int, **kwargs) -> Model:
    """Build a registered model. kwargs: ``xp``, ``dtype``, ``seed``, and model options (``widths``)."""
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    return MODELS[name](tuple(input_shape), int(num_classes), **kwargs)
