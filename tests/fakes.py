"""Stand-ins the tests share: a device array without a GPU, a minimal batch source."""

import numpy as np


class FakeDeviceArray:
    """A 1-D 'device' array over host memory, CuPy-like enough for ssdmpi.comm."""

    def __init__(self, host: np.ndarray):
        self._host = host

    @property
    def __cuda_array_interface__(self):
        return {"shape": self._host.shape, "typestr": self._host.dtype.str,
                "data": (self._host.ctypes.data, False), "strides": None, "version": 3}

    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)
    nbytes = property(lambda self: self._host.nbytes)
    ndim = property(lambda self: self._host.ndim)
    itemsize = property(lambda self: self._host.itemsize)

    def __getitem__(self, index):
        assert isinstance(index, slice)
        return FakeDeviceArray(self._host[index])

    def get(self, out=None):
        """Device -> host copy (CuPy's name)."""
        if out is None:
            return self._host.copy()
        out[...] = self._host
        return out

    def set(self, host):
        """Host -> device copy (CuPy's name)."""
        self._host[...] = host

    def __itruediv__(self, other):
        self._host /= other
        return self


class ArrayBatches:
    """A minimal batch source for the reference simulator and algorithm tests (no ssdmpi.data).

    Epoch ``e`` uses ``perm_e = default_rng([seed, e]).permutation(n)``; global step ``i`` of
    the epoch uses ``perm_e[i*N*B:(i+1)*N*B]`` and rank ``r`` takes its ``r``-th slice of ``B``;
    an epoch has ``n // (N*B)`` steps (the remainder is dropped).
    """

    def __init__(self, x, y, batch_size: int, rank: int, world_size: int, seed: int = 0):
        self.x, self.y, self.B, self.r, self.N, self.seed = x, y, int(batch_size), int(rank), int(world_size), seed
        self.steps_per_epoch = len(x) // (self.B * self.N)
        if self.steps_per_epoch < 1:
            raise ValueError("dataset smaller than one global batch")
        self.step = 0
        self._perm_epoch, self._perm = None, None

    def next_batch(self):
        e, i = divmod(self.step, self.steps_per_epoch)
        if e != self._perm_epoch:
            self._perm_epoch, self._perm = e, np.random.default_rng([self.seed, e]).permutation(len(self.x))
        perm = self._perm
        start = i * self.N * self.B + self.r * self.B
        idx = perm[start:start + self.B]
        self.step += 1
        return self.x[idx], self.y[idx]

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, d) -> None:
        self.step = int(d["step"])
