"""The CIFAR ResNet basic block (He et al. 2016, section 4.2).

    out = relu( bn2(conv2( relu(bn1(conv1(x))) )) + shortcut(x) )

conv1 is 3x3 with the block's stride, conv2 3x3 stride 1, both without bias.
When the block changes shape (stride 2, more channels) the shortcut is:
- option ``"A"`` (the paper's choice for CIFAR, and the default): identity on
  every second pixel, with the new channels zero-padded equally on both sides
  ``(out - in) // 2`` -- no parameters, so ResNet-20 has 0.27 M parameters;
- option ``"B"``: a 1x1 convolution with the stride, then BatchNorm (the
  "projection" shortcut; torchvision's ``downsample``), +2.8 k parameters on ResNet-20.
Otherwise the shortcut is the identity.
"""

from __future__ import annotations

from ssdmpi.nn.conv import Conv2d
from ssdmpi.nn.layers import Layer, ReLU
from ssdmpi.nn.norm import BatchNorm


class BasicBlock(Layer):
    """Two 3x3 conv-BN layers with a shortcut; children are named like torchvision's (conv1, bn1, ...).

    Channel-major (C, H, W, N) in and out.
    """

    channel_major = True

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, shortcut: str = "A",
                 name: str = "block"):
        if shortcut not in ("A", "B"):
            raise ValueError(f"{name}: shortcut must be 'A' or 'B', got {shortcut!r}")
        self.cin, self.cout, self.stride, self.name = in_channels, out_channels, stride, name
        self.conv1 = Conv2d(in_channels, out_channels, 3, stride, 1, bias=False, name="conv1", init="kaiming")
        self.bn1 = BatchNorm(out_channels, name="bn1")
        self.relu1 = ReLU(name="relu1")
        self.conv2 = Conv2d(out_channels, out_channels, 3, 1, 1, bias=False, name="conv2", init="kaiming")
        self.bn2 = BatchNorm(out_channels, name="bn2")
        self.relu2 = ReLU(name="relu2")
        self.identity = stride == 1 and in_channels == out_channels
        self.option = shortcut
        self.main = [self.conv1, self.bn1, self.relu1, self.conv2, self.bn2]
        self.projection = []
        if not self.identity and shortcut == "B":
            self.projection = [Conv2d(in_channels, out_channels, 1, stride, 0, bias=False, name="shortcut_conv",
                                      init="kaiming"),
                               BatchNorm(out_channels, name="shortcut_bn")]

    def children(self):
        return self.main + self.projection + [self.relu2]

    def output_shape(self, input_shape):
        shape = tuple(input_shape)
        for layer in self.main:
            shape = layer.output_shape(shape)
        return shape

    def _pad_channels(self) -> int:
        return (self.cout - self.cin) // 2

    def forward(self, x, train: bool = True):
        out = x
        for layer in self.main:
            out = layer.forward(out, train)
        # out is bn2's fresh output: the shortcut is added in place.
        if self.identity:
            out += x
        elif self.projection:
            s = x
            for layer in self.projection:
                s = layer.forward(s, train)
            out += s
        else:   # option A: subsample, zero-pad the channels
            pad = self._pad_channels()
            out[pad:pad + self.cin] += x[:, ::self.stride, ::self.stride]
        self.in_shape = x.shape
        return self.relu2.forward(out, train)

    def backward(self, dy):
        d = self.relu2.backward(dy)
        # The main branch starts with BatchNorm, which reads d without writing it, so the
        # shortcut can read d afterwards.
        dx = d
        for layer in reversed(self.main):
            dx = layer.backward(dx)
        if self.identity:
            dx += d
        elif self.projection:
            ds = d
            for layer in reversed(self.projection):
                ds = layer.backward(ds)
            dx += ds
        else:
            pad = self._pad_channels()
            dx[:, ::self.stride, ::self.stride] += d[pad:pad + self.cin]
        return dx
