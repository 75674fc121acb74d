"""Update rules of ``--comm period`` (ALGORITHM.md 5b): one allreduce per period of ``k``.

A period is the ``k`` iterations ``m = j*k ... j*k + k - 1`` of the delay stage; its
end is the iteration with ``(m + 1) % k == 0``. Each rule posts one nonblocking
allreduce at a period's end and completes it ``d`` iterations later (``delta-merge``,
``--merge-delay d``) or at the next period's end (the others), so every request has that
much compute to hide behind. Two buffers alternate: one accumulating, one in flight.
``g`` is this rank's MEAN gradient.

| rule | where specified | per iteration | at a period's end |
|---|---|---|---|
| ``delta-merge`` (default) | docs/PERIOD_RULE.md | as delta-own | post ``D = L - S`` (sum); ``S <- L``; ``d`` iterations later: ``W <- W + Dsum/N``; ``L <- W + (L - S)``; ``S <- W`` |
| ``delta-own`` | docs/PERIOD_RULE.md | momentum SGD on ``L`` with a per-rank ``U`` | wait previous ``Dsum``: ``W <- W + Dsum/N``; ``D = L - S``; ``L <- W + D`` (if ``W`` changed); post ``D`` (sum); ``S <- L`` |
| ``replay`` (ablation) | ALGORITHM.md 5b, PERIOD_RULE.md 6 | ``A += g``; local update (``--local-update``) | post ``A``; wait the previous period's ``Abar``; ``k`` global steps with ``Abar/k``; ``L <- W`` |

A result drained between iterations (checkpoint) is held (``has_Rp``, ``Rp``) and
applied at the boundary where the wait would have returned it, so resuming is bitwise.

Adding a rule: subclass ``PeriodRule``, register it in ``PERIOD_RULES``, and add the
same rule, written independently from the spec, to ``ssdmpi/algos/reference.py``.
"""

from __future__ import annotations

from ssdmpi.algos import resize


class PeriodRule:
    """Base: the double buffer and the request in flight. ``algo`` is the ``SSDPeriod`` owner.

    Contract: ``begin()`` at the switch (``L`` has just been set to ``W``); ``step(g, m)``
    once per delay iteration after the gradient; ``drain()`` completes the request in flight
    and holds its (averaged) result; ``apply_held()`` applies a held result now;
    ``state_dict()``/``load_state_dict()``; ``local_lr(t)`` for rules without ``--local-update``.
    """

    name = "base"
    uses_local_update = False
    uses_merge_delay = False   # True: the rule merges --merge-delay d iterations after posting
    folds_mean = False   # True: post the SUM; the rule divides by N as it applies it (no separate pass)

    def __init__(self, algo):
        self.a = algo
        xp = algo.xp
        self._acc = xp.zeros_like(algo.W)       # being filled this period
        self._other = xp.zeros_like(algo.W)     # in flight, or a held result, or free
        self._handle = None
        self._held = False

    def begin(self) -> None:
        pass

    def local_lr(self, t: int) -> float:
        return self.a.schedule(t)

    def _post(self, buf):
        return self.a.comm.allreduce_start(buf, average=not self.folds_mean)

    def drain(self) -> None:
        """Complete the request in flight and hold its mean (a folded sum is divided here: drains
        happen at checkpoints and evaluations, and a checkpoint's held result is the mean)."""
        if self._handle is not None:
            self._handle.wait()
            self._handle = None
            self._held = True
            if self.folds_mean and self.a.N > 1:
                self._other /= self.a.N

    def _swap_in(self, handle) -> None:
        """``_acc`` was just posted as ``handle``: it becomes the in-flight buffer."""
        self._acc, self._other = self._other, self._acc
        self._handle = handle

    def finalize(self) -> None:
        """End of training: complete and apply whatever is in flight now."""
        self.drain()
        self.apply_held()

    def apply_held(self) -> None:
        if self._held:
            self._apply(self._other)
            self._held = False

    def _apply(self, reduced) -> None:
        raise NotImplementedError

    def reset_inflight(self) -> None:
        self._handle, self._held = None, False

    def state_dict(self) -> dict:
        """The live buffers: ``acc``, ``has_Rp`` and, when 1, the held mean ``Rp``."""
        d = {"acc": self._acc, "has_Rp": int(self._held)}
        if self._held:
            d["Rp"] = self._other
        return d

    def replicated(self) -> tuple:
        """Keys of ``state_dict()`` identical on every rank: a held mean is the allreduce's result."""
        return ("Rp",) if self._held else ()

    @staticmethod
    def resized(state: dict, k: int) -> str:
        """Resuming on another number of ranks: change the averaged ``state`` (``resize.averaged``)
        where this rule needs more; return what was merged ("": nothing more)."""
        return ""

    def load_state_dict(self, d: dict) -> None:
        xp = self.a.xp
        self._handle = None
        if "acc" in d:
            self._acc[...] = xp.asarray(d["acc"])
        self._held = bool(int(d["has_Rp"]))
        if self._held:
            self._other[...] = xp.asarray(d["Rp"])


