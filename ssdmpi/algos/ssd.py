"""SSD-SGD (and OD-SGD) on MPI: the delay stage with ``--comm step`` (5a) or ``--comm period`` (5b).

Scaling: ``g`` below is this rank's MEAN gradient (``model.grads``, ALGORITHM.md's ``g/B``);
the allreduce averages it over ranks, which gives ALGORITHM.md's ``G/(B*N)``.
"""

from __future__ import annotations

from ssdmpi.algos.base import Algorithm
from ssdmpi.algos.period import PeriodState
from ssdmpi.algos.registry import RULES
from ssdmpi.optim.local import make_local_update


class _SSDBase(Algorithm):
    """Local update and learning rates shared by both schedules."""

    name = "ssd"

    def __init__(self, config, model, communicator):
        self.local = None
        self._local_sched = config.local_schedule()
        super().__init__(config, model, communicator)

    def _make_local(self):
        c = self.config
        self.local = make_local_update(c.local_update, M=self.M, world_size=self.N, delay=self.k,
                                       momentum=c.momentum, weight_decay=c.weight_decay,
                                       glu_divisor=c.glu_divisor, decay_mask=self.mask)
        self.local._plan.poll = self.poll
        self.local.begin(self.L)

    def local_lr_at(self, t: int) -> float:
        """``eta_g(t)`` for global-momentum; for glu-paper/sgd ``eta_l``: ``local_lr * factor(t)``
        (the global schedule's shape at iteration t), or the explicit local schedule at ``m``."""
        if self.local is not None and self.local.uses_local_lr:
            if self._local_sched is not None:
                return self._local_sched(t - self.T_w)
            return self.config.local_lr * self.schedule.factor(t)
        return self.schedule(t)

    def _delay_state(self) -> dict:
        return {f"local.{k}": v for k, v in self.local.state_dict().items()} if self.local else {}

    def _load_delay_state(self, d: dict) -> None:
        if self.local is not None:
            self.local.load_state_dict({k[6:]: v for k, v in d.items() if k.startswith("local.")})


class SSDStep(_SSDBase):
    """ALGORITHM.md 5a, ``--comm step``. Iteration ``t >= T_w``, ``m = t - T_w``::

        g_t = mean gradient on L                                  (model.loss_and_grad)
        post Iallreduce(sum, g_t) into buffer t%2                 (nobody touches it until done)
        wait for the request of t-1; M, W <- global update with it / N; s += 1
        if m % k == 0: L <- W                                     (t-1 was a pull iteration)
        L <- local update(L, g_t, m)

    The post of ``g_t`` is bucketed and overlapped with the backward pass that produces it
    (``backward_allreduce``, ssdmpi/algos/overlap.py: each bucket is copied into buffer t%2 and
    posted as soon as backward has finished its layers); the wait for ``t-1`` still comes after
    the last of them, as above. Two gradient buffers alternate: one in flight, one being
    posted. ``drain()`` waits for the request in flight and applies its global update at once:
    nothing reads ``W``, ``M`` or ``s`` between the end of iteration ``t`` and step 3 of
    iteration ``t+1``, so draining and continuing is bitwise the same trajectory as not draining.
    """

    def _begin_delay(self) -> None:
        self._make_local()
        self._bufs = (self.xp.zeros_like(self.W), self.xp.zeros_like(self.W))
        self._handle = None

    def _delay_step(self, x, y) -> float:
        m = self.t - self.T_w
        self.backward_allreduce.start(self._bufs[self.t % 2])   # sums: the global update divides
        loss = self._loss_and_grad(x, y)
        g = self.model.grads
        pending = self.backward_allreduce.finish()
        self._apply_inflight()
        self._handle = pending
        if m % self.k == 0:
            self.L[...] = self.W
        self.local.step(self.L, g, m, self.local_lr_at(self.t))
        return loss

    def _apply_inflight(self) -> None:
        if self._handle is not None:
            G = self._handle.wait()
            self._handle = None
            self.global_sgd.step(self.W, self.M, G, self.schedule(self.s), divisor=self.N)
            self.s += 1

    def drain(self) -> None:
        """Wait for the request in flight and apply its global update (bitwise safe, see class)."""
        if self.stage == "delay":
            self._apply_inflight()

    def _reset_inflight(self) -> None:
        self._handle = None


