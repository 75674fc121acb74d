"""Update rules of ``--comm period`` (ALGORITHM.md 5b): one allreduce per period of ``k``.

A period is the ``k`` iterations ``m = j*k ... j*k + k - 1`` of the delay stage; its
end is the iteration with ``(m + 1) % k == 0``. Each rule posts one nonblocking
allreduce (mean over ranks) at a period's end and completes the previous period's at
the same point, so every request has a whole period of compute to hide behind. Two
buffers alternate: one accumulating, one in flight. ``g`` is this rank's MEAN gradient.

| rule | ALGORITHM.md 5b | per iteration | at a period's end |
|---|---|---|---|
| ``replay`` | gradient replay | ``A += g``; local update (``--local-update``) | post ``A``; wait the previous period's ``Abar``; ``k`` global steps with ``Abar/k``; ``L <- W`` |
| ``delta`` | delta averaging, keeping own progress | per-rank momentum SGD on ``L`` | ``D = L - L_start``; wait previous ``Dbar``; ``W <- W + Dbar``; ``L <- W + D``; post ``D``; ``L_start <- L`` |

Adding a rule: subclass ``PeriodRule``, register it in ``PERIOD_RULES``, and add the
same rule, written independently from the spec, to ``ssdmpi/algos/reference.py``.
"""

from __future__ import annotations

from ssdmpi import backend


class PeriodRule:
    """Base: the double buffer and the request in flight. ``algo`` is the ``SSDPeriod`` owner.

    Contract: ``begin()`` at the switch (``L`` has just been set to ``W``); ``step(g, m)``
    once per delay iteration after the gradient; ``drain()`` completes the request in flight
    and holds its (averaged) result; ``apply_held()`` applies a held result now;
    ``state_dict()``/``load_state_dict()``; ``local_lr(t)`` for rules without ``--local-update``.
    """

    name = "base"
    uses_local_update = False

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
        backend.synchronize()
        return self.a.comm.allreduce_start(buf, average=True)

    def drain(self) -> None:
        if self._handle is not None:
            self._handle.wait()
            self._handle = None
            self._held = True

    def _swap_in(self, handle) -> None:
        """``_acc`` was just posted as ``handle``: it becomes the in-flight buffer."""
        self._acc, self._other = self._other, self._acc
        self._handle = handle

    def apply_held(self) -> None:
        if self._held:
            self._apply(self._other)
            self._held = False

    def _apply(self, reduced) -> None:
        raise NotImplementedError

    def reset_inflight(self) -> None:
        self._handle, self._held = None, False

    def state_dict(self) -> dict:
        d = {"acc": self._acc, "held": int(self._held)}
        if self._held:
            d["reduced"] = self._other
        return d

    def load_state_dict(self, d: dict) -> None:
        xp = self.a.xp
        self._handle = None
        self._acc[...] = xp.asarray(d["acc"])
        self._held = bool(int(d["held"]))
        if self._held:
            self._other[...] = xp.asarray(d["reduced"])


class GradientReplay(PeriodRule):
    """``replay``: accumulate the period's mean gradients, replay them as ``k`` global steps.

    Per iteration ``m``: ``A <- g`` if ``m % k == 0`` else ``A <- A + g``; then the local
    update (section 4) ``L <- local(L, g, m)``. At the period's end: post
    ``Iallreduce(mean, A)``; wait for the previous period's request, giving
    ``Abar = mean_r A_r``; ``k`` times: ``M, W <- global update with Abar/k`` (``s += 1``
    each, ``eta_g(s)`` each); ``L <- W``. The first period end has nothing to apply.
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

    def _apply(self, reduced) -> None:
        a = self.a
        reduced /= a.k
        for _ in range(a.k):
            a.global_sgd.step(a.W, a.M, reduced, a.schedule(a.s))
            a.s += 1


class DeltaAveraging(PeriodRule):
    """``delta``: average the ranks' displacements over a period, keep the rank's own progress.

    Per iteration: SGD with a per-rank momentum ``V`` (initialised to ``M`` at the switch)
    at the global lr of iteration ``t``: ``V <- mu*V - eta_g(t)*(lam*mask*L + g); L <- L + V``.
    At the period's end: ``D = L - L_start``; wait for the previous period's request,
    ``Dbar = mean_r D_r``: ``W <- W + Dbar``, ``s += k``; ``L <- W + D`` (the own displacement
    still in flight); post ``Iallreduce(mean, D)``; ``L_start <- L``.
    """

    name = "delta"
    uses_local_update = False

    def begin(self) -> None:
        a = self.a
        self.V = a.M.copy()
        self.L_start = a.L.copy()

    def step(self, g, m: int) -> None:
        a = self.a
        a.global_sgd.step(a.L, self.V, g, a.schedule(a.t))
        if (m + 1) % a.k == 0:
            D = self._acc
            a.xp.subtract(a.L, self.L_start, out=D)
            self.drain()
            self.apply_held()
            a.xp.add(a.W, D, out=a.L)
            self._swap_in(self._post(D))
            self.L_start[...] = a.L

    def _apply(self, reduced) -> None:
        a = self.a
        a.W += reduced
        a.s += a.k

    def state_dict(self) -> dict:
        d = super().state_dict()
        d.update({"V": self.V, "L_start": self.L_start})
        return d

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self.V[...] = self.a.xp.asarray(d["V"])
        self.L_start[...] = self.a.xp.asarray(d["L_start"])


PERIOD_RULES = {"replay": GradientReplay, "delta": DeltaAveraging}
DEFAULT_PERIOD_RULE = "replay"
