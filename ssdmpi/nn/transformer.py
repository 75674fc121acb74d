"""The GPT transformer block (pre-LayerNorm, as GPT-2 and nanoGPT's ``Block``), its MLP and GELU.

    x = x + attn(ln_1(x))          attn: :class:`~ssdmpi.nn.attention.CausalSelfAttention`
    x = x + mlp(ln_2(x))           mlp: c_fc (C -> 4C) -> GELU -> c_proj (4C -> C) [-> dropout]

GELU is the tanh approximation (GPT-2's; ``torch.nn.GELU(approximate="tanh")``):
    gelu(h) = h/2 (1 + tanh(u)),  u = sqrt(2/pi) (h + 0.044715 h^3)
    gelu'(h) = (1 + tanh(u))/2 + h/2 (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 h^2)

Activations are (B, T, C); inside a block every Linear and LayerNorm works on the (B*T, C)
view, so each projection is one GEMM over all tokens. Residual additions are done in place
into the branch's fresh output. The branches never write their ``dy`` (a dropout copies
first), so the block's backward hands the same gradient to its branch and to its skip path.

``nanogpt_name`` maps the gpt model's tensor names to a nanoGPT module's ``state_dict`` names
(``h.0.attn.c_attn.weight`` -> ``transformer.h.0.attn.c_attn.weight``); the tied output head
``lm_head.weight`` is the same tensor as ``transformer.wte.weight`` (:data:`NANOGPT_TIED`).
"""

from __future__ import annotations

import math

import numpy as np

from ssdmpi.nn.attention import INIT_STD, CausalSelfAttention, GPTLinear
from ssdmpi.nn.layers import Dropout, Layer, _xp
from ssdmpi.nn.norm import LayerNorm

GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715
# Row blocks of the GELU's elementwise passes on the CPU: a block's temporaries are block-sized
# (not two more (B*T, 4C) arrays) and stay in cache between the passes. Measured on the 2-core
# EPYC, one thread, the preset's MLP at 32 x 128 tokens: 106 ms forward + backward in 512 KiB
# blocks, 112 ms in one block.
ROW_BLOCK_BYTES = 512 << 10

# torch state_dict name -> the torch name of the tensor it is tied to (both exist in nanoGPT's
# state_dict; a safetensors export keeps one)
NANOGPT_TIED = {"lm_head.weight": "transformer.wte.weight"}


def nanogpt_name(name: str) -> str:
    """The nanoGPT ``state_dict`` name of a gpt model's tensor ``name`` (``wte.weight``,
    ``h.3.mlp.c_fc.bias``, ``ln_f.weight``, ...): ``transformer.`` + ``name``."""
    return f"transformer.{name}"


def _denominator(h, tmp) -> None:
    """``tmp = 1 + exp(-2u)`` for a block of rows (1 / sigmoid(2u))."""
    xp = _xp(h)
    xp.multiply(h, h, out=tmp)
    tmp *= -2.0 * GELU_C * GELU_A
    tmp -= 2.0 * GELU_C
    tmp *= h                                      # -2u
    xp.exp(tmp, out=tmp)
    tmp += 1.0


def gelu_rows(h, out, tmp) -> None:
    """``out = gelu(h)`` for a block of rows, as h * sigmoid(2u) (= h/2 (1 + tanh u)); ``tmp``: scratch
    of h's shape."""
    _denominator(h, tmp)
    _xp(h).divide(h, tmp, out=out)


def gelu_grad_rows(h, dy, tmp, tmp2, out=None) -> None:
    """``dy *= gelu'(h)`` in place for a block of rows (and ``out = gelu(h)`` when given); ``tmp``,
    ``tmp2``: scratch of h's shape.

    With s = sigmoid(2u): gelu' = s (1 + 2 c h (1 - s) (1 + 3a h^2)) (the tanh form of the module
    docstring, rewritten)."""
    xp = _xp(h)
    _denominator(h, tmp)
    if out is not None:
        xp.divide(h, tmp, out=out)
    xp.reciprocal(tmp, out=tmp)                   # s
    xp.multiply(h, h, out=tmp2)
    tmp2 *= 6.0 * GELU_C * GELU_A
    tmp2 += 2.0 * GELU_C
    tmp2 *= h                                     # 2 c h (1 + 3a h^2)
    dy *= tmp
    xp.subtract(1.0, tmp, out=tmp)
    tmp *= tmp2
    tmp += 1.0                                    # 1 + 2 c h (1 - s) (1 + 3a h^2)
    dy *= tmp


