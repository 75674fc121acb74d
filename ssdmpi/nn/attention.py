"""Causal multi-head self-attention (Vaswani et al. 2017; GPT-2's and nanoGPT's ``CausalSelfAttention``).

On x (B, T, C), with H heads of D = C / H values each:

    [q | k | v] = x Wa^T + ba                 one fused projection ``c_attn``: C -> 3C
    S = (q / sqrt(D)) k^T + M                 per head, (B, H, T, T); M[t, s] = -inf for s > t
    P = softmax(S) over s                     in the parameters' dtype (float32, float64 in checks)
    y = P v                                   (B, H, T, D), heads concatenated back to (B, T, C)
    out = y Wo^T + bo                         ``c_proj``: C -> C

Backward (dP = dy v^T per head):
    dv = P^T dy ;  dS = P * (dP - sum_s dP * P) ;  dq = dS k / sqrt(D) ;  dk = dS^T (q / sqrt(D))

Every product is ONE batched matmul over (B, H) on strided views of the fused q/k/v buffer
(no loop over heads or positions, no transposing copies): q, k and v are (B, H, T, D) views of
the (B, T, 3, H, D) projection, ``y`` is written straight into a (B, T, H, D) buffer, and the
backward's dq, dk, dv straight into the (B, T, 3, H, D) gradient that ``c_attn``'s backward
reads. Optional dropout on P (``attn_dropout``) and on the output (``resid_dropout``), the
seeded :class:`~ssdmpi.nn.layers.Dropout` (their generators are buffers: bitwise resume).
Tensor names follow nanoGPT: ``c_attn.weight``, ``c_attn.bias``, ``c_proj.weight``, ``c_proj.bias``.
"""

from __future__ import annotations

import math

import numpy as np

from ssdmpi.nn.layers import Dropout, Layer, Linear, _xp

INIT_STD = 0.02


class GPTLinear(Linear):
    """A Linear with nanoGPT's initialisation: weight N(0, std^2) (std 0.02, or 0.02/sqrt(2 n_layer)
    for the projections into the residual stream), zero bias. Weight decayed, bias not."""

    def __init__(self, in_features: int, out_features: int, std: float = INIT_STD, name: str = "linear"):
        super().__init__(in_features, out_features, bias=True, name=name)
        self.std = float(std)

    def _init_weight(self, rng):
        return rng.normal(0.0, self.std, size=(self.out_features, self.in_features))

    def _init_bias(self, rng):
        return np.zeros(self.out_features)


class CausalSelfAttention(Layer):
    """(B, T, C) -> (B, T, C); children ``c_attn``, ``c_proj`` (and the dropouts when ``dropout`` > 0).

    ``proj_std``: the output projection's init std (nanoGPT: 0.02 / sqrt(2 n_layer)).
    """

    def __init__(self, dim: int, n_head: int, context: int, dropout: float = 0.0, proj_std: float = INIT_STD,
                 name: str = "attn"):
        if dim % n_head:
            raise ValueError(f"{name}: the width {dim} must be a multiple of the number of heads {n_head}")
        self.dim, self.n_head, self.head_dim, self.context, self.name = dim, n_head, dim // n_head, context, name
        self.c_attn = GPTLinear(dim, 3 * dim, name="c_attn")
        self.c_proj = GPTLinear(dim, dim, std=proj_std, name="c_proj")
        self.attn_dropout = Dropout(dropout, name="attn_dropout") if dropout else None
        self.resid_dropout = Dropout(dropout, name="resid_dropout") if dropout else None
        self._masks = {}

    def children(self):
        return [self.c_attn, self.c_proj] + [d for d in (self.attn_dropout, self.resid_dropout) if d is not None]

    def output_shape(self, input_shape):
        if len(input_shape) != 2 or input_shape[1] != self.dim or not 1 <= input_shape[0] <= self.context:
            raise self._shape_error(f"positions <= {self.context}, {self.dim}", input_shape)
        return tuple(input_shape)

    def _mask(self, t: int, dtype, xp):
        """The additive causal mask (T, T): 0 on and below the diagonal, -inf above."""
        key = (t, np.dtype(dtype).str)
        if key not in self._masks:
            self._masks[key] = xp.asarray(np.triu(np.full((t, t), -np.inf, dtype=dtype), k=1))
        return self._masks[key]

    def _heads(self, qkv, b: int, t: int):
        """q, k, v as (B, H, T, D) views of the (B*T, 3C) projection."""
        h, d = self.n_head, self.head_dim
        five = qkv.reshape(b, t, 3, h, d)
        return tuple(five[:, :, i].transpose(0, 2, 1, 3) for i in range(3))

    def forward(self, x, train: bool = True):
        xp = _xp(x)
        b, t, c = x.shape
        qkv = self.c_attn.forward(x.reshape(b * t, c), train)          # (B*T, 3C), fresh
        q, k, v = self._heads(qkv, b, t)
        q *= 1.0 / math.sqrt(self.head_dim)                              # scale q (B*T*C values), not S
        s = xp.matmul(q, k.transpose(0, 1, 3, 2))                        # (B, H, T, T)
        s += self._mask(t, s.dtype, xp)
        s -= s.max(axis=-1, keepdims=True)
        p = xp.exp(s, out=s)
        p /= p.sum(axis=-1, keepdims=True)
        self.qkv, self.p_att, self.shape = qkv, p, (b, t, c)
        pd = self.attn_dropout.forward(p, train) if self.attn_dropout is not None else p
        y = xp.empty((b, t, self.n_head, self.head_dim), dtype=x.dtype)
        xp.matmul(pd, v, out=y.transpose(0, 2, 1, 3))
        self.pd = pd
        out = self.c_proj.forward(y.reshape(b * t, c), train)
        if self.resid_dropout is not None:
            out = self.resid_dropout.forward(out, train)
        return out.reshape(b, t, c)

    def backward(self, dy):
        xp = _xp(dy)
        b, t, c = self.shape
        dy2 = dy.reshape(b * t, c)
        if self.resid_dropout is not None:
            dy2 = self.resid_dropout.backward(dy2.copy())                # dy stays the caller's
        dyh = self.c_proj.backward(dy2).reshape(b, t, self.n_head, self.head_dim).transpose(0, 2, 1, 3)
        q, k, v = self._heads(self.qkv, b, t)
        p, pd = self.p_att, self.pd
        self.qkv = self.p_att = self.pd = None
        dqkv = xp.empty((b * t, 3 * c), dtype=dy.dtype)
        dq, dk, dv = self._heads(dqkv, b, t)
        xp.matmul(pd.transpose(0, 1, 3, 2), dyh, out=dv)
        dp = self.workspace.get("attn_dp", p.shape, p.dtype)
        xp.matmul(dyh, v.transpose(0, 1, 3, 2), out=dp)
        if self.attn_dropout is not None:
            dp = self.attn_dropout.backward(dp)
        # dS = P * dP - P * rowsum(P * dP), in dp's memory (P is dead after this)
        dp *= p
        p *= dp.sum(axis=-1, keepdims=True)
        dp -= p
        xp.matmul(dp, k, out=dq)
        dq *= 1.0 / math.sqrt(self.head_dim)
        xp.matmul(dp.transpose(0, 1, 3, 2), q, out=dk)                   # q was scaled in forward
        dx = self.c_attn.backward(dqkv)
        return None if dx is None else dx.reshape(b, t, c)
