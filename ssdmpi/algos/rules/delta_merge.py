"""``--period-rule delta-merge`` (docs/PERIOD_RULE.md 3-4, the default): delta-own's local step, the
sum posted at a period's end merged ``--merge-delay d`` iterations later."""

from __future__ import annotations

from ssdmpi.algos.rules.delta_own import DeltaOwn
from ssdmpi.algos.spec import RuleSpec, Setting
from ssdmpi.errors import UserError
from ssdmpi.validate import positive_int


class DeltaMerge(DeltaOwn):
    """``delta-merge``: delta-own's local step; the sum posted at a period's end is merged ``d``
    iterations later (``--merge-delay``, ``1 <= d <= k``), not at the next period's end.

    State as delta-own (``U``, ``S``). Every delay iteration ``m = t - T_w``, after the local step::

        if m + 1 - d is a period end (a positive multiple of k):       # the merge
            W <- W + Sum/N;  s += k                                     # the sum posted d iterations ago
            L <- W + (L - S);  S <- W                                   # own progress since that post kept
        if m + 1 is a period end:                                       # the post (after a merge at d = k)
            D <- L - S;  post Iallreduce(D) (sum);  S <- L

    ``L - S`` is always this rank's progress not yet posted, so ``W + Sum/N`` plus the mean of
    ``L - S`` is the mean of the ranks' ``L`` (exact arithmetic). A request drained between the
    post and the merge (checkpoint) is held and applied at the merge. ``finalize()`` and a resume on
    another rank count as delta-own (a sum in flight mid-delay is merged at the resume).
    """

    def step(self, g, m: int) -> None:
        st = self.st
        eta = st.schedule(st.counts.t)
        self._fused.delta_own_step(self._plan, self.U, st.L, g, eta * st.weight_decay, st.momentum, eta)
        since_post = m + 1 - st.d
        if since_post >= st.k and since_post % st.k == 0:
            self._complete()
            self._fused.merge_restart(self._plan, st.W, st.L, self.S)          # L = W + (L - S); S = W
        if (m + 1) % st.k == 0:
            D = self._acc
            self._fused.delta_own_boundary(self._plan, st.W, st.L, self.S, D, False)   # D = L - S; S = L
            self._swap_in(self._post(D))


def _within_the_period(run) -> None:
    """``d <= k``: a period's sum is merged before the next one is posted."""
    if run.merge_delay is not None and run.delay != "auto" and run.delay is not None and run.merge_delay > run.delay:
        raise UserError(f"--merge-delay {run.merge_delay} is longer than the period --delay {run.delay}: a period's "
                        "sum must be merged before the next one is posted; use --merge-delay <= --delay")


MERGE_DELAY = Setting("merge_delay", 1, "iterations from posting a period's sum to merging it (1..k): a larger d "
                      "hides a longer allreduce, at a cost in stability (docs/PERIOD_RULE.md); --delay auto chooses "
                      "it with k unless given", int, positive_int, metavar="D", context_check=_within_the_period,
                      structural=True, bench_tag="d{}")

SPEC = RuleSpec("delta-merge", DeltaMerge, reference="ssdmpi.algos.reference:DeltaMergeTwin",
                summary="as delta-own | post D = L - S (sum); S <- L; d iterations later: W <- W + Dsum/N; "
                        "L <- W + (L - S); S <- W",
                settings=(MERGE_DELAY,), auto_chooses="merge_delay", default=True)
