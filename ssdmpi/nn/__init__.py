"""The neural-net engine: layers, loss, initialisers, flat storage, model registry.

NumPy on the CPU, CuPy on a GPU (pass ``xp=``), no deep-learning framework at run time.

    model = build_model("resnet20", (3, 32, 32), 10, xp=numpy, dtype=numpy.float32, seed=0)
    loss = model.loss_and_grad(x, labels)   # x: (batch, 3, 32, 32) float32, NCHW; labels: (batch,) ints
    model.params, model.grads                # ONE flat 1-D buffer each; layers hold views into them
    model.flat.specs, model.flat.decay_mask()
    model.buffers() / model.load_buffers(d)  # BN running statistics + Dropout RNG states

Models: ``mlp`` (``widths``, ``dropout``), ``wide-mlp``, ``lenet5``, ``resnet20`` (``shortcut``
"A"/"B"), ``gpt`` (token ids in: ``n_layer``, ``n_head``, ``d_model``, ``context``, ``dropout``);
see ``models.py``. Layers: ``layers.py`` (Linear, ReLU, Flatten, Dropout, layout changes),
``conv.py`` (Conv2d, MaxPool2d, GlobalAvgPool2d), ``norm.py`` (BatchNorm, LayerNorm),
``residual.py`` (BasicBlock), ``embedding.py`` (token and positional embeddings, the tied
head), ``attention.py`` (causal self-attention), ``transformer.py`` (GELU, MLP, the GPT block).
Gradient checks and the PyTorch twins: ``ssdmpi/verify/``.
"""

from ssdmpi.nn.flat import FlatParams, ParamSpec
from ssdmpi.nn.model import Model
from ssdmpi.nn.models import MODELS, build_model, register_model

__all__ = ["FlatParams", "ParamSpec", "Model", "MODELS", "build_model", "register_model"]
