"""Normalisation layers: :class:`BatchNorm` and :class:`LayerNorm` (its equations in its docstring).

Batch normalisation (Ioffe & Szegedy 2015), for (N, C) and channel-major (C, H, W, N) inputs.

Training: per channel c, over the m = N*H*W values of the batch,
    mean_c, var_c (biased) ;  xhat = (x - mean_c) / sqrt(var_c + eps) ;  y = gamma_c * xhat + beta_c
    running_mean <- (1 - momentum) * running_mean + momentum * mean_c
    running_var  <- (1 - momentum) * running_var  + momentum * var_c * m / (m - 1)   (unbiased, like PyTorch)
Evaluation: y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta.
Backward (training):
    dbeta = sum dy ;  dgamma = sum dy * xhat
    dx = gamma / sqrt(var + eps) * (dy - dbeta / m - xhat * dgamma / m)

``weight`` (gamma) is decayed, ``bias`` (beta) is not. ``running_mean`` and
``running_var`` are state, not parameters: ``buffers()`` exports them for
checkpoints. Defaults match ``torch.nn.BatchNorm2d``: momentum 0.1, eps 1e-5.
"""

from __future__ import annotations

import numpy as np

from ssdmpi.nn.layers import Layer, _xp


class BatchNorm(Layer):
    """Batch normalisation per channel: axis 1 of (N, C) inputs, axis 0 of channel-major (C, H, W, N) ones."""

    channel_major = True

    def __init__(self, num_features: int, momentum: float = 0.1, eps: float = 1e-5, name: str = "bn"):
        self.c, self.momentum, self.eps, self.name = int(num_features), float(momentum), float(eps), name
        self.running_mean = self.running_var = None
        self.spatial = True      # set by output_shape: (C, H, W) inputs, or (C,)

    def declare(self):
        return [("weight", (self.c,), True, lambda rng: np.ones(self.c)),
                ("bias", (self.c,), False, lambda rng: np.zeros(self.c))]

    def bind(self, params: dict, grads: dict) -> None:
        super().bind(params, grads)
        xp = _xp(params["weight"])
        self.running_mean = xp.zeros(self.c, dtype=params["weight"].dtype)
        self.running_var = xp.ones(self.c, dtype=params["weight"].dtype)

    def output_shape(self, input_shape):
        if len(input_shape) not in (1, 3) or input_shape[0] != self.c:
            raise self._shape_error(f"{self.c}[, height, width]", input_shape)
        self.spatial = len(input_shape) == 3
        return tuple(input_shape)

    def reset_state(self, seed: int) -> None:
        self.running_mean[...] = 0
        self.running_var[...] = 1

    def buffers(self) -> dict:
        return {"running_mean": self.running_mean, "running_var": self.running_var}

    def load_buffers(self, state: dict) -> None:
        xp = _xp(self.running_mean)
        for key in ("running_mean", "running_var"):
            if key in state:
                value = xp.asarray(state[key], dtype=self.running_mean.dtype)
                if value.shape != (self.c,):
                    raise ValueError(f"{self.name}.{key}: expected shape ({self.c},), got {tuple(value.shape)}")
                getattr(self, key)[...] = value

    def _rows(self, x):
        """``x`` as a (C, m) matrix: a view of channel-major (C, H, W, N) or of (N, C) (transposed)."""
        return x.T if x.ndim == 2 else x.reshape(self.c, -1)

    def _unrows(self, a, shape):
        return a.T if len(shape) == 2 else a.reshape(shape)

    def _channel_sum(self, a2):
        """Per-channel sum of a (C, m) matrix: a GEMV against ones (BLAS, faster than a reduction)."""
        return a2 @ self.workspace.ones(a2.shape[1], a2.dtype)

    @staticmethod
    def _channel_dot(a2, b2):
        """Per-channel dot product of two (C, m) matrices, without an (C, m) temporary: C batched
        1 x m x 1 matrix products (BLAS dots)."""
        return _xp(a2).matmul(a2[:, None, :], b2[:, :, None]).reshape(-1)

    def forward(self, x, train: bool = True):
        xp = _xp(x)
        x2 = self._rows(x)
        beta = self.p["bias"][:, None]
        if not train:
            scale = self.p["weight"] / xp.sqrt(self.running_var + self.eps)
            self.mode, self.scale, self.x2 = "eval", scale, x2
            y = x2 - self.running_mean[:, None]
            y *= scale[:, None]
            y += beta
            return self._unrows(y, x.shape)
        m = x2.shape[1]
        mean = self._channel_sum(x2) / m
        xc = x2 - mean[:, None]                        # centred input, kept for backward
        var = self._channel_dot(xc, xc) / m
        invstd = 1.0 / xp.sqrt(var + self.eps)
        y = xc * (self.p["weight"] * invstd)[:, None]  # gamma * xhat
        y += beta
        self.mode, self.xc, self.invstd = "train", xc, invstd
        mom = self.momentum
        self.running_mean *= 1 - mom
        self.running_mean += mom * mean
        self.running_var *= 1 - mom
        self.running_var += (mom * m / max(m - 1, 1)) * var
        return self._unrows(y, x.shape)

    def backward(self, dy):
        xp = _xp(dy)
        dy2 = self._rows(dy)
        if self.mode == "eval":
            xhat = (self.x2 - self.running_mean[:, None]) / xp.sqrt(self.running_var + self.eps)[:, None]
            self.g["bias"][...] = self._channel_sum(dy2)
            self.g["weight"][...] = self._channel_dot(dy2, xhat)
            self.x2 = None
            return self._unrows(dy2 * self.scale[:, None], dy.shape) if self.input_grad else None
        xc, self.xc = self.xc, None
        invstd = self.invstd
        m = dy2.shape[1]
        dbeta = self._channel_sum(dy2)
        dgamma = self._channel_dot(dy2, xc) * invstd   # sum dy * xhat, with xhat = xc * invstd
        self.g["bias"][...] = dbeta
        self.g["weight"][...] = dgamma
        if not self.input_grad:
            return None
        # dx = a*dy + b*xhat + c per channel, assembled in xc's memory (xc is dead after this).
        a = self.p["weight"] * invstd
        b = -a * dgamma / m
        c = -a * dbeta / m
        xc *= (b * invstd)[:, None]
        xc += c[:, None]
        xc += dy2 * a[:, None]
        return self._unrows(xc, dy.shape)


