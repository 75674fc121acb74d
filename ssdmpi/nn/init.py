"""Weight initialisers. They draw on the host with a seeded NumPy generator, so CPU
and GPU runs, and every rank, start from the same numbers."""

from __future__ import annotations

import numpy as np


def kaiming_normal(rng: np.random.Generator, shape, fan_in: int) -> np.ndarray:
    """He et al. 2015, for ReLU networks: N(0, 2/fan_in)."""
    return rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)


def kaiming_uniform(rng: np.random.Generator, shape, fan_in: int) -> np.ndarray:
    """PyTorch's default for Linear/Conv weights: U(-b, b), b = sqrt(1/fan_in) (a = sqrt(5))."""
    bound = np.sqrt(1.0 / fan_in)
    return rng.uniform(-bound, bound, size=shape)


def xavier_uniform(rng: np.random.Generator, shape, fan_in: int, fan_out: int) -> np.ndarray:
    """Glorot & Bengio 2010: U(-b, b), b = sqrt(6/(fan_in+fan_out))."""
    bound = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=shape)


def bias_uniform(rng: np.random.Generator, shape, fan_in: int) -> np.ndarray:
    """PyTorch's default bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape)


def zeros(rng, shape, *_) -> np.ndarray:
    return np.zeros(shape)


def ones(rng, shape, *_) -> np.ndarray:
    return np.ones(shape)
