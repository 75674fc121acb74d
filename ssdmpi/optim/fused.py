"""Fused optimizer updates: each update is ONE pass over the flat buffers instead of one per operation.

The unfused form of an update (``tmp = W*decay; tmp += G; tmp *= lr; M *= mu; ...``) streams
every model-sized buffer through memory once per operation. Here each update is written twice,
with the same per-element sequence of floating-point operations (same order, same operands,
same intermediate dtype, every product and sum rounded on its own), so the results are the
same bits as the unfused form:

- CPU (NumPy): the buffers are walked in blocks of ``BLOCK_BYTES``; all the update's ufuncs are
  applied to one block, into small preallocated scratch buffers (positional ``out``), before
  the next block, so a block is loaded from memory once and stays in L1/L2. NumPy never fuses
  or contracts, so the same ufunc calls on slices give the same bits as on whole buffers.
- GPU (CuPy): one ``ElementwiseKernel`` per update, built on first use through
  ``backend.elementwise`` (which compiles with ``--fmad=false``: no FMA contraction). Its
  scalars are cast to the buffers' dtype on the host, as NumPy casts a Python scalar operand.

A ``Plan`` holds what an update needs besides the buffers: the constant per-element operands
(decay ``lam*mask`` or the 0/1 ``mask``), the block partition and the scratch. A block on which
a constant is uniform (bitwise) reads a 1-element slice of it, broadcast, instead of the block:
every element is still multiplied by the same value, and the constant costs no memory traffic.

Buffers must be 1-D, C-contiguous, of the plan's size and dtype (checked at each call).
The unfused forms, kept as the test oracle and the benchmark baseline, are in
``ssdmpi/verify/fused_bench.py`` (``python -m ssdmpi.verify.fused_bench`` times both).
"""

from __future__ import annotations

import numpy as np

from ssdmpi import backend

# Per buffer and block (64 K float32 elements). Measured (fused_bench --sweep, 20 M float32, one thread):
# 256-512 KiB fastest; below ~128 KiB the ~1 us per ufunc call dominates. A block's working set
# (3-5 such blocks) then sits in L2/L3 instead of streaming from memory once per operation.
BLOCK_BYTES = 256 * 1024

# A plan's ``poll`` (the Communicator's ``progress``, set by the algorithm under ``--progress test``)
# is called every this many blocks (4 MiB of each buffer): an update pass over a large model takes
# tens of ms, and an allreduce in flight moves only inside MPI calls.
POLL_BLOCKS = 16

# name -> (in_params, out_params, body) of the GPU kernels, each line the same op sequence as the
# NumPy loop of the same name below. In-place buffers are out params (read, then written).
KERNELS = {
    "ssdmpi_momentum_sgd": (
        "T decay, T lr, T mu, T n", "T W, T M, T G",
        "T g = G / n; G = g; T t = W * decay; t = t + g; t = t * lr; T m = M * mu; m = m - t; M = m; W = W + m;"),
    "ssdmpi_momentum_sgd_read_only": (
        "T g, T M, T decay, T lr, T mu", "T L",
        "T a = L * decay; a = a + g; a = a * lr; T b = M * mu; T l = L + b; L = l - a;"),
    "ssdmpi_plain_local_sgd": (
        "T g, T decay, T lr, T n", "T L",
        "T a = L * decay; T b = g / n; a = a + b; a = a * lr; L = L - a;"),
    "ssdmpi_glu_paper": (
        "T g, T mask, T decay, T lrlam, T c, T n, T neg, int32 snap", "T L, T P",
        "T a = mask * lrlam; a = (T)1 - a; T b = a * P; b = b - L; b = b / c; b = b * (T)0.5; "
        "a = g / n; a = a * (T)2; T e = L * decay; a = a + e; a = a + b; a = a * neg; "
        "if (snap) P = L; L = L + a;"),
    "ssdmpi_momentum_sgd_expanded": (
        "T g, T mask, T c, T mu, T eta", "T U, T L",
        "T t = L * mask; t = t * c; T u = U * mu; u = u - t; t = g * eta; u = u - t; U = u; L = L + u;"),
    "ssdmpi_add_divided": (
        "T n", "T W, T R",
        "T r = R / n; R = r; W = W + r;"),
    "ssdmpi_divide_copy": (
        "T n", "T L, T W",
        "T l = L / n; L = l; W = l;"),
    "ssdmpi_post_displacement": (
        "T W, int32 changed", "T L, T S, T D",
        "T d = L - S; D = d; if (changed) L = W + d; S = L;"),
    "ssdmpi_rebase": (
        "T W", "T L, T S",
        "T d = L - S; L = W + d; S = W;"),
}
_built: dict = {}


def _uniform(part):
    """True when every element of ``part`` has the bits of its first one."""
    bits = part.view(np.dtype(f"u{part.dtype.itemsize}"))
    return bool((bits == bits[0]).all())


