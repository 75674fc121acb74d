"""The model registry: ``build_model(name, input_shape, num_classes, xp=, dtype=, seed=, **options)``.

| name | what | options |
|---|---|---|
| ``mlp`` | flatten -> Linear+ReLU per width -> Linear(classes) | ``widths`` (default (256,)), ``dropout`` (0) |
| ``wide-mlp`` | ``mlp`` with widths (4096, 4096): ~20 M parameters on 784 inputs, for communication-bound runs | ``dropout`` |
| ``lenet5`` | LeCun et al. 1998, with ReLU and max-pooling (see :func:`lenet5` for the size adaptation) | -- |
| ``resnet20`` | He et al. 2016's CIFAR ResNet-20: 3 stages x 3 basic blocks, 16/32/64 channels | ``shortcut`` ("A" default, or "B") |
| ``gpt`` | GPT-2 / nanoGPT decoder-only language model: token + learned positional embeddings, pre-LN transformer blocks (causal attention, 4x GELU MLP), head tied to the token embedding | ``n_layer`` (4), ``n_head`` (6), ``d_model`` (192), ``context`` (the input's), ``dropout`` (0) |

Parameter counts (10 classes): mlp 784-512-512-10: 669,706; wide-mlp on 784 inputs:
20,037,642; lenet5 on 28x28x1: 61,706 (the classic), on 8x8x1: 21,386, on 32x32x3:
83,126; resnet20 on 32x32x3, option A: 269,722 (the paper's 0.27 M), option B: 272,474;
gpt with the default sizes on byte-level tokens (vocab 256, context 128): 1,853,568.

Images are NCHW; every model accepts (C, H, W) inputs, ``mlp`` also (features,). ``gpt`` takes
integer token ids (B, T) and labels (B, T) (``input_kind = "tokens"``; the contract is in
:func:`gpt`'s docstring); ``num_classes`` is its vocabulary.

Your own models (docs/API.md): ``build_model`` also takes ``"package.module:factory"``, a
factory, or a built ``Model``; ``register_model(name, factory)`` adds a name. A factory is
``factory(input_shape, num_classes, *, xp, dtype, seed, **options) -> Model``, and what it
returns is checked (``check_model``: a ``Model`` for these inputs, classes, array module, dtype).
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

# gpt's sizes when not given: the byte-level preset (vocab 256, context 128)
GPT_DEFAULTS = {"n_layer": 4, "n_head": 6, "d_model": 192}


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


def gpt(input_shape, num_classes, n_layer: int = GPT_DEFAULTS["n_layer"], n_head: int = GPT_DEFAULTS["n_head"],
        d_model: int = GPT_DEFAULTS["d_model"], context: int | None = None, dropout: float = 0.0, **kwargs) -> Model:
    """A GPT-2-style decoder-only language model, nanoGPT's ``GPT`` (Radford et al. 2019).

    ``wte`` (token embedding, vocab = ``num_classes``) + ``wpe`` (learned positions) [-> ``drop``]
    -> ``n_layer`` pre-LayerNorm :class:`~ssdmpi.nn.transformer.Block` ``h.0`` ... (``n_head``
    causal attention heads of ``d_model / n_head``, a 4x GELU MLP, dropout ``dropout`` on the
    embeddings, attention weights and residual branches) -> ``ln_f`` -> ``lm_head``, tied to
    ``wte`` (one tensor, first in the flat buffer). nanoGPT's initialisation: N(0, 0.02^2),
    residual projections N(0, (0.02/sqrt(2 n_layer))^2), zero biases, LayerNorm (1, 0).
    Weight decay on the Linear weights only (not embeddings, LayerNorm, biases).
    Tensor names are nanoGPT's without its ``transformer.`` prefix
    (:func:`~ssdmpi.nn.transformer.nanogpt_name` maps them).

    The contract (``input_kind = "tokens"``):
    - ``input_shape = (context,)``; ``context`` (the option) defaults to it and must equal it.
    - input ``x``: integer token ids (any integer dtype) of shape (B, T), 1 <= T <= context,
      each in [0, vocab); labels ``y``: (B, T) integers, the next token at each position.
    - ``forward(x, train)`` returns logits (B, T, vocab) in the model's dtype.
    - ``loss_and_grad(x, y)``: the mean cross-entropy over the B*T positions; the mean gradient is
      left in ``model.grads`` (overwritten, never accumulated).
    - ``evaluate(x, y)``: ``(loss sum, correct count)`` summed over the B*T positions; a batch has
      ``y.size`` = B*T targets, ``model.targets_per_sample`` (= context) per full-length sample.
    - top-level layers (the hooks' granularity): ``wte``, ``wpe``, ``drop`` (if dropout), each
      block, ``ln_f``, ``lm_head``; ``grads_ready(0)`` (the tied weight final) comes only after
      ``wte``'s backward.
    - ``buffers()``: each Dropout's generator state (bitwise resume).
    """
    from ssdmpi.nn.embedding import PositionalEmbedding, TiedHead, TokenEmbedding
    from ssdmpi.nn.norm import LayerNorm
    from ssdmpi.nn.transformer import Block

    if len(input_shape) != 1:
        raise UserError(f"gpt needs token windows of shape (context,), got per-sample shape {input_shape}")
    context = int(input_shape[0]) if context is None else int(context)
    if context != input_shape[0]:
        raise UserError(f"gpt: context {context} does not match the data's {input_shape[0]} positions per sample")
    for key, value in (("n_layer", n_layer), ("n_head", n_head), ("d_model", d_model), ("context", context)):
        if int(value) < 1:
            raise UserError(f"gpt: {key} must be at least 1, got {value}")
    if d_model % n_head:
        raise UserError(f"gpt: d_model {d_model} must be a multiple of n_head {n_head}")
    if not 0.0 <= float(dropout) < 1.0:
        raise UserError(f"gpt: dropout must be in [0, 1), got {dropout}")
    wte = TokenEmbedding(num_classes, d_model, name="wte")
    layers = [wte, PositionalEmbedding(context, d_model, name="wpe")]
    if dropout:
        layers.append(Dropout(dropout, name="drop"))
    layers += [Block(d_model, n_head, context, n_layer, dropout, name=f"h.{i}") for i in range(n_layer)]
    layers += [LayerNorm(d_model, name="ln_f"), TiedHead(wte, name="lm_head")]
    return Model(layers, input_shape, name="gpt", input_kind="tokens", **kwargs)


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


MODELS = {"mlp": mlp, "wide-mlp": wide_mlp, "lenet5": lenet5, "resnet20": resnet20, "gpt": gpt}
_BUILTIN = frozenset(MODELS)


def register_model(name: str, factory) -> None:
    """Make ``factory`` buildable as ``name`` (``--model NAME``, ``model: NAME``) in this process.

    ``factory(input_shape, num_classes, *, xp, dtype, seed, **options) -> Model`` (the keywords it
    does not declare are not passed). Call it on every rank before training (e.g. at the top
    of the script that calls ``ssdmpi.train``); a command-line run uses ``package.module:factory``.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise UserError(f"a model name must be a non-empty string without ':', got {name!r}")
    if name in _BUILTIN:
        raise UserError(f"model {name!r} is built in; register yours under another name")
    if not callable(factory):
        raise UserError(f"register_model({name!r}, ...): the factory must be callable, got {type(factory).__name__}")
    MODELS[name] = factory


def model_label(spec) -> str:
    """The name a model spec is recorded under (config, checkpoints): the name itself, a
    factory's ``module:qualname``, or a ``Model``'s ``name``."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Model):
        return spec.name
    return f"{getattr(spec, '__module__', None) or 'python'}:{getattr(spec, '__qualname__', type(spec).__name__)}"


def _import_factory(spec: str):
    """``package.module:factory`` (a dotted attribute path after the colon) -> the callable.

    The module is imported from ``sys.path``, and from the current directory if it is not on it
    (so ``--model mymodels:net`` finds ``./mymodels.py`` whether ssdmpi runs as a script or ``-m``).
    """
    import importlib
    import os
    import sys

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UserError(f"--model {spec}: expected package.module:factory")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UserError(f"--model {spec}: cannot import {module_name!r} ({exc}); is it on PYTHONPATH "
                        "or in the current directory?") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"--model {spec}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"--model {spec}: {attr} is a {type(obj).__name__}, not a model factory")
    return obj


def _factory(spec):
    """``(label, factory, builtin)`` of a name, a ``module:factory`` string or a callable."""
    if callable(spec) and not isinstance(spec, str):
        return model_label(spec), spec, False
    if not isinstance(spec, str):
        raise UserError(f"a model is a name, package.module:factory, a factory or a Model; got {type(spec).__name__}")
    if spec in MODELS:
        return spec, MODELS[spec], spec in _BUILTIN
    if ":" in spec:
        return spec, _import_factory(spec), False
    raise UserError(f"unknown model {spec!r}; choose one of {', '.join(sorted(MODELS))}, "
                    "or give your own as package.module:factory")


def check_model(model, label: str, input_shape, num_classes: int, xp=None, dtype=None) -> Model:
    """``model`` if it is a ``Model`` for these inputs and classes (and ``xp``/``dtype`` if given);
    else ``UserError`` saying what the factory should have returned."""
    if not isinstance(model, Model):
        raise UserError(f"model {label}: the factory returned a {type(model).__name__}, not an ssdmpi.nn.Model "
                        "(build one from ssdmpi.nn layers: see docs/API.md)")
    if tuple(model.input_shape) != tuple(input_shape):
        raise UserError(f"model {label}: built for inputs {tuple(model.input_shape)}, but the data has "
                        f"{tuple(input_shape)} per sample")
    expected = (tuple(input_shape) if getattr(model, "input_kind", "features") == "tokens" else ()) + (int(num_classes),)
    if tuple(model.output_shape) != expected:
        raise UserError(f"model {label}: outputs {tuple(model.output_shape)} per sample, but the data has "
                        f"{num_classes} classes")
    if dtype is not None and model.dtype != np.dtype(dtype):
        raise UserError(f"model {label}: parameters are {model.dtype}, the run asks for {np.dtype(dtype)} "
                        "(pass dtype= through to ssdmpi.nn.Model)")
    if xp is not None and model.xp is not xp:
        raise UserError(f"model {label}: built with {getattr(model.xp, '__name__', model.xp)}, the run uses "
                        f"{getattr(xp, '__name__', xp)} (pass xp= through to ssdmpi.nn.Model)")
    return model


def build_model(name, input_shape, num_classes: int, **kwargs) -> Model:
    """Build a model. ``name``: a registered name (the table above, or ``register_model``'s), a
    ``package.module:factory`` string, a factory, or an already built ``Model`` (checked only).
    kwargs: ``xp``, ``dtype``, ``seed``, and model options (see the table). Returns a ``Model``
    for ``input_shape`` and ``num_classes`` (``UserError`` otherwise)."""
    input_shape = tuple(int(s) for s in input_shape)
    if isinstance(name, Model):
        return check_model(name, name.name, input_shape, num_classes, kwargs.get("xp"), kwargs.get("dtype"))
    label, builder, builtin = _factory(name)
    kwargs = {"xp": np, "dtype": np.float32, "seed": 0, **kwargs}   # Model's defaults, for any factory
    params = inspect.signature(builder).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    allowed = set(params) - {"input_shape", "num_classes", "kwargs"}
    if builtin:
        allowed |= {"xp", "dtype", "seed"} | ({"widths", "dropout"} if name == "wide-mlp" else set())
    options = {k: v for k, v in kwargs.items() if k not in ("xp", "dtype", "seed")}
    unknown = sorted(set(options) - allowed) if builtin or not takes_any else []
    if unknown:
        raise UserError(f"model {label!r}: bad option {', '.join(unknown)}; it takes "
                        f"{', '.join(sorted(allowed - {'xp', 'dtype', 'seed'})) or 'no options'}")
    passed = {k: v for k, v in kwargs.items() if builtin or takes_any or k in allowed}
    try:
        inspect.signature(builder).bind(input_shape, int(num_classes), **passed)
    except TypeError as exc:
        raise UserError(f"model {label}: the factory must take (input_shape, num_classes, *, xp, dtype, seed, "
                        f"**options); {exc}") from None
    try:
        model = builder(input_shape, int(num_classes), **passed)
    except ValueError as exc:
        if builtin:
            raise
        # a user's layers that do not fit the data (the engine names the layer and the shapes)
        raise UserError(f"model {label} does not fit inputs {input_shape}: {exc}") from None
    return check_model(model, label, input_shape, num_classes, kwargs.get("xp"), kwargs.get("dtype"))
