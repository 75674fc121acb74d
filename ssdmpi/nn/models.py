"""The model registry: ``build_model(name, input_shape, num_classes, xp=, dtype=, seed=, **options)``.

| name | what | options |
|---|---|---|
| ``mlp`` | flatten -> Linear+ReLU per width -> Linear(classes) | ``widths`` (default (256,)), ``dropout`` (0) |
| ``wide-mlp`` | ``mlp`` with widths (4096, 4096): ~20 M parameters on 784 inputs, for communication-bound runs | ``dropout`` |
| ``lenet5`` | LeCun et al. 1998, with ReLU and max-pooling (see :func:`lenet5` for the size adaptation) | -- |
| ``resnet20`` | He et al. 2016's CIFAR ResNet-20: 3 stages x 3 basic blocks, 16/32/64 channels | ``shortcut`` ("A" default, or "B") |

Parameter counts (10 classes): mlp 784-512-512-10: 669,706; wide-mlp on 784 inputs:
20,037,642; lenet5 on 28x28x1: 61,706 (the classic), on 8x8x1: 21,386, on 32x32x3:
83,126; resnet20 on 32x32x3, option A: 269,722 (the paper's 0.27 M), option B: 272,474.

Images are NCHW; every model accepts (C, H, W) inputs, ``mlp`` also (features,).
"""

from __future__ import annotations

import inspect

import numpy as np

from ssdmpi.errors import UserError
from ssdmpi.nn.conv import Conv2d, GlobalAvgPool2d, MaxPool2d, conv_output_size
from ssdmpi.nn.layers import Dropout, Flatten, Layer, Linear, ReLU, ToBatchMajor, ToChannelMajor
from ssdmpi.nn.model import Model
from ssdmpi.nn.norm import BatchNorm
from ssdmpi.nn.residual import BasicBlock


def mlp(input_shape, num_classes, widths=(256,), dropout: float = 0.0, **kwargs) -> Model:
    """Multi-layer perceptron; image inputs are flattened (C, H, W order). Dropout after each hidden ReLU if > 0."""
    layers = [Flatten(name="flatten")]
    fan_in = int(np.prod(input_shape))
    for i, width in enumerate(widths):
        layers += [Linear(fan_in, int(width), name=f"fc{i + 1}"), ReLU(name=f"relu{i + 1}")]
        if dropout:
            layers.append(Dropout(dropout, name=f"dropout{i + 1}"))
        fan_in = int(width)
    layers.append(Linear(fan_in, num_classes, name=f"fc{len(widths) + 1}"))
    return Model(layers, input_shape, name="mlp", **kwargs)


WIDE_MLP_WIDTHS = (4096, 4096)


def wide_mlp(input_shape, num_classes, **kwargs) -> Model:
    """``mlp`` with :data:`WIDE_MLP_WIDTHS` hidden layers (overridable by ``widths``)."""
    kwargs.setdefault("widths", WIDE_MLP_WIDTHS)
    model = mlp(input_shape, num_classes, **kwargs)
    model.name = "wide-mlp"
    return model


def lenet5(input_shape, num_classes, **kwargs) -> Model:
    """LeNet-5: conv5x5(6) -> ReLU -> maxpool2 -> conv5x5(16) -> ReLU -> maxpool2 -> fc120 -> fc84 -> classes.

    Adapted to the input size: conv1 pads by 2 (so 28x28 Fashion-MNIST behaves like the
    original 32x32 input); conv2 pads by 0 when its input is at least 10 pixels (the
    classic 14 -> 10 -> 5, giving 16*5*5 = 400 features on 28x28) and by 2 on smaller
    inputs (8x8 digits: 8 -> 4 -> 4 -> 2, 64 features). Channels come from the input
    (3 for CIFAR-10: 32 -> 16 -> 12 -> 6, 576 features). ReLU and max pooling replace
    the original's scaled tanh and trainable subsampling, as in modern reproductions.
    """
    if len(input_shape) != 3:
        raise UserError(f"lenet5 needs image inputs (channels, height, width), got per-sample shape {input_shape}")
    c, h, w = input_shape
    if min(h, w) < 4:
        raise UserError(f"lenet5 needs images of at least 4x4 pixels, got {h}x{w}")
    h1, w1 = conv_output_size(h, 5, 1, 2) // 2, conv_output_size(w, 5, 1, 2) // 2
    pad2 = 0 if min(h1, w1) >= 10 else 2
    layers = [ToChannelMajor(),
              Conv2d(c, 6, 5, padding=2, name="conv1"), ReLU(name="relu1"), MaxPool2d(2, name="pool1"),
              Conv2d(6, 16, 5, padding=pad2, name="conv2"), ReLU(name="relu2"), MaxPool2d(2, name="pool2"),
              ToBatchMajor(), Flatten(name="flatten")]
    h2, w2 = conv_output_size(h1, 5, 1, pad2) // 2, conv_output_size(w1, 5, 1, pad2) // 2
    layers += [Linear(16 * h2 * w2, 120, name="fc1"), ReLU(name="relu3"),
               Linear(120, 84, name="fc2"), ReLU(name="relu4"),
               Linear(84, num_classes, name="fc3")]
    return Model(layers, input_shape, name="lenet5", **kwargs)


