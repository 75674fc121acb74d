"""The period rules as linear maps: the largest stable ``eta*h`` of each rule per ``k`` and merge delay.

The model (docs/ALGORITHM.md "Stability of the period rules"): ``N`` ranks (default 2), one
scalar weight each, loss ``h*x^2/2`` (no gradient noise, no weight decay), so a gradient
step is ``eta*g = x*L`` with ``x = eta*h``. Every rule's update equations are written below
as linear maps on the state vector (the global weight ``W``, the mean in flight ``P`` and
the ranks' ``L``, ``U``, ``S``, ...); their product over one period is the period's
transition matrix ``T(x)``. The rule is stable at ``x`` when every eigenvalue of ``T(x)``
has modulus at most ``1 + TOL``; then no initial spread between the ranks grows.

Stability is not monotone in ``x`` (there are stable islands above the first unstable
point), so the threshold is found by a scan, never by bisection: ``x`` runs upward over a
geometric grid from ``X_MIN`` to ``X_MAX`` in steps of ``STEP`` (0.2%), and the threshold is
the last grid point before the first unstable one (``X_MAX`` when none is, 0 when the first
one is already unstable). It is therefore exact to within one step (0.2%) below.

Rules (``rule`` of ``period_map`` and ``threshold``):

    ssgd        momentum SGD on W alone, blocking every step (no k: the reference, 2(1+mu))
    localsgd    blocking local SGD: local momentum steps, every k steps W <- mean L, L <- W
    delta-own   the sum posted at a period's end merged at the next period's end (docs/PERIOD_RULE.md)
    delta-merge the sum posted at a period's end merged d steps later (docs/PERIOD_RULE.md);
                with d = k and no momentum merge the same map as delta-own; ``merge_momentum``
                ``a``: at the merge every rank's ``U <- (1 - a) U + (a/k) P`` (--merge-momentum)
    damp        delta-own restarting from W + a*D instead of W + D (the own displacement
                still in flight damped by a; the posted D stays whole)
    replay      gradient replay with the global-momentum local update (the ablation rule)

``threshold(rule, k, d)`` is the function; ``ssdmpi bench stability`` prints its table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

X_MIN, X_MAX = 1e-3, 4.0      # the scanned range of eta*h
STEP = 0.002                  # relative grid step: x_{i+1} = x_i * (1 + STEP)
TOL = 1e-9                    # |eigenvalue| <= 1 + TOL counts as stable


def grid(x_min: float = X_MIN, x_max: float = X_MAX, step: float = STEP) -> np.ndarray:
    """The scanned values of ``eta*h``: ``x_min * (1 + step)^i`` up to ``x_max`` (inclusive)."""
    n = int(np.floor(np.log(x_max / x_min) / np.log1p(step) + 1e-9)) + 1
    return x_min * (1.0 + step) ** np.arange(n)


class LinearState:
    """The state vector of ``N`` ranks: global slots (one value) and per-rank slots (``N`` values).

    ``assign(x, {target: {source: coefficient}})`` is the matrix of one update that sets every
    target at once from the values before it (a coefficient is a number or an array over
    the grid ``x``); untouched slots keep their values. Matrices are ``(len(x), n, n)``.
    """

    def __init__(self, N: int, shared=("W", "P"), per_rank=("L", "U", "S")):
        self.N = N
        names = list(shared) + [f"{s}{r}" for s in per_rank for r in range(N)]
        self.index = {name: i for i, name in enumerate(names)}
        self.n = len(names)

    def assign(self, x: np.ndarray, updates: dict) -> np.ndarray:
        A = np.broadcast_to(np.eye(self.n), (len(x), self.n, self.n)).copy()
        for target, sources in updates.items():
            row = self.index[target]
            A[:, row, :] = 0.0
            for source, coef in sources.items():
                A[:, row, self.index[source]] += coef
        return A


def _chain(*maps) -> np.ndarray:
    """The map of applying ``maps`` in the order given (the first one first)."""
    out = maps[0]
    for A in maps[1:]:
        out = A @ out
    return out


def _power(A: np.ndarray, n: int) -> np.ndarray:
    out = np.broadcast_to(np.eye(A.shape[-1]), A.shape).copy()
    for _ in range(n):
        out = A @ out
    return out


def _local_steps(s: LinearState, x, mu: float) -> np.ndarray:
    """One local momentum step on every rank: ``U <- mu*U - eta*g`` (``eta*g = x*L``); ``L <- L + U``."""
    N = s.N
    velocity = s.assign(x, {f"U{r}": {f"U{r}": mu, f"L{r}": -x} for r in range(N)})
    position = s.assign(x, {f"L{r}": {f"L{r}": 1.0, f"U{r}": 1.0} for r in range(N)})
    return _chain(velocity, position)


def _post(s: LinearState, x) -> np.ndarray:
    """A period's end: ``D = L - S`` posted (``P <- mean_r D_r``, the sum over ranks divided by N); ``S <- L``."""
    N = s.N
    send = s.assign(x, {"P": {**{f"L{r}": 1.0 / N for r in range(N)}, **{f"S{r}": -1.0 / N for r in range(N)}}})
    return _chain(send, s.assign(x, {f"S{r}": {f"L{r}": 1.0} for r in range(N)}))