class GradientReplay(PeriodRule):
    """``replay``: accumulate the period's mean gradients, replay them as ``k`` global steps.

    Per iteration ``m``: ``A <- g`` if ``m % k == 0`` else ``A <- A + g``; then the local
    update (section 4) ``L <- local(L, g, m)``. At the period's end: post
    ``Iallreduce(mean, A)``; wait for the previous period's request, giving
    ``Abar = mean_r A_r``; ``k`` times: ``M, W <- global update with Abar/k`` (``s += 1``
    each, ``eta_g(s)`` each); ``L <- W``. The first period end has nothing to apply.
    ``finalize()`` ``j`` iterations into a period replays the partial ``Abar`` as ``j`` steps.
    """

    name = "replay"
    uses_local_update = True

    def step(self, g, m: int) -> None:
        a = self.a
        if m % a.k == 0:
            self._acc[...] = g
        else:
            self._acc += g
        a.local.step(a.L, g, m, a._local_lr(a.t))
        if (m + 1) % a.k == 0:
            handle = self._post(self._acc)
            self.drain()
            self.apply_held()
            self._swap_in(handle)
            a.L[...] = a.W

    def _apply(self, reduced, steps: int | None = None) -> None:
        """``steps`` (default ``k``) global steps, each with ``reduced / steps``."""
        a = self.a
        steps = a.k if steps is None else steps
        reduced /= steps
        for _ in range(steps):
            a.global_sgd.step(a.W, a.M, reduced, a.schedule(a.s))
            a.s += 1

    def finalize(self) -> None:
        """End of training: apply the sum in flight, then the partial period's accumulator as
        its period end would have: ``j`` global steps with ``mean_r A_r / j`` (blocking)."""
        a = self.a
        super().finalize()
        j = (a.t - a.T_w) % a.k
        if j:
            a.comm.allreduce_mean(self._acc)
            self._apply(self._acc, j)


