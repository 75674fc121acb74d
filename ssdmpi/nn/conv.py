"""Convolution and pooling by im2col + GEMM, on channel-major, batch-last (C, H, W, N) activations.

Inside a model, image activations are laid out ``(C, H, W, N)``: channel first,
the batch innermost (see :class:`~ssdmpi.nn.layers.ToChannelMajor`). Then a
whole batch's convolution is ONE matrix product,

    y (Cout, Ho*Wo*N) = W (Cout, Cin*k*k) @ cols (Cin*k*k, Ho*Wo*N),

its output is already in the same layout, the weight gradient is one more
(``dW = dy @ cols^T``), and per-channel statistics (BatchNorm) are row sums.
Batch-last makes im2col fast: for one kernel tap and one output row, the
window over ``(ow, n)`` is a run of ``Wo*N`` contiguous values (stride 1), so
the strided copy moves long runs instead of ``Wo``-pixel snippets.

The product is done in chunks of output rows (:func:`row_chunks`, CPU only):
each chunk's columns (about :data:`CHUNK_BYTES`) are copied into a workspace
buffer that stays in cache while the GEMM reads it, and the GEMM writes a
column block of ``y``; the full ``cols`` matrix is never materialised (ResNet-20
at batch 128 would hold ~75 MB per layer and stream it through memory twice).
Backward: for stride 1 the input gradient is itself a convolution -- of ``dy``
with the flipped, transposed kernel -- so it is another chunked im2col + GEMM,
and the same columns of ``dy`` give the weight gradient against ``x`` itself
(:meth:`Conv2d._backward_by_flipped_conv`). Other strides rebuild the columns of
``x`` for ``dW`` and fold ``W^T dy`` per chunk back (col2im) into a padded
accumulator.

Weights keep PyTorch's layout ``(Cout, Cin, kh, kw)``, so they copy 1:1 to and
from a ``torch.nn.Conv2d``.
"""

from __future__ import annotations

import numpy as np

from ssdmpi.nn import init as initializers
from ssdmpi.nn.layers import Layer, _xp, init_weight

