"""The compressed transport of ``--comm-dtype`` written again for the reference simulator, from its
definition (docs/ALGORITHM.md, "Compressed transport"), independently of ``ssdmpi/comm/compressed.py``.

Rounding is written from the numbers, not the bit patterns: bfloat16 keeps 8 significant bits of a
float32 (``frexp``, ``rint``, ``ldexp`` in float64, all exact; subnormals on bfloat16's fixed spacing
``2**-133``), float16 is IEEE half (NumPy's ``float16`` after clipping to +-65504), int8 is
``rint(x / scale)`` in blocks of 256 with ``scale = max|x| / 127`` in float32. A sum of ``N`` workers'
values (``Wire.mean``) follows the transport's steps: each worker adds its residual and encodes;
each of the ``N`` shards (``ceil(n / N)`` elements rounded up to whole blocks, zero-padded) is decoded
and added worker by worker in rank order in float32, plus the shard's own residual, and encoded again;
everyone decodes those codes, and the mean divides by ``N``.

API: ``round_bfloat16(x)``, ``round_float16(x)``, ``int8_blocks(x) -> (codes, scales)``,
``dequantize_int8(codes, scales)``, ``sent(dtype, x)`` (what the wire delivers of ``x``, with nothing
owed), ``Wire(dtype, N)`` with ``mean(xs)`` (``sum(xs)`` without the division) and the residuals
``owed[r]`` and ``shard_owed``.
"""

from __future__ import annotations

import math

import numpy as np

BLOCK = 256                      # int8 block length
HALF_MAX = 65504.0               # the largest finite float16
BF16_BITS = 8                    # significant bits of bfloat16 (7 stored, 1 implied)
BF16_MIN_EXP = -125              # frexp's exponent of bfloat16's (float32's) smallest normal number


def round_bfloat16(x) -> np.ndarray:
    """``x`` (float32) rounded to nearest, ties to even, to bfloat16's precision; float32 out."""
    x64 = np.asarray(x, dtype=np.float32).astype(np.float64)
    _, e = np.frexp(x64)
    e = np.maximum(e, BF16_MIN_EXP) - BF16_BITS          # x's bfloat16 spacing is 2**e
    out = np.ldexp(np.rint(np.ldexp(x64, -e)), e)
    with np.errstate(over="ignore"):
        return np.where(np.isfinite(x64), out, x64).astype(np.float32)


def round_float16(x) -> np.ndarray:
    """``x`` (float32) as IEEE half, saturating at +-65504; float32 out."""
    return np.clip(np.asarray(x, dtype=np.float32), -HALF_MAX, HALF_MAX).astype(np.float16).astype(np.float32)


def int8_blocks(x) -> tuple:
    """``(codes, scales)`` of ``x`` (float32, a whole number of ``BLOCK``-element blocks)."""
    rows = np.asarray(x, dtype=np.float32).reshape(-1, BLOCK)
    scales = np.max(np.abs(rows), axis=1) / np.float32(127.0)
    codes = np.zeros(rows.shape, dtype=np.int8)
    nonzero = scales > 0
    codes[nonzero] = np.clip(np.rint(rows[nonzero] / scales[nonzero, None]), -127, 127).astype(np.int8)
    return codes, scales


def dequantize_int8(codes, scales) -> np.ndarray:
    return (codes.astype(np.float32) * scales[:, None]).reshape(-1)


def _block(dtype: str) -> int:
    return BLOCK if dtype == "int8" else 1


def sent(dtype: str, x) -> np.ndarray:
    """What the wire carries of ``x`` (float32, a whole number of the codec's blocks), decoded."""
    if dtype == "int8":
        return dequantize_int8(*int8_blocks(x))
    if dtype == "bfloat16":
        return round_bfloat16(x)
    if dtype == "float16":
        return round_float16(x)
    raise ValueError(f"no compressed transport {dtype!r}")


class Wire:
    """The period posts of ``N`` simulated workers in ``dtype``, with both error feedbacks."""

    def __init__(self, dtype: str, N: int):
        self.dtype, self.N = dtype, int(N)
        self.owed = None          # per worker, n floats: what it meant to send and did not
        self.shard_owed = None    # N x S floats: each shard owner's debt on its re-encoded sum

    def mean(self, xs) -> np.ndarray:
        """The mean of the workers' ``xs`` (float32 arrays of ``n``) as every rank receives it."""
        total = self.sum(xs)
        return total / np.float32(self.N) if self.N > 1 else total

    def sum(self, xs) -> np.ndarray:
        """The sum of the workers' ``xs`` (float32 arrays of ``n``) as every rank receives it."""
        xs = [np.asarray(x, dtype=np.float32).reshape(-1) for x in xs]
        n, N, b = xs[0].size, self.N, _block(self.dtype)
        per_worker = math.ceil(n / N)
        S = max(1, math.ceil(per_worker / b)) * b          # each shard: whole blocks
        if self.owed is None:
            self.owed = [np.zeros(n, np.float32) for _ in range(N)]
            self.shard_owed = np.zeros((N, S), np.float32)
        delivered = []
        for r, x in enumerate(xs):
            meant = np.zeros(N * S, np.float32)
            meant[:n] = x + self.owed[r]
            got = sent(self.dtype, meant)
            self.owed[r] = meant[:n] - got[:n]
            delivered.append(got.reshape(N, S))
        total = np.empty((N, S), np.float32)
        for j in range(N):                       # shard j, added by its owner in rank order
            s = delivered[0][j].copy()
            for r in range(1, N):
                s = s + delivered[r][j]
            meant = s + self.shard_owed[j]
            total[j] = sent(self.dtype, meant)
            self.shard_owed[j] = meant - total[j]
        return total.reshape(-1)[:n]
