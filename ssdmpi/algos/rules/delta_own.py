"""``--period-rule delta-own`` (docs/PERIOD_RULE.md 6): delta averaging keeping own progress, merged
at the next period's end."""

from __future__ import annotations

from ssdmpi.algos import resize
from ssdmpi.algos.period import PeriodRule
from ssdmpi.spec import LinearMap, RuleSpec


class DeltaOwn(PeriodRule):
    """``delta-own`` (docs/PERIOD_RULE.md 6): delta averaging keeping own progress.

    Switch: ``U <- M``, ``S <- L`` (``L = W``). Every delay iteration ``t`` (``g`` = mean gradient)::

        U <- (mu*U - (eta(t)*lam*mask)*L) - eta(t)*g        # this operation order (PERIOD_RULE.md 3)
        L <- L + U

    At the end of period ``p`` (``(t - T_w) % k == k - 1``)::

        if a sum is in flight or held (p >= 1):  W <- W + Sum/N;  s += k;  changed = True
        D <- L - S
        if changed:  L <- W + D                             # own displacement still in flight
        post Iallreduce(D) (sum; the /N is folded into the next W update);  S <- L

    ``U`` is this rank's state of the inner optimizer (``--optimizer``; momentum SGD's velocity, stepped
    in the expanded order above), a copy of the global state ``M`` at the switch; the local step is
    that optimizer's step. ``M`` is not used in the delay stage. ``U`` is never reset or averaged. ``finalize()``
    (end of training) applies what is in flight, then averages the partial period with a
    blocking allreduce: ``W <- W + mean_r(L_r - S_r)``, ``S <- L`` (skipped when training
    ended on a period boundary, where ``L = S``).

    With an outer optimizer (``st.outer``, ``ssdmpi/optim/outer.py``) every ``W <- W + Sum/N`` above, the
    partial period's at ``finalize`` included, is the outer step from the mean displacement ``Sum/N``
    instead (pseudo-gradient ``-Sum/N``, the global buffer ``st.B``); the rest is unchanged, so ``L <- W + D``
    keeps the rank's own displacement in flight on top of the outer-stepped ``W``: in shift form the rank's
    posted displacement is replaced by the outer step.
    """

    folds_mean = True

    def begin(self) -> None:
        from ssdmpi.optim import fused  # late: the CLI parser reads this rule's SPEC; fused imports NumPy

        st = self.st
        self.U = st.M.copy()
        self.S = st.L.copy()
        self.optimizer = st.optimizer.local_form()
        self.optimizer.poll = st.poll
        self._fused, self._plan = fused, fused.Plan((st.mask,), scratch=0)
        self._plan.poll = st.poll

    def step(self, g, m: int) -> None:
        st = self.st
        # One fused pass of the optimizer (momentum SGD: t = L*mask; t = t*(eta*lam); U = U*mu - t;
        # U = U - g*eta; L = L + U; (eta*lam*mask)*L rounds like this: eta*lam*mask is exactly eta*lam or 0).
        self.optimizer.update(st.L, self.U, g, st.schedule(st.counts.t))
        if (m + 1) % st.k == 0:
            changed = self._complete()
            D = self._acc
            self._fused.post_displacement(self._plan, st.W, st.L, self.S, D, changed)  # D = L-S; [L = W+D]; S = L
            self._swap_in(self._post(D))

    def _complete(self) -> bool:
        """At a period end: ``W <- W + Sum/N`` from the request in flight (one fused pass: the
        division folded into the addition), or from a held mean; True when ``W`` changed."""
        st = self.st
        if self._handle is not None:
            total, self._handle = self._handle.wait(), None
            if st.outer is None:
                self._fused.add_divided(self._plan, st.W, total, st.N)
            else:
                st.outer.step(st.W, st.B, total, st.N)
            st.counts.s += st.k
            return True
        changed = self._held
        self.apply_held()
        return changed

    def _add_mean(self, mean) -> None:
        """``W <- W + mean`` (a mean displacement), or the outer step from it."""
        st = self.st
        if st.outer is None:
            st.W += mean
        else:
            st.outer.step(st.W, st.B, mean)

    def _apply(self, reduced) -> None:
        self._add_mean(reduced)
        self.st.counts.s += self.st.k

    def finalize(self) -> None:
        """Apply the sum in flight, then fold the partial period into ``W`` (blocking, collective)."""
        st = self.st
        self.drain()
        self.apply_held()
        if (st.counts.t - st.T_w) % st.k != 0:               # not on a boundary: L - S is not zero
            D = self._acc
            st.xp.subtract(st.L, self.S, out=D)
            st.comm.allreduce_mean(D)
            self._add_mean(D)
            self.S[...] = st.L

    def state_dict(self) -> dict:
        """``U``, ``S``, the held mean; not ``acc``: ``D = L - S`` overwrites it before it is read."""
        d = super().state_dict()
        del d["acc"]
        d.update({**self.U.entries("U"), "S": self.S})
        return d

    @staticmethod
    def resized(state: dict, k: int, outer=None) -> str:
        """Merge what is in flight into ``W`` and restart the period (``resize.merge_displacements``)."""
        return resize.merge_displacements(state, k, outer)

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self.U.load_entries(d, "U", self.st.xp)
        self.S[...] = self.st.xp.asarray(d["S"])


def merged_after(x, k: int, d: int, N: int, mu: float, a: float = 0.0):
    """The linear map of a period whose posted sum is merged ``d`` steps after it was posted, with the
    momentum merge ``a`` (``ssdmpi/algos/stability.py``): delta-own is ``d = k``, ``a = 0``."""
    from ssdmpi.algos.stability import LinearState, chain, local_steps, merge, post, power

    if d is None or not 1 <= d <= k:
        raise ValueError(f"merge delay d must be in 1..k={k}, got {d!r}")
    s = LinearState(N)
    step = local_steps(s, x, mu)
    return chain(power(step, d), merge(s, x, k, a), power(step, k - d), post(s, x))


SPEC = RuleSpec("delta-own", DeltaOwn, reference="ssdmpi.verify.reference:DeltaOwnTwin",
                summary="momentum SGD on L with a per-rank U | wait previous Dsum: W <- W + Dsum/N; D = L - S; "
                        "L <- W + D (if W changed); post D (sum); S <- L",
                accuracy_default=True, linear_map=LinearMap(lambda x, k, N, mu: merged_after(x, k, k, N, mu)),
                outer_step=True)