def _merge(s: LinearState, x, k: int = 1, a: float = 0.0) -> np.ndarray:
    """The merge of the sum in flight: ``W <- W + P``; ``U <- (1 - a) U + (a/k) P``; ``L <- W + (L - S)``;
    ``S <- W``."""
    N = s.N
    w = s.assign(x, {"W": {"W": 1.0, "P": 1.0}, **{f"U{r}": {f"U{r}": 1.0 - a, "P": a / k} for r in range(N)}})
    lo = s.assign(x, {f"L{r}": {"W": 1.0, f"L{r}": 1.0, f"S{r}": -1.0} for r in range(N)})
    return _chain(w, lo, s.assign(x, {f"S{r}": {"W": 1.0} for r in range(N)}))


def _ssgd(x, k, d, N, mu, damping, a):
    s = LinearState(1, shared=("W", "M"), per_rank=())
    step = _chain(s.assign(x, {"M": {"M": mu, "W": -x}}), s.assign(x, {"W": {"W": 1.0, "M": 1.0}}))
    return _power(step, k)


def _localsgd(x, k, d, N, mu, damping, a):
    s = LinearState(N, shared=("W",), per_rank=("L", "U"))
    average = _chain(s.assign(x, {"W": {f"L{r}": 1.0 / N for r in range(N)}}),
                     s.assign(x, {f"L{r}": {"W": 1.0} for r in range(N)}))
    return _chain(_power(_local_steps(s, x, mu), k), average)


def _delta(x, k, d, N, mu, damping, a):
    """delta-merge at ``(k, d)`` with merge momentum ``a``; delta-own is ``d = k``, ``a = 0``."""
    if d is None or not 1 <= d <= k:
        raise ValueError(f"merge delay d must be in 1..k={k}, got {d!r}")
    s = LinearState(N)
    step = _local_steps(s, x, mu)
    return _chain(_power(step, d), _merge(s, x, k, a), _power(step, k - d), _post(s, x))


def _damp(x, k, d, N, mu, damping, a):
    # delta-own's order at a period end: W <- W + P; D = L - S; L <- W + a*D; post D; S <- L.
    s = LinearState(N, per_rank=("L", "U", "S", "D"))
    w = s.assign(x, {"W": {"W": 1.0, "P": 1.0}})
    disp = s.assign(x, {f"D{r}": {f"L{r}": 1.0, f"S{r}": -1.0} for r in range(N)})
    restart = s.assign(x, {f"L{r}": {"W": 1.0, f"D{r}": damping} for r in range(N)})
    send = s.assign(x, {"P": {f"D{r}": 1.0 / N for r in range(N)}})
    start = s.assign(x, {f"S{r}": {f"L{r}": 1.0} for r in range(N)})
    return _chain(_power(_local_steps(s, x, mu), k), w, disp, restart, send, start)