def resnet20(input_shape, num_classes, shortcut: str = "A", **kwargs) -> Model:
    """The CIFAR ResNet-20 (He et al. 2016, section 4.2; n = 3): 19 conv layers + 1 fc = 20.

    conv3x3(16)+BN+ReLU, then 3 stages of 3 :class:`~ssdmpi.nn.residual.BasicBlock`
    (16, 32, 64 channels; the first block of stages 2 and 3 has stride 2), global
    average pooling, fc(classes). Convolutions have no bias and use Kaiming-normal
    initialisation; tensor names follow the common PyTorch implementation
    (``conv1``, ``bn1``, ``layer1.0.conv1``, ..., ``fc``).
    ``shortcut``: ``"A"`` (zero-padding identity, the paper's; 0.27 M parameters) or ``"B"`` (1x1 conv + BN).
    """
    if len(input_shape) != 3:
        raise UserError(f"resnet20 needs image inputs (channels, height, width), got per-sample shape {input_shape}")
    if shortcut not in ("A", "B"):
        raise UserError(f"resnet20: shortcut must be 'A' or 'B', got {shortcut!r}")
    layers = [ToChannelMajor(),
              Conv2d(input_shape[0], 16, 3, 1, 1, bias=False, name="conv1", init="kaiming"),
              BatchNorm(16, name="bn1"), ReLU(name="relu")]
    cin = 16
    for stage, cout in enumerate((16, 32, 64)):
        blocks = [BasicBlock(cin if b == 0 else cout, cout, stride=2 if (b == 0 and stage > 0) else 1,
                             shortcut=shortcut, name=str(b)) for b in range(3)]
        layers.append(_Stage(blocks, name=f"layer{stage + 1}"))
        cin = cout
    layers += [GlobalAvgPool2d(name="avgpool"), Linear(64, num_classes, name="fc")]
    return Model(layers, input_shape, name="resnet20", **kwargs)


class _Stage(Layer):
    """A run of blocks, named ``layerN`` so tensors read ``layer1.0.conv1.weight``."""

    channel_major = True

    def __init__(self, blocks, name: str):
        self.blocks, self.name = list(blocks), name

    def children(self):
        return self.blocks

    def output_shape(self, input_shape):
        for block in self.blocks:
            input_shape = block.output_shape(input_shape)
        return input_shape

    def forward(self, x, train: bool = True):
        for block in self.blocks:
            x = block.forward(x, train)
        return x

    def backward(self, dy):
        for block in reversed(self.blocks):
            dy = block.backward(dy)
        return dy


MODELS = {"mlp": mlp, "wide-mlp": wide_mlp, "lenet5": lenet5, "resnet20": resnet20}


def build_model(name: str, input_shape, num_classes: int, **kwargs) -> Model:
    """Build a registered model. kwargs: ``xp``, ``dtype``, ``seed``, and model options (see the table)."""
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    builder = MODELS[name]
    allowed = set(inspect.signature(builder).parameters) - {"input_shape", "num_classes", "kwargs"}
    allowed |= {"xp", "dtype", "seed"} | ({"widths", "dropout"} if name == "wide-mlp" else set())
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise UserError(f"model {name!r}: bad option {', '.join(unknown)}; it takes "
                        f"{', '.join(sorted(allowed)) or 'no options'}")
    return builder(tuple(int(s) for s in input_shape), int(num_classes), **kwargs)
