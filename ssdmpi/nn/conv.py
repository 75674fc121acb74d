"""Convolution and pooling by im2col + GEMM, on channel-major (CNHW) activations.

Inside a model, image activations are laid out channel-major, ``(C, N, H, W)``
(see :class:`~ssdmpi.nn.layers.ToChannelMajor`). Then a whole batch's
convolution is ONE matrix product,

    y (Cout, N*Ho*Wo) = W (Cout, Cin*k*k) @ cols (Cin*k*k, N*Ho*Wo),

its output is already channel-major, the weight gradient is one more
(``dW = dy @ cols^T``), and per-channel statistics (BatchNorm) are row sums.
im2col builds ``cols`` with ONE strided copy (``as_strided`` over a zero-padded
input) into a workspace buffer shared by the model's layers. Backward rebuilds
the columns instead of keeping one matrix per layer (ResNet-20 at batch 128
would otherwise hold ~0.8 GB of them). For stride 1 the input gradient is itself
a convolution -- of ``dy`` with the flipped, transposed kernel -- so it is
another im2col + GEMM; other strides use ``W^T dy`` and col2im.

Weights keep PyTorch's layout ``(Cout, Cin, kh, kw)``, so they copy 1:1 to and
from a ``torch.nn.Conv2d``.
"""

from __future__ import annotations

import numpy as np

from ssdmpi.nn import init as initializers
from ssdmpi.nn.layers import Layer, _xp, init_weight


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def im2col(x, kh: int, kw: int, stride: int, padding: int, workspace, key="cols"):
    """Columns of the channel-major ``x`` (C, N, H, W; any strides): a workspace array (C, kh, kw, N, Ho, Wo).

    Element ``[c, i, j, n, oh, ow]`` is ``x_padded[c, n, oh*stride + i, ow*stride + j]``, so
    ``cols.reshape(C*kh*kw, N*Ho*Wo)`` is the GEMM operand. Valid until the next
    ``im2col`` with the same ``key`` and shape.
    """
    xp = _xp(x)
    c, n, h, w = x.shape
    ho, wo = conv_output_size(h, kh, stride, padding), conv_output_size(w, kw, stride, padding)
    if padding:
        padded = workspace.get(("pad", padding), (c, n, h + 2 * padding, w + 2 * padding), x.dtype, zero=True)
        padded[:, :, padding:padding + h, padding:padding + w] = x   # borders stay zero
    else:
        padded = x
    sc, sn, sh, sw = padded.strides
    windows = xp.lib.stride_tricks.as_strided(
        padded, (c, kh, kw, n, ho, wo), (sc, sh, sw, sn, sh * stride, sw * stride))
    cols = workspace.get(key, (c, kh, kw, n, ho, wo), x.dtype)
    xp.copyto(cols, windows)
    return cols


def col2im(dcols, hw, stride: int, padding: int):
    """Adjoint of :func:`im2col`: a fresh (C, N, H, W) array summing each column entry into its pixel.

    Each of the kh*kw kernel offsets adds one strided slice; padding is handled by
    clipping the slices to the image instead of materialising a padded buffer.
    """
    xp = _xp(dcols)
    c, kh, kw, n, ho, wo = dcols.shape
    h, w = hw
    dx = xp.zeros((c, n, h, w), dtype=dcols.dtype)
    for i in range(kh):
        oh0, oh1, h0 = _clip(i, ho, h, stride, padding)
        if oh1 <= oh0:
            continue
        for j in range(kw):
            ow0, ow1, w0 = _clip(j, wo, w, stride, padding)
            if ow1 <= ow0:
                continue
            dx[:, :, h0:h0 + (oh1 - oh0 - 1) * stride + 1:stride,
               w0:w0 + (ow1 - ow0 - 1) * stride + 1:stride] += dcols[:, i, j, :, oh0:oh1, ow0:ow1]
    return dx