class LayerNorm(Layer):
    """Layer normalisation (Ba et al. 2016) over the last axis, as ``torch.nn.LayerNorm(dim)``.

    Per row (a token's vector of ``dim`` values; any leading axes):
        xhat = (x - mean) / sqrt(var + eps)  (biased variance) ;  y = gamma * xhat + beta
    Backward, with g = dy * gamma:
        dgamma = sum_rows dy * xhat ;  dbeta = sum_rows dy
        dx = (g - mean(g) - xhat * mean(g * xhat)) / sqrt(var + eps)
    Neither ``weight`` (gamma, init 1) nor ``bias`` (beta, init 0) is weight-decayed. Keeps
    ``xhat`` and ``1/sqrt(var + eps)`` for backward; ``dy`` is read-only.
    """

    def __init__(self, dim: int, eps: float = 1e-5, name: str = "ln"):
        self.dim, self.eps, self.name = int(dim), float(eps), name

    def declare(self):
        return [("weight", (self.dim,), False, lambda rng: np.ones(self.dim)),
                ("bias", (self.dim,), False, lambda rng: np.zeros(self.dim))]

    def output_shape(self, input_shape):
        if not input_shape or input_shape[-1] != self.dim:
            raise self._shape_error(f"..., {self.dim}", input_shape)
        return tuple(input_shape)

    def forward(self, x, train: bool = True):
        xp = _xp(x)
        x2 = x.reshape(-1, self.dim)
        inv_dim = 1.0 / self.dim
        mean = x2 @ self.workspace.ones(self.dim, x.dtype)      # row sums as a GEMV
        mean *= inv_dim
        xhat = x2 - mean[:, None]
        var = xp.einsum("ij,ij->i", xhat, xhat)
        var *= inv_dim
        var += self.eps
        rstd = xp.sqrt(var, out=var)
        xp.divide(1.0, rstd, out=rstd)
        xhat *= rstd[:, None]
        self.xhat, self.rstd = xhat, rstd
        y = xhat * self.p["weight"]
        y += self.p["bias"]
        return y.reshape(x.shape)

    def backward(self, dy):
        xp = _xp(dy)
        dy2 = dy.reshape(-1, self.dim)
        xhat, rstd = self.xhat, self.rstd
        self.xhat = self.rstd = None
        ones_rows = self.workspace.ones(dy2.shape[0], dy2.dtype)
        g = dy2 * xhat
        xp.matmul(ones_rows, g, out=self.g["weight"])          # column sums as GEMVs
        xp.matmul(ones_rows, dy2, out=self.g["bias"])
        if not self.input_grad:
            return None
        xp.multiply(dy2, self.p["weight"], out=g)
        inv_dim = 1.0 / self.dim
        mean_g = g @ self.workspace.ones(self.dim, g.dtype)
        mean_g *= inv_dim
        mean_gx = xp.einsum("ij,ij->i", g, xhat)
        mean_gx *= inv_dim
        # dx assembled in g's memory; xhat (dead after this) holds xhat * mean(g * xhat)
        xhat *= mean_gx[:, None]
        g -= mean_g[:, None]
        g -= xhat
        g *= rstd[:, None]
        return g.reshape(dy.shape)
