"""``--period-rule replay`` (ablation): accumulate the period's mean gradients, replay them as ``k``
global steps (ALGORITHM.md 5b, docs/PERIOD_RULE.md 6)."""

from __future__ import annotations

from ssdmpi.algos.period import PeriodRule
from ssdmpi.spec import LinearMap, RuleSpec


class GradientReplay(PeriodRule):
    """``replay``: accumulate the period's mean gradients, replay them as ``k`` global steps.

    Per iteration ``m``: ``A <- g`` if ``m % k == 0`` else ``A <- A + g``; then the local
    update (section 4) ``L <- local(L, g, m)``. At the period's end: post
    ``Iallreduce(mean, A)``; wait for the previous period's request, giving
    ``Abar = mean_r A_r``; ``k`` times: ``M, W <- global update with Abar/k`` (``s += 1``
    each, ``eta_g(s)`` each); ``L <- W``. The first period end has nothing to apply.
    ``finalize()`` ``j`` iterations into a period replays the partial ``Abar`` as ``j`` steps.
    """

    def step(self, g, m: int) -> None:
        st = self.st
        if m % st.k == 0:
            self._acc[...] = g
        else:
            self._acc += g
        st.local.step(st.L, g, m, st.local_lr(st.counts.t))
        if (m + 1) % st.k == 0:
            handle = self._post(self._acc)
            self.drain()
            self.apply_held()
            self._swap_in(handle)
            st.L[...] = st.W

    def _apply(self, reduced, steps: int | None = None) -> None:
        """``steps`` (default ``k``) global steps, each with ``reduced / steps``."""
        st = self.st
        steps = st.k if steps is None else steps
        reduced /= steps
        for _ in range(steps):
            st.optimizer.update(st.W, st.M, reduced, st.schedule(st.counts.s))
            st.counts.s += 1

    def finalize(self) -> None:
        """End of training: apply the sum in flight, then the partial period's accumulator as
        its period end would have: ``j`` global steps with ``mean_r A_r / j`` (blocking)."""
        st = self.st
        super().finalize()
        j = (st.counts.t - st.T_w) % st.k
        if j:
            st.comm.allreduce_mean(self._acc)
            self._apply(self._acc, j)


def _linear_map(x, k, N, mu):
    """With the global-momentum local update: ``L <- L + mu*M - eta*g``; ``A`` accumulates ``eta*g``. At a
    period end: ``k`` global steps ``M <- mu*M - P/k``, ``W <- W + M`` with the previous period's mean ``P``;
    post ``A``; ``L <- W``."""
    from ssdmpi.algos.stability import LinearState, chain, power

    s = LinearState(N, shared=("W", "M", "P"), per_rank=("L", "A"))
    local = s.assign(x, {**{f"L{r}": {f"L{r}": 1.0 - x, "M": mu} for r in range(N)},
                         **{f"A{r}": {f"A{r}": 1.0, f"L{r}": x} for r in range(N)}})
    glob = chain(s.assign(x, {"M": {"M": mu, "P": -1.0 / k}}), s.assign(x, {"W": {"W": 1.0, "M": 1.0}}))
    send = chain(s.assign(x, {"P": {f"A{r}": 1.0 / N for r in range(N)}}),
                 s.assign(x, {**{f"A{r}": {} for r in range(N)}, **{f"L{r}": {"W": 1.0} for r in range(N)}}))
    return chain(power(local, k), power(glob, k), send)


SPEC = RuleSpec("replay", GradientReplay, reference="ssdmpi.verify.reference:ReplayTwin",
                summary="A += g; local update (--local-update) | post A; wait the previous period's Abar; "
                        "k global steps with Abar/k; L <- W",
                uses_local_update=True, variant={"local_update": "global-momentum"},
                linear_map=LinearMap(_linear_map, default=False))
