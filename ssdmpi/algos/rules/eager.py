"""``--period-rule eager`` (docs/PERIOD_RULE.md 9): DiLoCo's eager outer updates, each rank's own current
displacement applied at once with weight ``1/N``, the other ranks' one period later."""

from __future__ import annotations

from ssdmpi.algos.rules.delta_own import DeltaOwn
from ssdmpi.spec import LinearMap, RuleSpec

# The GPU kernel of ``post_eager``: its NumPy loop statement for statement.
KERNEL = ("T W, T n", "T L, T S, T D", "T d = L - S; D = d; T e = d / n; L = W + e; S = L;")


class Eager(DeltaOwn):
    """``eager``: the eager updates of DiLoCo (Kale, Douillard, Donchev 2025, arXiv 2502.12996, Algorithm 3)
    with the outer optimizer plain SGD at lr 1, on delta-own's local step and timing.

    State as delta-own: ``U`` (this rank's inner optimizer state), ``S`` (where this rank's current inner
    phase started: its outer model), the sum in flight. Every delay iteration the local step; at the end of
    period ``p`` (``(t - T_w) % k == k - 1``)::

        if a sum is in flight or held (p >= 1):  W <- W + Sum/N;  s += k     # the previous period's sum
        D <- L - S                                                          # this period's displacement
        L <- W + D/N                                                        # own share now, the rest later
        post Iallreduce(D) (sum);  S <- L

    ``W`` holds the initial model plus every mean displacement that has arrived, the same bits on every
    rank; each rank's outer model is ``W + D_own/N``. That is the paper's per-replica update
    ``theta_m <- theta_m - (Delta_m/N + (Delta_bar_prev - Delta_m_prev/N))`` (outer gradient ``Delta = -D``:
    the rank's current outer gradient with weight ``1/N``, plus the average that was in flight less the
    rank's own delayed share of it) in its absolute form: equal in exact arithmetic, with no copy of the
    previous ``D`` and no drift between ``L`` and ``W``. Every displacement reaches the model exactly once,
    with weight ``1/N``: the rank's own at once, the others' when the sum arrives. ``finalize()`` and a
    resume on another rank count are delta-own's: ``W <- W + Sum/N + mean_r(L_r - S_r)``, the model of
    every displacement applied. ``--outer-optimizer`` does not apply (the paper steps a per-replica outer
    optimizer with the mixture; here the outer step is the plain one).
    """

    def step(self, g, m: int) -> None:
        st = self.st
        self.optimizer.update(st.L, self.U, g, st.schedule(st.counts.t))
        if (m + 1) % st.k == 0:
            self._complete()
            D = self._acc
            post_eager(self._plan, st.W, st.L, self.S, D, st.N)        # D = L - S; L = W + D/N; S = L
            self._swap_in(self._post(D))


def post_eager(plan, W, L, S, D, n: int) -> None:
    """A period's displacement taken to be posted, this rank's share applied: ``D = L - S; L = W + D/n;
    S = L``, one pass over the buffers (``ssdmpi/optim/fused.py``'s ``Plan``: NumPy blocks, or one CuPy
    kernel with the same operations)."""
    import numpy as np

    plan.check(W, L, S, D)
    if plan.device:
        plan.kernel("ssdmpi_post_eager", KERNEL)(W, *plan.scalars(n), L, S, D)
        return
    for sl, _, _ in plan.walk():
        x, d = L[sl], D[sl]
        np.subtract(x, S[sl], d)
        np.divide(d, n, x)
        np.add(W[sl], x, x)
        S[sl] = x


def _linear_map(x, k, N, mu):
    """``k`` local steps; then ``W <- W + P``; ``P <- mean_r(L_r - S_r)`` and ``L_r <- W + (L_r - S_r)/N`` at
    once; ``S <- L``. It is delta-own restarting from ``W + D/N``: ``stability.DAMP`` at ``a = 1/N``."""
    from ssdmpi.algos.stability import LinearState, chain, local_steps, power

    s = LinearState(N)
    merge = s.assign(x, {"W": {"W": 1.0, "P": 1.0}})
    share = s.assign(x, {"P": {**{f"L{r}": 1.0 / N for r in range(N)}, **{f"S{r}": -1.0 / N for r in range(N)}},
                         **{f"L{r}": {"W": 1.0, f"L{r}": 1.0 / N, f"S{r}": -1.0 / N} for r in range(N)}})
    start = s.assign(x, {f"S{r}": {f"L{r}": 1.0} for r in range(N)})
    return chain(power(local_steps(s, x, mu), k), merge, share, start)


SPEC = RuleSpec("eager", Eager, reference="ssdmpi.verify.eager_twin:EagerTwin",
                summary="as delta-own | wait previous Dsum: W <- W + Dsum/N; D = L - S; L <- W + D/N; post D (sum); "
                        "S <- L",
                linear_map=LinearMap(_linear_map, default=False))