def _row_blocks(xp, rows: int, row_bytes: int):
    """Row ranges of about :data:`ROW_BLOCK_BYTES` (one range on a GPU, where caches do not pay
    for extra launches)."""
    if xp is not np:
        return [(0, rows)]
    step = max(1, ROW_BLOCK_BYTES // max(1, row_bytes))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


class GELU(Layer):
    """Tanh-approximated GELU (module docstring), elementwise in cache-sized row blocks; keeps its
    input for backward (and recomputes the rest there); ``dy`` is read-only."""

    def __init__(self, name: str = "gelu"):
        self.name = name

    def forward(self, x, train: bool = True):
        xp = _xp(x)
        x2 = x.reshape(-1, x.shape[-1])
        y = xp.empty_like(x2)
        for r0, r1 in _row_blocks(xp, x2.shape[0], x2.shape[1] * x2.itemsize):
            tmp = self.workspace.get("gelu_tmp", (r1 - r0, x2.shape[1]), x2.dtype)
            gelu_rows(x2[r0:r1], y[r0:r1], tmp)
        self.x = x
        return y.reshape(x.shape)

    def backward(self, dy):
        xp = _xp(dy)
        x, self.x = self.x, None
        x2 = x.reshape(-1, x.shape[-1])
        dx = dy.reshape(x2.shape).copy()
        for r0, r1 in _row_blocks(xp, x2.shape[0], x2.shape[1] * x2.itemsize):
            shape = (r1 - r0, x2.shape[1])
            gelu_grad_rows(x2[r0:r1], dx[r0:r1], self.workspace.get("gelu_tmp", shape, x2.dtype),
                           self.workspace.get("gelu_tmp2", shape, x2.dtype))
        return dx.reshape(dy.shape)


class MLP(Layer):
    """(B, T, C) -> (B, T, C): ``c_fc`` (C -> 4C), GELU, ``c_proj`` (4C -> C, init std
    ``proj_std``), then ``dropout`` when > 0.

    Fused: the GELU output (c_proj's input, 4C values per token) is never kept. Forward
    writes it into a workspace buffer for the c_proj GEMM; backward computes ``dg = dy Wp``
    first, then, row block by row block, recomputes the GELU output (for ``dWp = dy^T g``) and
    turns ``dg`` into ``dh = dg * gelu'(h)`` in place -- one ``exp`` per element in each pass.
    Kept for backward: c_fc's input and output (h).
    """

    def __init__(self, dim: int, dropout: float = 0.0, proj_std: float = INIT_STD, name: str = "mlp"):
        self.dim, self.name = dim, name
        self.c_fc = GPTLinear(dim, 4 * dim, name="c_fc")
        self.c_proj = GPTLinear(4 * dim, dim, std=proj_std, name="c_proj")
        self.dropout = Dropout(dropout, name="dropout") if dropout else None

    def children(self):
        return [self.c_fc, self.c_proj] + ([self.dropout] if self.dropout is not None else [])

    def output_shape(self, input_shape):
        if not input_shape or input_shape[-1] != self.dim:
            raise self._shape_error(f"..., {self.dim}", input_shape)
        return tuple(input_shape)

    def forward(self, x, train: bool = True):
        xp = _xp(x)
        h = self.c_fc.forward(x.reshape(-1, self.dim), train)            # (N, 4C), kept
        g = self.workspace.get("mlp_g", h.shape, h.dtype)
        for r0, r1 in _row_blocks(xp, h.shape[0], h.shape[1] * h.itemsize):
            gelu_rows(h[r0:r1], g[r0:r1], self.workspace.get("gelu_tmp", (r1 - r0, h.shape[1]), h.dtype))
        out = g @ self.c_proj.p["weight"].T
        out += self.c_proj.p["bias"]
        if self.dropout is not None:
            out = self.dropout.forward(out, train)
        self.h = h
        return out.reshape(x.shape)

    def backward(self, dy):
        xp = _xp(dy)
        h, self.h = self.h, None
        dy2 = dy.reshape(-1, self.dim)
        if self.dropout is not None:
            dy2 = self.dropout.backward(dy2.copy())                     # dy stays the caller's
        proj = self.c_proj
        xp.matmul(self.workspace.ones(dy2.shape[0], dy2.dtype), dy2, out=proj.g["bias"])
        dh = dy2 @ proj.p["weight"]                                      # dg, turned into dh below
        g = self.workspace.get("mlp_g", h.shape, h.dtype)
        for r0, r1 in _row_blocks(xp, h.shape[0], h.shape[1] * h.itemsize):
            shape = (r1 - r0, h.shape[1])
            gelu_grad_rows(h[r0:r1], dh[r0:r1], self.workspace.get("gelu_tmp", shape, h.dtype),
                           self.workspace.get("gelu_tmp2", shape, h.dtype), out=g[r0:r1])
        xp.matmul(dy2.T, g, out=proj.g["weight"])
        dx = self.c_fc.backward(dh)
        return None if dx is None else dx.reshape(dy.shape)


class Block(Layer):
    """nanoGPT's ``Block``: children ``ln_1``, ``attn``, ``ln_2``, ``mlp``; (B, T, C) in and out.

    ``n_layer`` sets the residual projections' init std, 0.02 / sqrt(2 n_layer).
    """

    def __init__(self, dim: int, n_head: int, context: int, n_layer: int, dropout: float = 0.0, name: str = "block"):
        self.dim, self.name = dim, name
        proj_std = INIT_STD / math.sqrt(2 * n_layer)
        self.ln_1 = LayerNorm(dim, name="ln_1")
        self.attn = CausalSelfAttention(dim, n_head, context, dropout, proj_std, name="attn")
        self.ln_2 = LayerNorm(dim, name="ln_2")
        self.mlp = MLP(dim, dropout, proj_std, name="mlp")

    def children(self):
        return [self.ln_1, self.attn, self.ln_2, self.mlp]

    def output_shape(self, input_shape):
        return self.attn.output_shape(input_shape)

    def forward(self, x, train: bool = True):
        r = self.attn.forward(self.ln_1.forward(x, train), train)
        r += x
        out = self.mlp.forward(self.ln_2.forward(r, train), train)
        out += r
        return out

    def backward(self, dy):
        dr = self.ln_2.backward(self.mlp.backward(dy))
        dr += dy
        dx = self.ln_1.backward(self.attn.backward(dr))
        dx += dr
        return dx
