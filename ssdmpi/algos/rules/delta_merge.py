"""``--period-rule delta-merge`` (docs/PERIOD_RULE.md 3-4, the default): delta-own's local step, the
sum posted at a period's end merged ``--merge-delay d`` iterations later."""

from __future__ import annotations

import functools

from ssdmpi.algos.rules.delta_own import DeltaOwn, merged_after
from ssdmpi.errors import UserError
from ssdmpi.spec import LinearMap, RuleSpec, Setting
from ssdmpi.validate import number, positive_int


class DeltaMerge(DeltaOwn):
    """``delta-merge``: delta-own's local step; the sum posted at a period's end is merged ``d``
    iterations later (``--merge-delay``, ``1 <= d <= k``), not at the next period's end. Built as
    ``DeltaMerge(state, merge_delay=d, merge_momentum=a)``.

    State as delta-own (``U``, ``S``). Every delay iteration ``m = t - T_w``, after the local step::

        if m + 1 - d is a period end (a positive multiple of k):       # the merge
            W <- W + Sum/N;  s += k                                     # the sum posted d iterations ago
            if a > 0:  U <- U*(1 - a) + (Sum/N)*(a/k)                   # the momentum merged (a: --merge-momentum)
            L <- W + (L - S);  S <- W                                   # own progress since that post kept
        if m + 1 is a period end:                                       # the post (after a merge at d = k)
            D <- L - S;  post Iallreduce(D) (sum);  S <- L

    ``L - S`` is always this rank's progress not yet posted, so ``W + Sum/N`` plus the mean of
    ``L - S`` is the mean of the ranks' ``L`` (exact arithmetic). ``Sum/(N k)`` is the ranks' mean
    step over the merged period: with ``a = 1`` every rank's velocity restarts from it, which drops
    the part of each rank's velocity that its own gradient noise put there and that the period's
    steps cancel out (docs/PERIOD_RULE.md); ``a = 0`` keeps each rank's own velocity. A request
    drained between the post and the merge (checkpoint) is held and applied at the merge.
    ``finalize()`` and a resume on another rank count as delta-own: a sum in flight mid-delay is
    merged at the resume, and its merge iteration then finds nothing to add (``L``, ``U`` kept).
    The momentum merge is the optimizer's (``Optimizer.merge_mean_step``; momentum SGD's is the line
    above).

    With an outer optimizer (``ssdmpi/optim/outer.py``) ``W <- W + Sum/N`` is the outer step from the mean
    displacement ``Sum/N`` (pseudo-gradient ``-Sum/N``, global momentum buffer ``B``) instead; the momentum
    merge still reads ``Sum/(N k)``, the ranks' mean inner step, and ``L <- W + (L - S)`` keeps the rank's
    progress of the ``d`` iterations since the post on top of the outer-stepped ``W``. In shift form the
    merge replaces the rank's own posted displacement ``D`` by the outer step ``u`` (``L <- L + (u - D)``),
    whatever ``d``: the ``d`` steps since the post were taken from a model that had ``D`` in place of ``u``,
    the staleness the merge delay always has. ``d = k`` is delta-own's timing with its outer step.
    """

    def __init__(self, state, merge_delay: int, merge_momentum: float):
        super().__init__(state)
        self.d, self.merge_momentum = int(merge_delay), float(merge_momentum)

    def step(self, g, m: int) -> None:
        st = self.st
        self.optimizer.update(st.L, self.U, g, st.schedule(st.counts.t))
        since_post = m + 1 - self.d
        if since_post >= st.k and since_post % st.k == 0:
            if self._complete():                     # nothing to add after a resume on another rank count
                self._merge_momentum(self._other)    # the mean just added to W (in flight or held: this buffer)
            self._fused.rebase(self._plan, st.W, st.L, self.S)          # L = W + (L - S); S = W
        if (m + 1) % st.k == 0:
            D = self._acc
            self._fused.post_displacement(self._plan, st.W, st.L, self.S, D, False)   # D = L - S; S = L
            self._swap_in(self._post(D))

    def _merge_momentum(self, mean) -> None:
        """``a`` (``--merge-momentum``) of the local optimizer state replaced by the mean step ``mean/k``."""
        if self.merge_momentum:
            st = self.st
            self.optimizer.merge_mean_step(self.U, mean, self.merge_momentum, st.k, lr=st.schedule(st.counts.t),
                                           params=st.L)


def _within_the_period(run) -> None:
    """``d <= k``: a period's sum is merged before the next one is posted."""
    if run.merge_delay is not None and run.delay != "auto" and run.delay is not None and run.merge_delay > run.delay:
        raise UserError(f"--merge-delay {run.merge_delay} is longer than the period --delay {run.delay}: a period's "
                        "sum must be merged before the next one is posted; use --merge-delay <= --delay")


MERGE_DELAY = Setting("merge_delay", 1, "iterations from posting a period's sum to merging it (1..k): a larger d "
                      "hides a longer allreduce, at a cost in stability (docs/PERIOD_RULE.md); --delay auto chooses "
                      "it with k unless given", int, positive_int, metavar="D", context_check=_within_the_period,
                      structural=True, bench_tag="d{}", sweep="1,2,3,5")

MERGE_MOMENTUM = Setting("merge_momentum", 1.0, "at each merge, the share A of every rank's momentum replaced by "
                         "the ranks' mean step over the merged period (1: all of it; 0: each rank keeps its own "
                         "momentum, docs/PERIOD_RULE.md)", float, functools.partial(number, low=0.0, high=1.0),
                         metavar="A", structural=True, bench_tag="mom{}", sweep="0,1")


def _linear_map(x, k, N, mu, merge_delay, merge_momentum=0.0):
    """delta-merge at ``(k, d)`` with the momentum merge ``a``: ``U <- (1 - a) U + (a/k) P`` at the merge."""
    return merged_after(x, k, merge_delay, N, mu, merge_momentum)


SPEC = RuleSpec("delta-merge", DeltaMerge, reference="ssdmpi.verify.reference:DeltaMergeTwin",
                summary="as delta-own | post D = L - S (sum); S <- L; d iterations later: W <- W + Dsum/N; "
                        "U <- U (1 - a) + a Dsum/(N k); L <- W + (L - S); S <- W",
                settings=(MERGE_DELAY, MERGE_MOMENTUM), auto_chooses=MERGE_DELAY.name, default=True,
                accuracy_default=True, linear_map=LinearMap(_linear_map),
                # there was no momentum merge before the setting: such checkpoints resume with 0
                predating={MERGE_MOMENTUM.name: 0.0}, outer_step=True)
