"""Token and learned positional embeddings, and the output head tied to the token embedding.

Token models (``gpt``) take integer token ids ``(B, T)`` and carry activations ``(B, T, C)``
(C the model width) between their top-level layers.

    TokenEmbedding      y[b, t] = W[ids[b, t]]                 W: (vocab, C), ``wte``
    PositionalEmbedding y[b, t] = x[b, t] + P[t]               P: (context, C), ``wpe``
    TiedHead            logits[b, t] = y[b, t] @ W^T           W: the TokenEmbedding's own tensor

Backward:
    dP[t] = sum_b dy[b, t]   (rows t >= T: 0)
    dW    = dlogits^T y  (written by the head)  +  scatter-add of dy at ids  (added by the embedding)

The head has no tensor of its own: it reads and writes the token embedding's views, so the
tied weight is ONE parameter in ONE place of the flat buffer (its first elements, as the
embedding is a model's first layer). Its backward runs before the embedding's (it is later in
the model), OVERWRITES ``dW`` with its part, and the embedding's backward ADDS its part: the
gradient is final only after the embedding's backward, and ``Model.grads_ready`` only then
reports offset 0. Embeddings are not weight-decayed. Initialisation: N(0, 0.02^2) (nanoGPT's).
"""

from __future__ import annotations

import numpy as np

from ssdmpi.nn.layers import Layer, _xp

EMBEDDING_STD = 0.02


class TokenEmbedding(Layer):
    """Token ids (B, T) (any integer dtype) -> vectors (B, T, dim): rows of ``weight`` (vocab, dim).

    The model's first layer: it has no input gradient. When a :class:`TiedHead` shares its
    weight, ``tied`` is True and backward adds to the gradient the head wrote; otherwise it
    writes it (zeros for ids absent from the batch).
    """

    def __init__(self, vocab_size: int, dim: int, name: str = "wte"):
        self.vocab, self.dim, self.name = int(vocab_size), int(dim), name
        self.tied = False

    def declare(self):
        return [("weight", (self.vocab, self.dim), False,
                 lambda rng: rng.normal(0.0, EMBEDDING_STD, size=(self.vocab, self.dim)))]

    def output_shape(self, input_shape):
        if len(input_shape) != 1:
            raise ValueError(f"{self.name}: expected token ids of shape (batch, positions), "
                             f"received (batch, {', '.join(map(str, input_shape))})")
        return (int(input_shape[0]), self.dim)

    def forward(self, x, train: bool = True):
        _check_ids(x, self.vocab, self.name)
        self.ids = x
        return _xp(self.p["weight"]).take(self.p["weight"], x, axis=0)

    def backward(self, dy):
        xp = _xp(dy)
        g = self.g["weight"]
        if not self.tied:
            g.fill(0)
        ids, dy2 = self.ids.reshape(-1), dy.reshape(-1, self.dim)
        self.ids = None
        if xp is np:
            # a sort and one segmented sum: ~3x faster than np.add.at's element-by-element scatter
            order = np.argsort(ids, kind="stable")
            ordered = ids[order]
            starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
            g[ordered[starts]] += np.add.reduceat(dy2[order], starts, axis=0)
        else:
            xp.add.at(g, ids, dy2)
        return None


class PositionalEmbedding(Layer):
    """(B, T, dim) -> the same plus ``weight[:T]`` (a learned vector per position, ``context`` rows).

    Adds IN PLACE to its input (the token embedding's fresh output), so it must not be a
    model's first layer; backward passes ``dy`` through unchanged.
    """

    def __init__(self, context: int, dim: int, name: str = "wpe"):
        self.context, self.dim, self.name = int(context), int(dim), name

    def declare(self):
        return [("weight", (self.context, self.dim), False,
                 lambda rng: rng.normal(0.0, EMBEDDING_STD, size=(self.context, self.dim)))]

    def output_shape(self, input_shape):
        if len(input_shape) != 2 or input_shape[1] != self.dim or not 1 <= input_shape[0] <= self.context:
            raise self._shape_error(f"positions <= {self.context}, {self.dim}", input_shape)
        return tuple(input_shape)

    def forward(self, x, train: bool = True):
        x += self.p["weight"][:x.shape[1]]
        return x

    def backward(self, dy):
        t = dy.shape[1]
        g = self.g["weight"]
        # sum over the batch as a GEMV: ones(B) @ dy viewed as (B, T*dim)
        ones = self.workspace.ones(dy.shape[0], dy.dtype)
        _xp(dy).matmul(ones, dy.reshape(dy.shape[0], -1), out=g[:t].reshape(-1))
        g[t:] = 0
        return dy


class TiedHead(Layer):
    """(B, T, dim) -> logits (B, T, vocab) = y @ W^T, with W the ``embedding``'s weight (no tensor
    of its own; see the module docstring for the gradient's two parts)."""

    def __init__(self, embedding: TokenEmbedding, name: str = "lm_head"):
        self.embedding, self.name = embedding, name
        embedding.tied = True

    def output_shape(self, input_shape):
        if len(input_shape) != 2 or input_shape[1] != self.embedding.dim:
            raise self._shape_error(f"positions, {self.embedding.dim}", input_shape)
        return (int(input_shape[0]), self.embedding.vocab)

    def forward(self, x, train: bool = True):
        w = self.embedding.p["weight"]
        self.x = x.reshape(-1, x.shape[-1])
        return (self.x @ w.T).reshape(x.shape[:-1] + (w.shape[0],))

    def backward(self, dy):
        xp = _xp(dy)
        w = self.embedding.p["weight"]
        dy2 = dy.reshape(-1, w.shape[0])
        xp.matmul(dy2.T, self.x, out=self.embedding.g["weight"])
        dx = (dy2 @ w).reshape(dy.shape[:-1] + (w.shape[1],)) if self.input_grad else None
        self.x = None
        return dx


def _check_ids(ids, vocab: int, where: str) -> None:
    """``ValueError`` when host token ids fall outside ``[0, vocab)`` (device ids are not read back)."""
    if isinstance(ids, np.ndarray) and ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"{where}: token ids must lie in [0, {vocab}), received ids from {lo} to {hi}")