class ODSGD(SSDStep):
    """``--algo odsgd``: OD-SGD, ``ssd`` with ``k = 1`` and ``--comm step``."""

    name = "odsgd"


class SSDPeriod(_SSDBase):
    """ALGORITHM.md 5b, ``--comm period``: one allreduce per period of ``k`` iterations.

    The update rule is a ``PeriodRule`` (``ssdmpi/algos/period.py``) chosen by
    ``--period-rule``. ``drain()`` completes the request in flight but HOLDS its result
    until the period end where the schedule applies it: applying it earlier would change
    the ``M`` and ``s`` that the remaining local steps of the period read, so a mid-period
    checkpoint would not continue bit for bit. ``finalize()`` applies a held result at once.
    """

    def __init__(self, config, model, communicator):
        self.rule = None
        self.rule_spec = RULES[config.period_rule]
        super().__init__(config, model, communicator)

    def _begin_delay(self) -> None:
        if self.rule_spec.uses_local_update:
            self._make_local()
        c = self.config
        state = PeriodState(xp=self.xp, W=self.W, M=self.M, L=self.L, mask=self.mask, counts=self.counts, N=self.N,
                            k=self.k, d=self.d, T_w=self.T_w, momentum=c.momentum, weight_decay=c.weight_decay,
                            schedule=self.schedule, global_sgd=self.global_sgd, local=self.local,
                            local_lr=self.local_lr_at, comm=self.comm, poll=self.poll,
                            merge_momentum=getattr(c, "merge_momentum", None) or 0.0)
        self.rule = self.rule_spec.implementation(state)
        self.rule.begin()

    def _delay_step(self, x, y) -> float:
        m = self.t - self.T_w
        loss = self._loss_and_grad(x, y)
        self.rule.step(self.model.grads, m)
        return loss

    def local_lr_at(self, t: int) -> float:
        if self.rule is not None and not self.rule_spec.uses_local_update:
            return self.rule.local_lr(t)
        return super().local_lr_at(t)

    @property
    def lr_global(self) -> float:
        """A rule without a local update (delta-own) steps only with ``eta_g(t)`` in the delay stage
        (``W`` gets displacements, no lr): that is the lr reported. Replay: ``eta_g(s)``."""
        if self.rule is not None and not self.rule_spec.uses_local_update:
            return self.rule.local_lr(self.t)
        return self.schedule(self.s)

    def drain(self) -> None:
        if self.rule is not None:
            self.rule.drain()

    def finalize(self) -> None:
        if self.rule is not None:
            self.rule.finalize()

    def _delay_state(self) -> dict:
        d = super()._delay_state()
        d.update({f"period.{k}": v for k, v in self.rule.state_dict().items()})
        return d

    def _replicated_delay(self) -> tuple:
        return tuple(f"period.{k}" for k in self.rule.replicated())

    def resized_state(self, ctx) -> tuple[dict, str]:
        """The averaged state (``Algorithm``), then the period rule's own merge (``PeriodRule.resized``)."""
        state, merged = super().resized_state(ctx)
        if str(state.get("stage")) == "delay":
            k = int(state["auto.k"]) if self.auto else self.k
            merged = self.rule_spec.implementation.resized(state, k) or merged
        return state, merged

    def _load_delay_state(self, d: dict) -> None:
        super()._load_delay_state(d)
        self.rule.load_state_dict({k[7:]: v for k, v in d.items() if k.startswith("period.")})

    def _reset_inflight(self) -> None:
        if self.rule is not None:
            self.rule.reset_inflight()