def _clip(offset: int, out_size: int, in_size: int, stride: int, padding: int):
    """Output positions ``[o0, o1)`` whose input ``o*stride + offset - padding`` lies inside ``[0, in_size)``,
    and the input position of ``o0``."""
    o0 = max(0, -((offset - padding) // stride))            # ceil((padding - offset) / stride)
    o1 = min(out_size, (in_size - 1 + padding - offset) // stride + 1)
    return o0, o1, o0 * stride + offset - padding


class Conv2d(Layer):
    """2-D convolution (cross-correlation, like PyTorch) with square kernel, stride and zero padding.

    Channel-major input (Cin, N, H, W) -> (Cout, N, Ho, Wo), Ho = (H + 2*padding - k) // stride + 1.
    Parameters: ``weight`` (Cout, Cin, k, k), decayed; ``bias`` (Cout,) if ``bias``, not decayed.
    ``init``: ``"default"`` (PyTorch's), ``"kaiming"`` (He normal, fan_in; ResNets), ``"xavier"``.
    """

    channel_major = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 bias: bool = True, name: str = "conv", init: str = "default"):
        self.cin, self.cout, self.k = int(in_channels), int(out_channels), int(kernel_size)
        self.stride, self.padding, self.has_bias, self.name, self.init = int(stride), int(padding), bias, name, init

    @property
    def fan_in(self) -> int:
        return self.cin * self.k * self.k

    def declare(self):
        shape = (self.cout, self.cin, self.k, self.k)
        out = [("weight", shape, True,
                lambda rng: init_weight(rng, self.init, shape, self.fan_in, self.cout * self.k * self.k))]
        if self.has_bias:
            out.append(("bias", (self.cout,), False,
                        lambda rng: initializers.bias_uniform(rng, (self.cout,), self.fan_in)
                        if self.init == "default" else np.zeros(self.cout)))
        return out

    def output_shape(self, input_shape):
        if len(input_shape) != 3 or input_shape[0] != self.cin:
            raise self._shape_error(f"{self.cin}, height, width", input_shape)
        ho = conv_output_size(input_shape[1], self.k, self.stride, self.padding)
        wo = conv_output_size(input_shape[2], self.k, self.stride, self.padding)
        if ho < 1 or wo < 1:
            raise ValueError(f"{self.name}: input of {input_shape[1]}x{input_shape[2]} pixels is smaller than the "
                             f"{self.k}x{self.k} kernel (padding {self.padding})")
        return (self.cout, ho, wo)

    def _pointwise(self) -> bool:
        return self.k == 1 and self.stride == 1 and self.padding == 0

    def _columns(self, x):
        """(Cin*k*k, N*Ho*Wo): the im2col matrix (``x`` itself for a 1x1, stride-1 convolution)."""
        if self._pointwise():
            return _xp(x).ascontiguousarray(x).reshape(self.cin, -1)
        return im2col(x, self.k, self.k, self.stride, self.padding, self.workspace).reshape(self.fan_in, -1)

    def _wmat(self):
        return self.p["weight"].reshape(self.cout, self.fan_in)

    def forward(self, x, train: bool = True):
        n, h, w = x.shape[1:]
        ho = conv_output_size(h, self.k, self.stride, self.padding)
        wo = conv_output_size(w, self.k, self.stride, self.padding)
        self.x = x   # kept (not the columns): backward rebuilds the columns in the shared workspace
        y = self._wmat() @ self._columns(x)
        if self.has_bias:
            y += self.p["bias"][:, None]
        return y.reshape(self.cout, n, ho, wo)

    def backward(self, dy):
        xp = _xp(dy)
        x, self.x = self.x, None
        cols = self._columns(x)
        dy2 = dy.reshape(self.cout, -1)
        xp.matmul(dy2, cols.T, out=self.g["weight"].reshape(self.cout, self.fan_in))
        if self.has_bias:
            xp.matmul(dy2, self.workspace.ones(dy2.shape[1], dy2.dtype), out=self.g["bias"])
        if not self.input_grad:
            return None
        if self._pointwise():
            return (self._wmat().T @ dy2).reshape(x.shape)
        if self.stride == 1 and self.padding <= self.k - 1 and \
                self.cout * x.shape[2] * x.shape[3] <= 2 * self.cin * dy.shape[2] * dy.shape[3]:
            # dx is the convolution of dy (padded by k-1-p) with the flipped, transposed kernel:
            # an im2col copy and a GEMM, instead of a k*k times larger GEMM output and col2im.
            # It pays when dy is not much bigger than x (ResNet's 'same' convolutions); LeNet's
            # 6 -> 16 channel, 14 -> 10 pixel conv2 is cheaper the col2im way.
            flipped = xp.ascontiguousarray(self.p["weight"][:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
            dcols = im2col(dy, self.k, self.k, 1, self.k - 1 - self.padding, self.workspace)
            return (flipped.reshape(self.cin, -1) @ dcols.reshape(self.cout * self.k * self.k, -1)).reshape(x.shape)
        # Otherwise (stride > 1, or dy much bigger than x): dcols = W^T dy, written over the columns
        # (no longer needed), folded back by col2im.
        xp.matmul(self._wmat().T, dy2, out=cols)
        return col2im(cols.reshape(self.cin, self.k, self.k, *dy.shape[1:]), x.shape[2:], self.stride, self.padding)


class MaxPool2d(Layer):
    """Max pooling over k x k windows with the given stride (default k), no padding (floor mode, like PyTorch).

    Channel-major in and out. Backward routes each output's gradient to the first
    maximal element of its window.
    """

    channel_major = True

    def __init__(self, kernel_size: int = 2, stride: int | None = None, name: str = "pool"):
        self.k, self.stride, self.name = int(kernel_size), int(stride or kernel_size), name

    def output_shape(self, input_shape):
        if len(input_shape) != 3:
            raise self._shape_error("channels, height, width", input_shape)
        c, h, w = input_shape
        ho, wo = conv_output_size(h, self.k, self.stride, 0), conv_output_size(w, self.k, self.stride, 0)
        if ho < 1 or wo < 1:
            raise ValueError(f"{self.name}: input of {h}x{w} pixels is smaller than the {self.k}x{self.k} window")
        return (c, ho, wo)

    def _taps(self, a, ho, wo):
        """The k*k strided views ``a[..., i::stride, j::stride]`` (cropped to Ho x Wo), window order."""
        s = self.stride
        return [a[:, :, i:i + s * (ho - 1) + 1:s, j:j + s * (wo - 1) + 1:s]
                for i in range(self.k) for j in range(self.k)]

    def forward(self, x, train: bool = True):
        # A running maximum over the k*k strided views: elementwise work on (C, N, Ho, Wo)
        # arrays, much faster than an argmax across a gathered window axis.
        xp = _xp(x)
        ho = conv_output_size(x.shape[2], self.k, self.stride, 0)
        wo = conv_output_size(x.shape[3], self.k, self.stride, 0)
        taps = self._taps(x, ho, wo)
        best = taps[0].copy()
        for tap in taps[1:]:
            xp.maximum(best, tap, out=best)
        self.x, self.best = x, best       # x is referenced, not copied; backward finds the maxima again
        return best

    def backward(self, dy):
        xp = _xp(dy)
        x, best, self.x, self.best = self.x, self.best, None, None
        dx = xp.zeros(x.shape, dtype=dy.dtype)
        unclaimed = None
        ho, wo = dy.shape[2:]
        for tap_x, tap_dx in zip(self._taps(x, ho, wo), self._taps(dx, ho, wo)):
            hit = tap_x == best
            if unclaimed is None:                 # ties: the first maximum in window order wins
                unclaimed = ~hit
            else:
                hit &= unclaimed
                unclaimed &= ~hit
            tap_dx += dy * hit                    # += : overlapping windows (stride < k) accumulate
        return dx


class GlobalAvgPool2d(Layer):
    """Channel-major (C, N, H, W) -> batch-major (N, C): the mean over each channel's pixels."""

    channel_major = True

    def __init__(self, name: str = "avgpool"):
        self.name = name

    def output_shape(self, input_shape):
        if len(input_shape) != 3:
            raise self._shape_error("channels, height, width", input_shape)
        return (input_shape[0],)

    def forward(self, x, train: bool = True):
        xp = _xp(x)
        c, n, h, w = x.shape
        self.in_shape = x.shape
        # A GEMV against a ones vector: BLAS, instead of NumPy's slower strided reduction.
        y = xp.ascontiguousarray(x).reshape(c * n, h * w) @ self.workspace.ones(h * w, x.dtype)
        y *= 1.0 / (h * w)
        return xp.ascontiguousarray(y.reshape(c, n).T)

    def backward(self, dy):
        xp = _xp(dy)
        c, n, h, w = self.in_shape
        dx = xp.empty(self.in_shape, dtype=dy.dtype)
        dx[...] = (dy.T * (1.0 / (h * w)))[:, :, None, None]
        return dx
