"""Reusable scratch buffers, shared by the layers of one model.

Why: NumPy hands large arrays (padded images and im2col chunks are MBs) back to the OS
when they are freed, so allocating them every step costs a page fault per 4 KiB
on first touch. A ``Workspace`` keeps one buffer per ``(key, shape, dtype)`` for
the life of the model. A buffer is only valid until the next ``get`` with the
same key: layers use it for transient work inside ONE forward or backward call
and never keep a reference across calls.
"""

from __future__ import annotations

import numpy as np


class Workspace:
    """Named scratch buffers on one array module (``xp``)."""

    def __init__(self, xp=np):
        self.xp = xp
        self._buffers = {}

    def get(self, key, shape, dtype, zero: bool = False):
        """A buffer of ``shape``/``dtype`` for ``key`` (contents undefined unless ``zero``).

        ``zero=True`` zero-fills it only when it is first made: callers that write
        just the interior of a padded buffer rely on its borders staying zero.
        """
        shape = tuple(int(s) for s in shape)
        full_key = (key, shape, np.dtype(dtype).str)
        buf = self._buffers.get(full_key)
        if buf is None:
            buf = (self.xp.zeros if zero else self.xp.empty)(shape, dtype=dtype)
            self._buffers[full_key] = buf
        return buf

    def ones(self, n: int, dtype):
        """A vector of ``n`` ones (for channel sums done as GEMV, which BLAS does fast)."""
        key = ("ones", (int(n),), np.dtype(dtype).str)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self.xp.ones(int(n), dtype=dtype)
            self._buffers[key] = buf
        return buf

    def nbytes(self) -> int:
        return sum(int(b.nbytes) for b in self._buffers.values())

    def clear(self) -> None:
        self._buffers.clear()