def _replay(x, k, d, N, mu, damping, a):
    # Local update global-momentum: L <- L + mu*M - eta*g; A accumulates eta*g. At a period end:
    # k global steps M <- mu*M - P/k, W <- W + M with the previous period's mean P; post A; L <- W.
    s = LinearState(N, shared=("W", "M", "P"), per_rank=("L", "A"))
    local = s.assign(x, {**{f"L{r}": {f"L{r}": 1.0 - x, "M": mu} for r in range(N)},
                         **{f"A{r}": {f"A{r}": 1.0, f"L{r}": x} for r in range(N)}})
    glob = _chain(s.assign(x, {"M": {"M": mu, "P": -1.0 / k}}), s.assign(x, {"W": {"W": 1.0, "M": 1.0}}))
    send = _chain(s.assign(x, {"P": {f"A{r}": 1.0 / N for r in range(N)}}),
                  s.assign(x, {**{f"A{r}": {} for r in range(N)}, **{f"L{r}": {"W": 1.0} for r in range(N)}}))
    return _chain(_power(local, k), _power(glob, k), send)


@dataclass(frozen=True)
class LinearRule:
    """A rule of the model: ``build(x, k, d, N, mu, damping, merge_momentum)`` its period's map; ``period``:
    it has a ``k`` (``ssgd``: none, one step); ``merge_delay``: ``"own"`` (a ``d`` of its own, ``1..k``),
    ``"k"`` (merged at the next period's end: ``d = k``) or None; ``damping``: it takes a factor ``a``;
    ``merge_momentum``: it takes a momentum merge ``a``."""

    build: Callable
    period: bool = True
    merge_delay: str | None = None
    damping: bool = False
    merge_momentum: bool = False


RULES = {
    "ssgd": LinearRule(_ssgd, period=False),
    "localsgd": LinearRule(_localsgd),
    "delta-own": LinearRule(lambda x, k, d, N, mu, damping, a: _delta(x, k, k, N, mu, damping, 0.0), merge_delay="k"),
    "delta-merge": LinearRule(_delta, merge_delay="own", merge_momentum=True),
    "damp": LinearRule(_damp, damping=True),
    "replay": LinearRule(_replay),
}


def period_map(rule: str, x: np.ndarray, k: int, d: int | None = None, N: int = 2, mu: float = 0.9,
               damping: float = 0.5, merge_momentum: float = 0.0) -> np.ndarray:
    """The transition matrix ``T(x)`` (``(len(x), n, n)``) of one period of ``rule`` (see the module;
    ``merge_momentum`` only for a rule that takes it)."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}")
    if merge_momentum and not RULES[rule].merge_momentum:
        raise ValueError(f"rule {rule!r} has no momentum merge")
    return RULES[rule].build(np.asarray(x, dtype=np.float64), k, d, N, mu, damping, merge_momentum)


def spectral_radius(T: np.ndarray) -> np.ndarray:
    """The largest eigenvalue modulus of each matrix of ``T`` (``(G, n, n)`` -> ``(G,)``)."""
    return np.abs(np.linalg.eigvals(T)).max(axis=-1)


def threshold(rule: str, k: int, d: int | None = None, N: int = 2, mu: float = 0.9, damping: float = 0.5,
              x: np.ndarray | None = None, merge_momentum: float = 0.0) -> float:
    """The largest stable ``eta*h`` of ``rule`` at ``(k, d)``: the last grid point of ``x`` (default
    ``grid()``) before the first unstable one; ``x[-1]`` when none is, 0 when ``x[0]`` is not."""
    x = grid() if x is None else np.asarray(x, dtype=np.float64)
    stable = spectral_radius(period_map(rule, x, k, d, N, mu, damping, merge_momentum)) <= 1.0 + TOL
    if stable.all():
        return float(x[-1])
    first = int(np.argmin(stable))
    return float(x[first - 1]) if first else 0.0
