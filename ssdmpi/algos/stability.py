"""The period rules as linear maps: the largest stable ``eta*h`` of each rule per ``k`` and its settings.

The model (docs/ALGORITHM.md "Stability of the period rules"): ``N`` ranks (default 2), one
scalar weight each, loss ``h*x^2/2`` (no gradient noise, no weight decay), so a gradient
step is ``eta*g = x*L`` with ``x = eta*h``; each local step is momentum SGD with momentum ``mu``.
Every rule's update equations are written as linear maps on the state vector (the global weight
``W``, the mean in flight ``P`` and the ranks' ``L``, ``U``, ``S``, ...); their product over one
period is the period's transition matrix ``T(x)``. The rule is stable at ``x`` when every
eigenvalue of ``T(x)`` has modulus at most ``1 + TOL``; then no initial spread between the ranks grows.

Stability is not monotone in ``x`` (there are stable islands above the first unstable
point), so the threshold is found by a scan, never by bisection: ``x`` runs upward over a
geometric grid from ``X_MIN`` to ``X_MAX`` in steps of ``STEP`` (0.2%), and the threshold is
the last grid point before the first unstable one (``X_MAX`` when none is, 0 when the first
one is already unstable). It is therefore exact to within one step (0.2%) below.

Each rule's (and algorithm's) map is its spec's ``linear_map`` (``ssdmpi.spec.LinearMap``), built in
its own file from the pieces here (``LinearState``, ``chain``, ``power``, ``local_steps``, ``post``,
``merge``); ``registry.linear_maps()`` lists them. ``DAMP`` is a model of this page only (delta-own
restarting from ``W + a*D`` instead of ``W + D``: the own displacement still in flight damped by
``a``; the posted ``D`` stays whole). ``threshold(linear_map, k, ...)`` is the function;
``ssdmpi bench stability`` prints its table. NumPy is imported when a map is built, not with this
module (the specs that import it are read to build the command line).
"""

from __future__ import annotations

from ssdmpi.spec import LinearMap

X_MIN, X_MAX = 1e-3, 4.0      # the scanned range of eta*h
STEP = 0.002                  # relative grid step: x_{i+1} = x_i * (1 + STEP)
TOL = 1e-9                    # |eigenvalue| <= 1 + TOL counts as stable


def grid(x_min: float = X_MIN, x_max: float = X_MAX, step: float = STEP):
    """The scanned values of ``eta*h``: ``x_min * (1 + step)^i`` up to ``x_max`` (inclusive)."""
    import numpy as np

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

    def assign(self, x, updates: dict):
        import numpy as np

        A = np.broadcast_to(np.eye(self.n), (len(x), self.n, self.n)).copy()
        for target, sources in updates.items():
            row = self.index[target]
            A[:, row, :] = 0.0
            for source, coef in sources.items():
                A[:, row, self.index[source]] += coef
        return A


def chain(*maps):
    """The map of applying ``maps`` in the order given (the first one first)."""
    out = maps[0]
    for A in maps[1:]:
        out = A @ out
    return out


def power(A, n: int):
    """``A`` applied ``n`` times."""
    import numpy as np

    out = np.broadcast_to(np.eye(A.shape[-1]), A.shape).copy()
    for _ in range(n):
        out = A @ out
    return out


def local_steps(s: LinearState, x, mu: float):
    """One local momentum step on every rank: ``U <- mu*U - eta*g`` (``eta*g = x*L``); ``L <- L + U``."""
    N = s.N
    velocity = s.assign(x, {f"U{r}": {f"U{r}": mu, f"L{r}": -x} for r in range(N)})
    position = s.assign(x, {f"L{r}": {f"L{r}": 1.0, f"U{r}": 1.0} for r in range(N)})
    return chain(velocity, position)


def post(s: LinearState, x):
    """A period's end: ``D = L - S`` posted (``P <- mean_r D_r``, the sum over ranks divided by N); ``S <- L``."""
    N = s.N
    send = s.assign(x, {"P": {**{f"L{r}": 1.0 / N for r in range(N)}, **{f"S{r}": -1.0 / N for r in range(N)}}})
    return chain(send, s.assign(x, {f"S{r}": {f"L{r}": 1.0} for r in range(N)}))


def merge(s: LinearState, x, k: int = 1, a: float = 0.0):
    """The merge of the sum in flight: ``W <- W + P``; ``U <- (1 - a) U + (a/k) P``; ``L <- W + (L - S)``;
    ``S <- W``."""
    N = s.N
    w = s.assign(x, {"W": {"W": 1.0, "P": 1.0}, **{f"U{r}": {f"U{r}": 1.0 - a, "P": a / k} for r in range(N)}})
    lo = s.assign(x, {f"L{r}": {"W": 1.0, f"L{r}": 1.0, f"S{r}": -1.0} for r in range(N)})
    return chain(w, lo, s.assign(x, {f"S{r}": {"W": 1.0} for r in range(N)}))


def _damp(x, k, N, mu, damping=0.5):
    # delta-own's order at a period end: W <- W + P; D = L - S; L <- W + a*D; post D; S <- L.
    s = LinearState(N, per_rank=("L", "U", "S", "D"))
    w = s.assign(x, {"W": {"W": 1.0, "P": 1.0}})
    disp = s.assign(x, {f"D{r}": {f"L{r}": 1.0, f"S{r}": -1.0} for r in range(N)})
    restart = s.assign(x, {f"L{r}": {"W": 1.0, f"D{r}": damping} for r in range(N)})
    send = s.assign(x, {"P": {f"D{r}": 1.0 / N for r in range(N)}})
    start = s.assign(x, {f"S{r}": {f"L{r}": 1.0} for r in range(N)})
    return chain(power(local_steps(s, x, mu), k), w, disp, restart, send, start)


DAMP = LinearMap(_damp, default=False)


def period_map(linear_map: LinearMap, x, k: int, N: int = 2, mu: float = 0.9, **own):
    """The transition matrix ``T(x)`` (``(len(x), n, n)``) of one period of ``linear_map`` at ``k``, with
    the values ``own`` of its settings (e.g. delta-merge's ``merge_delay``, ``merge_momentum``);
    ``ValueError`` for values outside its range."""
    import numpy as np

    return linear_map.build(np.asarray(x, dtype=np.float64), k if linear_map.period else 1, N, mu, **own)


def spectral_radius(T):
    """The largest eigenvalue modulus of each matrix of ``T`` (``(G, n, n)`` -> ``(G,)``)."""
    import numpy as np

    return np.abs(np.linalg.eigvals(T)).max(axis=-1)


def threshold(linear_map: LinearMap, k: int, N: int = 2, mu: float = 0.9, x=None, **own) -> float:
    """The largest stable ``eta*h`` of ``linear_map`` at ``k`` (and ``own``): the last grid point of ``x``
    (default ``grid()``) before the first unstable one; ``x[-1]`` when none is, 0 when ``x[0]`` is not."""
    import numpy as np

    x = grid() if x is None else np.asarray(x, dtype=np.float64)
    stable = spectral_radius(period_map(linear_map, x, k, N, mu, **own)) <= 1.0 + TOL
    if stable.all():
        return float(x[-1])
    first = int(np.argmin(stable))
    return float(x[first - 1]) if first else 0.0