# Target size of one chunk of im2col columns on the CPU: small enough to stay in the
# cache (32 MiB L3 shared by the cores) between the copy and the GEMM. Measured on the
# 2-core EPYC (Zen 3, OpenBLAS Haswell kernel, one thread): a ResNet-20 3x3 convolution
# forward at batch 128 runs 1.1x (64 channels) to 1.6x (16 channels) faster in one-row
# chunks (2.3 MiB each at that batch) than as one whole-batch im2col + GEMM.
CHUNK_BYTES = 2 << 20


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def row_chunks(xp, rows: int, row_bytes: int):
    """``[(r0, r1), ...]`` covering ``range(rows)`` in chunks of about :data:`CHUNK_BYTES`
    (at least one row each). One chunk on a GPU, where caches do not pay for extra launches."""
    if xp is not np:
        return [(0, rows)]
    step = max(1, CHUNK_BYTES // max(1, row_bytes))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def pad_images(x, padding: int, workspace, key="pad"):
    """``x`` (C, H, W, N; any strides) zero-padded by ``padding`` pixels on each side of H and W.

    A workspace buffer (valid until the next ``pad_images`` with the same key and
    shape) whose borders stay zero, or ``x`` itself when ``padding`` is 0.
    """
    if not padding:
        return x
    c, h, w, n = x.shape
    padded = workspace.get((key, padding), (c, h + 2 * padding, w + 2 * padding, n), x.dtype, zero=True)
    padded[:, padding:padding + h, padding:padding + w] = x   # borders stay zero
    return padded


def windows(padded, kh: int, kw: int, stride: int, r0: int, r1: int, wo: int):
    """The im2col view of output rows ``[r0, r1)``: shape (C, kh, kw, r1 - r0, Wo, N), with
    ``[c, i, j, r, ow, n] = padded[c, (r0 + r)*stride + i, ow*stride + j, n]``. No copy."""
    xp = _xp(padded)
    c, n = padded.shape[0], padded.shape[3]
    sc, sh, sw, sn = padded.strides
    return xp.lib.stride_tricks.as_strided(
        padded[:, r0 * stride:], (c, kh, kw, r1 - r0, wo, n), (sc, sh, sw, sh * stride, sw * stride, sn))


def im2col(x, kh: int, kw: int, stride: int, padding: int, workspace, key="cols"):
    """Columns of ``x`` (C, H, W, N; any strides): a workspace array (C, kh, kw, Ho, Wo, N).

    Element ``[c, i, j, oh, ow, n]`` is ``x_padded[c, oh*stride + i, ow*stride + j, n]``, so
    ``cols.reshape(C*kh*kw, Ho*Wo*N)`` is the GEMM operand. Valid until the next
    ``im2col`` with the same ``key`` and shape. (The layers build the same columns a
    chunk of rows at a time, see :func:`conv_gemm`.)
    """
    c, h, w, n = x.shape
    ho, wo = conv_output_size(h, kh, stride, padding), conv_output_size(w, kw, stride, padding)
    cols = workspace.get(key, (c, kh, kw, ho, wo, n), x.dtype)
    _xp(x).copyto(cols, windows(pad_images(x, padding, workspace), kh, kw, stride, 0, ho, wo))
    return cols


def conv_gemm(padded, wmat, k: int, stride: int, out_hw, workspace):
    """``wmat`` (Cout, C*k*k) applied to every k x k window of ``padded`` (C, Hp, Wp, N): a fresh
    (Cout, Ho, Wo, N) array, computed a chunk of output rows at a time."""
    xp = _xp(padded)
    c, n = padded.shape[0], padded.shape[3]
    (ho, wo), cout = out_hw, wmat.shape[0]
    y = xp.empty((cout, ho, wo, n), dtype=padded.dtype)
    y2, run = y.reshape(cout, -1), wo * n
    for r0, r1 in row_chunks(xp, ho, c * k * k * run * padded.itemsize):
        cols = workspace.get("cols", (c, k, k, r1 - r0, wo, n), padded.dtype)
        xp.copyto(cols, windows(padded, k, k, stride, r0, r1, wo))
        xp.matmul(wmat, cols.reshape(c * k * k, -1), out=y2[:, r0 * run:r1 * run])
    return y


def fold(dcols, acc, r0: int, stride: int) -> None:
    """Add the columns of output rows ``r0...`` (C, kh, kw, rows, Wo, N) into the padded image
    gradient ``acc`` (C, Hp, Wp, N), each at the pixel it was read from: the adjoint of
    :func:`windows`. One strided slice per kernel tap."""
    _, kh, kw, rows, wo, _ = dcols.shape
    for i in range(kh):
        h0 = r0 * stride + i
        for j in range(kw):
            acc[:, h0:h0 + (rows - 1) * stride + 1:stride, j:j + (wo - 1) * stride + 1:stride] += dcols[:, i, j]


def col2im(dcols, hw, stride: int, padding: int):
    """Adjoint of :func:`im2col`: a fresh (C, H, W, N) array summing each column entry into its pixel."""
    xp = _xp(dcols)
    c, n = dcols.shape[0], dcols.shape[-1]
    h, w = hw
    acc = xp.zeros((c, h + 2 * padding, w + 2 * padding, n), dtype=dcols.dtype)
    fold(dcols, acc, 0, stride)
    return _crop(acc, padding, h, w)


def _crop(padded, padding: int, h: int, w: int):
    """The (C, H, W, N) interior of a padded array, contiguous."""
    if not padding:
        return padded
    return _xp(padded).ascontiguousarray(padded[:, padding:padding + h, padding:padding + w])


def columns(padded, k: int, stride: int, r0: int, r1: int, wo: int, workspace):
    """The (C*k*k, (r1-r0)*Wo*N) im2col matrix of output rows ``[r0, r1)``, copied into the
    workspace's ``"cols"`` buffer (valid until the next use of that buffer)."""
    c, n = padded.shape[0], padded.shape[3]
    cols = workspace.get("cols", (c, k, k, r1 - r0, wo, n), padded.dtype)
    _xp(padded).copyto(cols, windows(padded, k, k, stride, r0, r1, wo))
    return cols.reshape(c * k * k, -1)


class Conv2d(Layer):
    """2-D convolution (cross-correlation, like PyTorch) with square kernel, stride and zero padding.

    Input (Cin, H, W, N) -> (Cout, Ho, Wo, N), Ho = (H + 2*padding - k) // stride + 1.
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

    def _wmat(self):
        return self.p["weight"].reshape(self.cout, self.fan_in)

    def _out_hw(self, x):
        return (conv_output_size(x.shape[1], self.k, self.stride, self.padding),
                conv_output_size(x.shape[2], self.k, self.stride, self.padding))

    def forward(self, x, train: bool = True):
        xp = _xp(x)
        self.x = x   # kept (not the columns): backward rebuilds the columns chunk by chunk
        if self._pointwise():
            y = (self._wmat() @ xp.ascontiguousarray(x).reshape(self.cin, -1)).reshape((self.cout,) + x.shape[1:])
        else:
            y = conv_gemm(pad_images(x, self.padding, self.workspace), self._wmat(), self.k, self.stride,
                          self._out_hw(x), self.workspace)
        if self.has_bias:
            y.reshape(self.cout, -1)[...] += self.p["bias"][:, None]
        return y

    def backward(self, dy):
        xp = _xp(dy)
        x, self.x = self.x, None
        dy2 = dy.reshape(self.cout, -1)
        if self.has_bias:
            xp.matmul(dy2, self.workspace.ones(dy2.shape[1], dy2.dtype), out=self.g["bias"])
        if self.input_grad and not self._pointwise() and self.stride == 1 and self.padding <= self.k - 1 and \
                self.cout * x.shape[1] * x.shape[2] <= 2 * self.cin * dy.shape[1] * dy.shape[2]:
            # dx is the convolution of dy (padded by k-1-p) with the flipped, transposed kernel:
            # im2col copies and GEMMs, instead of a k*k times larger GEMM output and col2im.
            # It pays when dy is not much bigger than x (ResNet's 'same' convolutions); LeNet's
            # 6 -> 16 channel, 14 -> 10 pixel conv2 is cheaper the col2im way.
            return self._backward_by_flipped_conv(x, dy)
        self._weight_grad(x, dy2)
        if not self.input_grad:
            return None
        if self._pointwise():
            return (self._wmat().T @ dy2).reshape(x.shape)
        return self._col2im_grad(dy2, x.shape, dy.shape[1:3])

    def _backward_by_flipped_conv(self, x, dy):
        """Stride 1: dx and dW from the same columns of ``dy`` (padded by q = k-1-p), chunk by chunk.

        With ``dcols[(o, i, j), (h, w, n)] = dy_padded[o, h + i, w + j, n]``:
        ``dx = flip(W)^T @ dcols`` (flip: kernel rotated 180 degrees, in and out channels swapped),
        and ``dW[o, c, k-1-i, k-1-j] = (dcols @ x^T)[(o, i, j), c]`` -- so the weight gradient
        needs no columns of ``x`` (one im2col copy less per convolution).
        """
        xp, ws, k = _xp(dy), self.workspace, self.k
        cin, h, w, n = x.shape
        padded = pad_images(dy, k - 1 - self.padding, ws)
        flipped = xp.ascontiguousarray(self.p["weight"][:, :, ::-1, ::-1].transpose(1, 0, 2, 3)).reshape(cin, -1)
        x2 = xp.ascontiguousarray(x).reshape(cin, -1)
        dx = xp.empty(x.shape, dtype=dy.dtype)
        dx2, run = dx.reshape(cin, -1), w * n
        gflip = ws.get("dw_flipped", (self.cout * k * k, cin), dy.dtype)       # rows (o, i, j), flipped taps
        for r0, r1 in row_chunks(xp, h, self.cout * k * k * run * dy.itemsize):
            dcols = columns(padded, k, 1, r0, r1, w, ws)
            xp.matmul(flipped, dcols, out=dx2[:, r0 * run:r1 * run])
            part = gflip if r0 == 0 else ws.get("dw_flipped_part", gflip.shape, gflip.dtype)
            xp.matmul(dcols, x2[:, r0 * run:r1 * run].T, out=part)
            if r0:
                gflip += part
        self.g["weight"][...] = gflip.reshape(self.cout, k, k, cin)[:, ::-1, ::-1].transpose(0, 3, 1, 2)
        return dx

    def _weight_grad(self, x, dy2) -> None:
        """dW = dy @ cols^T, summed over the row chunks, written into the weight gradient."""
        xp = _xp(dy2)
        gw = self.g["weight"].reshape(self.cout, self.fan_in)
        if self._pointwise():
            xp.matmul(dy2, xp.ascontiguousarray(x).reshape(self.cin, -1).T, out=gw)
            return
        padded = pad_images(x, self.padding, self.workspace)
        (ho, wo), run = self._out_hw(x), self._out_hw(x)[1] * x.shape[3]
        for r0, r1 in row_chunks(xp, ho, self.fan_in * run * x.itemsize):
            cols = columns(padded, self.k, self.stride, r0, r1, wo, self.workspace)
            part = gw if r0 == 0 else self.workspace.get("dw", gw.shape, gw.dtype)
            xp.matmul(dy2[:, r0 * run:r1 * run], cols.T, out=part)
            if r0:
                gw += part

    def _col2im_grad(self, dy2, x_shape, out_hw):
        """dx for strides > 1 (or dy much bigger than x): dcols = W^T dy per row chunk, folded into
        a zero-padded accumulator, whose interior is dx."""
        xp = _xp(dy2)
        cin, h, w, n = x_shape
        (ho, wo), run, p, k = out_hw, out_hw[1] * n, self.padding, self.k
        acc = xp.zeros((cin, h + 2 * p, w + 2 * p, n), dtype=dy2.dtype)
        for r0, r1 in row_chunks(xp, ho, self.fan_in * run * dy2.itemsize):
            dcols = self.workspace.get("cols", (cin, k, k, r1 - r0, wo, n), dy2.dtype)
            xp.matmul(self._wmat().T, dy2[:, r0 * run:r1 * run], out=dcols.reshape(self.fan_in, -1))
            fold(dcols, acc, r0, self.stride)
        return _crop(acc, p, h, w)


class MaxPool2d(Layer):
    """Max pooling over k x k windows with the given stride (default k), no padding (floor mode, like PyTorch).

    (C, H, W, N) in and out. Backward routes each output's gradient to the first
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
        """The k*k strided views ``a[:, i::stride, j::stride]`` (cropped to Ho x Wo), window order."""
        s = self.stride
        return [a[:, i:i + s * (ho - 1) + 1:s, j:j + s * (wo - 1) + 1:s]
                for i in range(self.k) for j in range(self.k)]

    def forward(self, x, train: bool = True):
        # A running maximum over the k*k strided views: elementwise work on (C, Ho, Wo, N)
        # arrays, much faster than an argmax across a gathered window axis.
        xp = _xp(x)
        ho = conv_output_size(x.shape[1], self.k, self.stride, 0)
        wo = conv_output_size(x.shape[2], self.k, self.stride, 0)
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
        ho, wo = dy.shape[1:3]
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
    """(C, H, W, N) -> batch-major (N, C): the mean over each channel's pixels."""

    channel_major = True

    def __init__(self, name: str = "avgpool"):
        self.name = name

    def output_shape(self, input_shape):
        if len(input_shape) != 3:
            raise self._shape_error("channels, height, width", input_shape)
        return (input_shape[0],)

    def forward(self, x, train: bool = True):
        xp = _xp(x)
        c, h, w, n = x.shape
        self.in_shape = x.shape
        y = xp.ascontiguousarray(x).reshape(c, h * w, n).sum(axis=1)
        y *= 1.0 / (h * w)
        return xp.ascontiguousarray(y.T)

    def backward(self, dy):
        xp = _xp(dy)
        h, w = self.in_shape[1:3]
        dx = xp.empty(self.in_shape, dtype=dy.dtype)
        dx[...] = (dy.T * (1.0 / (h * w)))[:, None, None, :]
        return dx