class Plan:
    """Blocks, scratch and constant operands of one update on flat buffers of ``consts[0]``'s size.

    Args:
        consts: the update's constant per-element arrays (kept, not copied: do not modify them).
        scratch: how many block-sized scratch buffers the CPU loop needs.
        block_bytes: CPU block size in bytes. device: GPU path (default: where ``consts[0]`` lives).
    ``blocks`` (CPU only) lists ``(slice, const operands, scratch views)`` per block; the
    loops iterate ``walk()``, which calls ``poll()`` (when set: a cheap callable, e.g.
    ``Communicator.progress``) every ``POLL_BLOCKS`` blocks.
    """

    poll = None

    def __init__(self, consts, scratch: int, block_bytes: int = BLOCK_BYTES, device: bool | None = None):
        first = consts[0]
        self.n, self.dtype, self.consts = int(first.size), first.dtype, tuple(consts)
        self.check(*consts)
        self.device = backend.is_device_array(first) if device is None else bool(device)
        self.blocks = []
        if self.device:
            return
        self.block = max(1, int(block_bytes) // self.dtype.itemsize)
        bufs = [np.empty(self.block, self.dtype) for _ in range(scratch)]
        for s in range(0, self.n, self.block):
            e = min(s + self.block, self.n)
            ops = tuple(c[s:s + 1] if _uniform(c[s:e]) else c[s:e] for c in consts)
            self.blocks.append((slice(s, e), ops, tuple(b[:e - s] for b in bufs)))

    def walk(self):
        """The blocks, in order, with ``poll()`` called between every ``POLL_BLOCKS`` of them."""
        if self.poll is None or len(self.blocks) <= POLL_BLOCKS:
            return self.blocks
        return self._polled(self.poll)

    def _polled(self, poll):
        for i, block in enumerate(self.blocks):
            if i and i % POLL_BLOCKS == 0:
                poll()
            yield block

    def check(self, *bufs) -> None:
        """``ValueError`` unless every buffer is 1-D, C-contiguous, of the plan's size and dtype."""
        for b in bufs:
            if b.ndim != 1 or b.size != self.n or b.dtype != self.dtype or not b.flags.c_contiguous:
                raise ValueError(f"fused update needs 1-D contiguous {self.dtype} buffers of {self.n} elements, "
                                 f"got {b.dtype} {b.shape} (contiguous: {b.flags.c_contiguous})")

    def kernel(self, name: str, definition: tuple | None = None):
        """The GPU kernel ``name`` of ``KERNELS`` (or ``definition``, its ``(in_params, out_params,
        body)``, for a kernel defined in another module), built on first use."""
        if name not in _built:
            k = backend.elementwise(name, *(definition or KERNELS[name]))
            if k is None:
                raise RuntimeError(f"fused update {name}: buffers are on a GPU but CuPy is not usable")
            _built[name] = k
        return _built[name]

    def scalars(self, *values):
        """Python scalars as the buffers' dtype (what NumPy does to a Python scalar operand)."""
        return tuple(self.dtype.type(v) for v in values)


def momentum_sgd(plan: Plan, W, M, G, lr: float, mu: float, n=None) -> None:
    """``t = (W*decay + G)*lr; M = M*mu - t; W = W + M`` (``decay = plan.consts[0]``).

    ``n`` (a rank count; None or 1: none): first ``G = G/n`` in place, block by block as ``G``
    is read -- the division of a mean allreduce folded into its consumer, the same bits as dividing
    the whole buffer first (one IEEE division per element either way), without that pass."""
    plan.check(W, M, G)
    if plan.device:
        plan.kernel("ssdmpi_momentum_sgd")(plan.consts[0], *plan.scalars(lr, mu, n or 1), W, M, G)
        return
    mul, add, sub, div = np.multiply, np.add, np.subtract, np.divide
    fold = n is not None and n != 1
    for sl, (d,), (t, *_) in plan.walk():
        w, m, g = W[sl], M[sl], G[sl]
        if fold:
            div(g, n, g)
        mul(w, d, t)
        add(t, g, t)
        mul(t, lr, t)
        mul(m, mu, m)
        sub(m, t, m)
        add(w, m, w)


def momentum_sgd_read_only(plan: Plan, L, g, M, lr: float, mu: float) -> None:
    """Momentum SGD's step with the velocity ``M`` read, not advanced (the global-momentum local update):
    ``a = (L*decay + g)*lr; L = (L + M*mu) - a`` (``decay = plan.consts[0]``)."""
    plan.check(L, g, M)
    if plan.device:
        plan.kernel("ssdmpi_momentum_sgd_read_only")(g, M, plan.consts[0], *plan.scalars(lr, mu), L)
        return
    mul, add, sub = np.multiply, np.add, np.subtract
    for sl, (d,), (a, b, *_) in plan.walk():
        x = L[sl]
        mul(x, d, a)
        add(a, g[sl], a)
        mul(a, lr, a)
        mul(M[sl], mu, b)
        add(x, b, x)
        sub(x, a, x)


def plain_local_sgd(plan: Plan, L, g, lr: float, n: int) -> None:
    """``a = (L*decay + g/n)*lr; L = L - a`` (``decay = plan.consts[0]``)."""
    plan.check(L, g)
    if plan.device:
        plan.kernel("ssdmpi_plain_local_sgd")(g, plan.consts[0], *plan.scalars(lr, n), L)
        return
    mul, add, sub, div = np.multiply, np.add, np.subtract, np.divide
    for sl, (d,), (a, b, *_) in plan.walk():
        x = L[sl]
        mul(x, d, a)
        div(g[sl], n, b)
        add(a, b, a)
        mul(a, lr, a)
        sub(x, a, x)


def glu_paper(plan: Plan, L, g, P, lrlam: float, c: float, n: int, neg: float, snap: bool) -> None:
    """GLU (``GLUPaper``), ``plan.consts = (mask, decay)``, ``lrlam = lr*lam``, ``neg = -(lr*f)``::

        b = ((((1 - mask*lrlam)*P) - L)/c)*0.5;  a = (((g/n)*2 + L*decay) + b)*neg;  [P = L];  L = L + a
    """
    plan.check(L, g, P)
    if plan.device:
        mask, decay = plan.consts
        plan.kernel("ssdmpi_glu_paper")(g, mask, decay, *plan.scalars(lrlam, c, n, neg), np.int32(snap), L, P)
        return
    mul, add, sub, div = np.multiply, np.add, np.subtract, np.divide
    for sl, (mk, d), (a, b, e) in plan.walk():
        x, p = L[sl], P[sl]
        f = a[:mk.size]                  # 1 element on a block of uniform mask: the same value for all
        mul(mk, lrlam, f)
        sub(1, f, f)
        mul(f, p, b)
        sub(b, x, b)
        div(b, c, b)
        mul(b, 0.5, b)
        div(g[sl], n, a)
        mul(a, 2, a)
        mul(x, d, e)
        add(a, e, a)
        add(a, b, a)
        mul(a, neg, a)
        if snap:
            p[...] = x
        add(x, a, x)


def momentum_sgd_expanded(plan: Plan, U, L, g, c: float, mu: float, eta: float) -> None:
    """Momentum SGD in the expanded operation order of the per-rank steps (docs/PERIOD_RULE.md 3):
    ``U = ((U*mu) - (L*mask)*c) - g*eta; L = L + U`` (``mask = plan.consts[0]``, ``c = eta*lam``)."""
    plan.check(U, L, g)
    if plan.device:
        plan.kernel("ssdmpi_momentum_sgd_expanded")(g, plan.consts[0], *plan.scalars(c, mu, eta), U, L)
        return
    mul, add, sub = np.multiply, np.add, np.subtract
    for sl, (mk,), (t, *_) in plan.walk():
        u, x = U[sl], L[sl]
        mul(x, mk, t)
        mul(t, c, t)
        mul(u, mu, u)
        sub(u, t, u)
        mul(g[sl], eta, t)
        sub(u, t, u)
        add(x, u, x)


def add_divided(plan: Plan, W, R, n: int) -> None:
    """``R = R/n; W = W + R`` in one pass (a summed allreduce's mean added to ``W``)."""
    plan.check(W, R)
    if plan.device:
        plan.kernel("ssdmpi_add_divided")(*plan.scalars(n), W, R)
        return
    for sl, _, _ in plan.walk():
        r = R[sl]
        np.divide(r, n, r)
        np.add(W[sl], r, W[sl])


def divide_copy(plan: Plan, L, W, n: int) -> None:
    """``L = L/n; W = L`` in one pass (a summed allreduce of ``L`` made the mean, and copied)."""
    plan.check(L, W)
    if plan.device:
        plan.kernel("ssdmpi_divide_copy")(*plan.scalars(n), L, W)
        return
    for sl, _, _ in plan.walk():
        x = L[sl]
        np.divide(x, n, x)
        W[sl] = x


def post_displacement(plan: Plan, W, L, S, D, changed: bool) -> None:
    """A displacement taken to be posted: ``D = L - S; if changed: L = W + D; S = L``."""
    plan.check(W, L, S, D)
    if plan.device:
        plan.kernel("ssdmpi_post_displacement")(W, np.int32(changed), L, S, D)
        return
    for sl, _, _ in plan.walk():
        x, d = L[sl], D[sl]
        np.subtract(x, S[sl], d)
        if changed:
            np.add(W[sl], d, x)
        S[sl] = x


def rebase(plan: Plan, W, L, S) -> None:
    """This rank's progress since ``S`` moved onto ``W``: ``L = W + (L - S); S = W``."""
    plan.check(W, L, S)
    if plan.device:
        plan.kernel("ssdmpi_rebase")(W, L, S)
        return
    for sl, _, _ in plan.walk():
        x, w = L[sl], W[sl]
        np.subtract(x, S[sl], x)
        np.add(w, x, x)
        S[sl] = w
