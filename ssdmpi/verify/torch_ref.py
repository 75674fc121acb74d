"""PyTorch twins of the registry's models: the test oracle and the benchmark peer.

PyTorch is NEVER a runtime dependency: this module imports it inside its
functions, and only the tests and ``ssdmpi bench engine`` call them. Each twin
has the same tensor names as the ssdmpi model (``fc1.weight``,
``layer2.0.shortcut_bn.bias``, ...), so weights and BN statistics copy by name.
"""

from __future__ import annotations

import numpy as np

from ssdmpi.backend import to_host


def torch_available() -> tuple[bool, str]:
    """``(True, version)`` if PyTorch imports, else ``(False, why not)``."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install
        return False, f"PyTorch not importable ({type(exc).__name__}: {exc})"
    return True, torch.__version__


def build_torch_model(model):
    """A ``torch.nn.Module`` computing the same function as the ssdmpi ``model`` (a registry model),
    with its parameters and buffers copied in (float32 or float64, like ``model``); for ``gpt``,
    nanoGPT's module (``torch_gpt.py``)."""
    if getattr(model, "input_kind", "features") == "tokens":
        from ssdmpi.verify.torch_gpt import build_torch_gpt
        return build_torch_gpt(model)
    import torch
    import torch.nn.functional as F
    from torch import nn

    from ssdmpi.nn.conv import Conv2d, GlobalAvgPool2d, MaxPool2d
    from ssdmpi.nn.layers import Dropout, Flatten, Linear, ReLU, ToBatchMajor, ToChannelMajor
    from ssdmpi.nn.norm import BatchNorm
    from ssdmpi.nn.residual import BasicBlock

    class Block(nn.Module):
        def __init__(self, b: BasicBlock):
            super().__init__()
            self.conv1, self.bn1 = convert(b.conv1), convert(b.bn1)
            self.conv2, self.bn2 = convert(b.conv2), convert(b.bn2)
            self.identity, self.stride, self.pad = b.identity, b.stride, (b.cout - b.cin) // 2
            if b.projection:
                self.shortcut_conv, self.shortcut_bn = convert(b.projection[0]), convert(b.projection[1])
            self.projection = bool(b.projection)

        def forward(self, x):
            out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            if self.identity:
                s = x
            elif self.projection:
                s = self.shortcut_bn(self.shortcut_conv(x))
            else:   # option A
                s = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, self.pad, self.pad))
            return F.relu(out + s)

    def convert(layer):
        if isinstance(layer, Linear):
            return nn.Linear(layer.in_features, layer.out_features, bias=layer.has_bias)
        if isinstance(layer, Conv2d):
            return nn.Conv2d(layer.cin, layer.cout, layer.k, layer.stride, layer.padding, bias=layer.has_bias)
        if isinstance(layer, BatchNorm):
            cls = nn.BatchNorm2d if layer.spatial else nn.BatchNorm1d
            return cls(layer.c, eps=layer.eps, momentum=layer.momentum)
        if isinstance(layer, (ToChannelMajor, ToBatchMajor)):
            return nn.Identity()    # PyTorch stays NCHW throughout
        if isinstance(layer, ReLU):
            return nn.ReLU()
        if isinstance(layer, Flatten):
            return nn.Flatten()
        if isinstance(layer, MaxPool2d):
            return nn.MaxPool2d(layer.k, layer.stride)
        if isinstance(layer, GlobalAvgPool2d):
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        if isinstance(layer, Dropout):
            return nn.Dropout(layer.rate)
        if isinstance(layer, BasicBlock):
            return Block(layer)
        if layer.children() and [c.name for c in layer.children()] == [str(i) for i in range(len(layer.children()))]:
            return nn.Sequential(*[convert(c) for c in layer.children()])   # a stage: children named 0, 1, 2
        raise TypeError(f"no PyTorch twin for {type(layer).__name__}")

    class Twin(nn.Module):
        def __init__(self):
            super().__init__()
            self.order = []
            for layer in model.layers:
                self.add_module(layer.name, convert(layer))
                self.order.append(layer.name)

        def forward(self, x):
            for name in self.order:
                x = getattr(self, name)(x)
            return x

    twin = Twin()
    twin = twin.to(torch.float64 if model.dtype == np.float64 else torch.float32)
    copy_to_torch(model, twin)
    return twin


def copy_to_torch(model, twin) -> None:
    """Copy ``model``'s parameters and BN running statistics into ``twin`` (matched by name)."""
    import torch
    state = twin.state_dict()
    with torch.no_grad():
        for spec in model.flat.specs:
            state[spec.name].copy_(torch.from_numpy(to_host(model.flat.view(spec.name)).copy()))
        for key, value in model.buffers().items():
            if key in state:
                state[key].copy_(torch.from_numpy(to_host(value).copy()))


def torch_grads(model, twin) -> np.ndarray:
    """``twin``'s parameter gradients packed in ``model``'s flat order (a host array)."""
    params = dict(twin.named_parameters())
    out = np.empty(model.num_params, dtype=model.dtype)
    for spec in model.flat.specs:
        out[spec.offset:spec.offset + spec.size] = params[spec.name].grad.detach().numpy().reshape(-1)
    return out