class DeltaOwn(PeriodRule):
    """``delta-own`` (docs/PERIOD_RULE.md, the chosen rule): delta averaging keeping own progress.

    Switch: ``U <- M``, ``S <- L`` (``L = W``). Every delay iteration ``t`` (``g`` = mean gradient)::

        U <- (mu*U - (eta(t)*lam*mask)*L) - eta(t)*g        # this operation order (PERIOD_RULE.md 3)
        L <- L + U

    At the end of period ``p`` (``(t - T_w) % k == k - 1``)::

        if a sum is in flight or held (p >= 1):  W <- W + Sum/N;  s += k;  changed = True
        D <- L - S
        if changed:  L <- W + D                             # own displacement still in flight
        post Iallreduce(D) (sum; the /N is folded into the next W update);  S <- L

    ``M`` is not used in the delay stage. ``U`` is never reset or averaged. ``finalize()``
    (end of training) applies what is in flight, then averages the partial period with a
    blocking allreduce: ``W <- W + mean_r(L_r - S_r)``, ``S <- L`` (skipped when training
    ended on a period boundary, where ``L = S``).
    """

    name = "delta-own"
    uses_local_update = False
    folds_mean = True

    def begin(self) -> None:
        from ssdmpi.optim import fused  # late: the CLI parser reads PERIOD_RULES, fused imports NumPy

        a = self.a
        self.U = a.M.copy()
        self.S = a.L.copy()
        self._fused, self._plan = fused, fused.Plan((a.mask,), scratch=1)
        self._plan.poll = a.poll

    def step(self, g, m: int) -> None:
        a = self.a
        eta = a.schedule(a.t)
        # One fused pass: t = L*mask; t = t*(eta*lam); U = U*mu - t; U = U - g*eta; L = L + U.
        # (eta*lam*mask)*L rounds like this: eta*lam*mask is exactly eta*lam or 0.
        self._fused.delta_own_step(self._plan, self.U, a.L, g, eta * a.config.weight_decay, a.config.momentum, eta)
        if (m + 1) % a.k == 0:
            changed = self._complete()
            D = self._acc
            self._fused.delta_own_boundary(self._plan, a.W, a.L, self.S, D, changed)  # D = L-S; [L = W+D]; S = L
            self._swap_in(self._post(D))

    def _complete(self) -> bool:
        """At a period end: ``W <- W + Sum/N`` from the request in flight (one fused pass: the
        division folded into the addition), or from a held mean; True when ``W`` changed."""
        a = self.a
        if self._handle is not None:
            total, self._handle = self._handle.wait(), None
            self._fused.add_divided(self._plan, a.W, total, a.N)
            a.s += a.k
            return True
        changed = self._held
        self.apply_held()
        return changed

    def _apply(self, reduced) -> None:
        a = self.a
        a.W += reduced
        a.s += a.k

    def finalize(self) -> None:
        """Apply the sum in flight, then fold the partial period into ``W`` (blocking, collective)."""
        a = self.a
        self.drain()
        self.apply_held()
        if (a.t - a.T_w) % a.k != 0:               # not on a boundary: L - S is not zero
            D = self._acc
            a.xp.subtract(a.L, self.S, out=D)
            a.comm.allreduce_mean(D)
            a.W += D
            self.S[...] = a.L

    def state_dict(self) -> dict:
        """``U``, ``S``, the held mean; not ``acc``: ``D = L - S`` overwrites it before it is read."""
        d = super().state_dict()
        del d["acc"]
        d.update({"U": self.U, "S": self.S})
        return d

    @staticmethod
    def resized(state: dict, k: int) -> str:
        """Merge what is in flight into ``W`` and restart the period (``resize.merge_displacements``)."""
        return resize.merge_displacements(state, k)

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self.U[...] = self.a.xp.asarray(d["U"])
        self.S[...] = self.a.xp.asarray(d["S"])


class DeltaMerge(DeltaOwn):
    """``delta-merge`` (docs/PERIOD_RULE.md): delta-own's local step; the sum posted at a period's end
    is merged ``d`` iterations later (``--merge-delay``, ``1 <= d <= k``), not at the next period's end.

    State as delta-own (``U``, ``S``). Every delay iteration ``m = t - T_w``, after the local step::

        if m + 1 - d is a period end (a positive multiple of k):       # the merge
            W <- W + Sum/N;  s += k                                     # the sum posted d iterations ago
            L <- W + (L - S);  S <- W                                   # own progress since that post kept
        if m + 1 is a period end:                                       # the post (after a merge at d = k)
            D <- L - S;  post Iallreduce(D) (sum);  S <- L

    ``L - S`` is always this rank's progress not yet posted, so ``W + Sum/N`` plus the mean of
    ``L - S`` is the mean of the ranks' ``L`` (exact arithmetic). A request drained between the
    post and the merge (checkpoint) is held and applied at the merge. ``finalize()`` as delta-own.
    """

    name = "delta-merge"
    uses_merge_delay = True

    def step(self, g, m: int) -> None:
        a = self.a
        eta = a.schedule(a.t)
        self._fused.delta_own_step(self._plan, self.U, a.L, g, eta * a.config.weight_decay, a.config.momentum, eta)
        since_post = m + 1 - a.d
        if since_post >= a.k and since_post % a.k == 0:
            self._complete()
            self._fused.merge_restart(self._plan, a.W, a.L, self.S)          # L = W + (L - S); S = W
        if (m + 1) % a.k == 0:
            D = self._acc
            self._fused.delta_own_boundary(self._plan, a.W, a.L, self.S, D, False)   # D = L - S; S = L
            self._swap_in(self._post(D))


PERIOD_RULES = {"delta-own": DeltaOwn, "delta-merge": DeltaMerge, "replay": GradientReplay}
DEFAULT_PERIOD_RULE = "delta-merge"   # docs/PERIOD_RULE.md, docs/ACCURACY.md
