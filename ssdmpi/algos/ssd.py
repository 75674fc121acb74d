"""``--algo ssd``: SSD-SGD on MPI, the delay stage with ``--comm step`` (5a) or ``--comm period`` (5b).

Scaling: ``g`` below is this rank's MEAN gradient (``model.grads``, ALGORITHM.md's ``g/B``);
the allreduce averages it over ranks, which gives ALGORITHM.md's ``G/(B*N)``.
"""

from __future__ import annotations

import functools

from ssdmpi.algos import auto_delay
from ssdmpi.algos.base import DELAY, DELAY_MAX, Algorithm
from ssdmpi.algos.period import PeriodRule, PeriodState
from ssdmpi.comm.compressed import DTYPES as COMM_DTYPES
from ssdmpi.errors import UserError
from ssdmpi.optim import outer
from ssdmpi.optim.local import LOCAL_LR_UPDATES, LOCAL_UPDATES, make_local_update
from ssdmpi.optim.schedules import check_schedule
from ssdmpi.spec import ALGORITHM, AlgorithmSpec, Setting
from ssdmpi.validate import number


class _SSDBase(Algorithm):
    """Local update and learning rates shared by both schedules."""

    name = "ssd"

    def __init__(self, config, model, communicator, parts):
        self.local = None
        self._local_sched = config.local_schedule()
        super().__init__(config, model, communicator, parts)

    def _make_local(self):
        c = self.config
        self.local = make_local_update(c.local_update, optimizer=self.optimizer, global_state=self.M,
                                       world_size=self.N, delay=self.k, weight_decay=c.weight_decay,
                                       glu_divisor=c.glu_divisor, decay_mask=self.mask)
        self.local.poll = self.poll
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
            self.optimizer.update(self.W, self.M, G, self.schedule(self.s), divisor=self.N)
            self.s += 1

    def drain(self) -> None:
        """Wait for the request in flight and apply its global update (bitwise safe, see class)."""
        if self.stage == "delay":
            self._apply_inflight()

    def _reset_inflight(self) -> None:
        self._handle = None


class SSDPeriod(_SSDBase):
    """ALGORITHM.md 5b, ``--comm period``: one allreduce per period of ``k`` iterations.

    The update rule is a ``PeriodRule`` (``ssdmpi/algos/period.py``) chosen by ``--period-rule``, built
    at the switch with the values of its own settings (``parts.rule_settings``). ``drain()`` completes
    the request in flight but HOLDS its result until the period end where the schedule applies it:
    applying it earlier would change the ``M`` and ``s`` that the remaining local steps of the period
    read, so a mid-period checkpoint would not continue bit for bit. ``finalize()`` applies a held
    result at once.

    ``--delay auto`` (``config.delay == "auto"``): ``k`` (and the rule's setting that auto chooses with
    it, ``RuleSpec.auto_chooses``, unless given) is None until the switch, where
    ``ssdmpi/algos/auto_delay.py`` chooses it from the warm-up's measurements (collective), within the
    stable region of the rule's linear map; ``delay_choice`` holds the result and ``on_delay_chosen``
    (set by the trainer) is told of it.
    """

    def __init__(self, config, model, communicator, parts):
        self.rule = None
        self.rule_spec, self.rule_settings = parts.rule, dict(parts.rule_settings)
        self.auto = config.delay == "auto"
        self.comm_dtype = config.comm_dtype or COMM_DTYPE.default
        if self.comm_dtype != COMM_DTYPE.default and model.params.dtype.str[1:] != "f4":
            raise UserError(f"--comm-dtype {self.comm_dtype} sends float32 sums compressed; this model is "
                            f"{model.params.dtype}: use --dtype float32, or --comm-dtype float32")
        super().__init__(config, model, communicator, parts)
        if self.auto:
            self.k = None
            chosen = self.rule_spec.auto_chooses
            fixed = {s.name: self.rule_settings[s.name] for s in self.rule_spec.settings
                     if s.sweep is not None and s.name != chosen}
            stable = auto_delay.stable_region(self.rule_spec.linear_map, self.optimizer.linear_momentum, chosen,
                                              fixed)
            self._meter = auto_delay.DelayMeter(hi=config.delay_max, d=self.rule_settings[chosen], stable=stable)

    # --- --delay auto: measured in the warm-up, chosen at the switch ---------------------------

    def _warmup_step(self, x, y) -> float:
        """``_ssgd_step``, timed for ``--delay auto``: the allreduce's time is what ``comm.stats``
        recorded during the step (the loop resets the stats only between steps); the rest of the
        step (forward, backward, the update) is compute, and the update is that less forward and
        backward. On a GPU the update is still running when the step returns: it lands in the next
        step's compute, before its synchronize. Without the backward overlap: ``c`` and ``T`` are
        measured apart (overlapped, each would hide part of the other)."""
        if not self.auto:
            return self._ssgd_step(x, y)
        import time

        t0, T0, fb0 = time.perf_counter(), self.comm.stats.inflight_s, self.phases.fb_s
        loss = self._ssgd_step(x, y, overlap=False)
        T = self.comm.stats.inflight_s - T0
        c = time.perf_counter() - t0 - T
        self._meter.add(c, T, c - (self.phases.fb_s - fb0))
        return loss

    def _switch(self) -> None:
        if self.auto:
            self._choose_delay()
        self._enter_delay()

    def _choose_delay(self) -> None:
        """Collective, at the switch: agree on ``k`` (auto_delay.py, with its CPU probe on a scratch
        buffer: no weight changes) and report it. With ``--comm-dtype``, the warm-up's float32
        allreduce time is scaled by the measured ratio of the compressed sum's time to float32's
        (``auto_delay.probe_ratio``), and the CPU probe sends compressed (scratch error feedback)."""
        n, dtype, compressed = self.model.grads.size, self.model.grads.dtype, self.comm_dtype != COMM_DTYPE.default

        def probe(fraction: float) -> float:
            buf = self.xp.zeros(max(1, int(fraction * n)), dtype)
            return auto_delay.probe_cpu(self.comm, buf, compressor=self.comm.compressor(self.comm_dtype, buf)
                                        if compressed else None)

        def ratio() -> float:
            buf = self.xp.zeros(n, dtype)
            return auto_delay.probe_ratio(self.comm, buf, self.comm.compressor(self.comm_dtype, buf))

        self._chosen(self._meter.choose(self.comm, self.t, probe, ratio if compressed else None))
        if self.on_delay_chosen is not None:
            self.on_delay_chosen(self.delay_choice)

    def _chosen(self, choice) -> None:
        self.delay_choice, self.k = choice, choice.k
        self.rule_settings[self.rule_spec.auto_chooses] = choice.d

    def _schedule_state(self) -> dict:
        if not self.auto:
            return {}
        return self.delay_choice.state() if self.delay_choice else self._meter.state_dict()

    def _load_schedule_state(self, d: dict) -> None:
        """``--delay auto``: the choice made before the checkpoint (kept, never re-measured), or,
        inside the warm-up, the samples measured so far."""
        if not self.auto:
            return
        if "auto.k" in d:
            self._chosen(auto_delay.DelayChoice.from_state(d))
        elif str(d.get("stage")) == "delay":
            raise UserError("the checkpoint's delay stage has no --delay auto choice in it (was it trained with "
                            "a fixed --delay?); resume with that --delay")
        else:
            self._meter.load_state_dict(d)

    # --- the delay stage ----------------------------------------------------------------------

    def _begin_delay(self) -> None:
        if self.rule_spec.uses_local_update:
            self._make_local()
        state = PeriodState(xp=self.xp, W=self.W, M=self.M, L=self.L, mask=self.mask, counts=self.counts, N=self.N,
                            k=self.k, T_w=self.T_w, schedule=self.schedule, optimizer=self.optimizer,
                            local=self.local, local_lr=self.local_lr_at, comm=self.comm, poll=self.poll,
                            comm_dtype=self.comm_dtype if self.comm_dtype != COMM_DTYPE.default else None,
                            outer=self.outer, B=self.B)
        self.rule = self.rule_spec.implementation(state, **self.rule_settings)
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

    def allreduce_window(self) -> tuple | None:
        """``(k, d, --merge delay's flag)`` for a rule with a merge delay, ``(k, k, "--delay")`` for one
        merged at the next period's end; None with ``--delay auto``."""
        if self.auto or not self.k:
            return None
        chosen = self.rule_spec.auto_chooses
        if chosen is None:
            return self.k, self.k, f"--{DELAY.flag}"
        flag = next(s.flag for s in self.rule_spec.settings if s.name == chosen)
        return self.k, self.rule_settings[chosen], f"--{flag}"

    def _shown(self) -> list:
        k = "auto" if self.auto and self.k is None else self.k
        own = [(name, "auto" if value is None and self.auto else value) for name, value in self.rule_settings.items()]
        shown = super()._shown()
        return [("k", k)] + shown[1:3] + [("rule", self.rule_spec.name)] + own + shown[3:]

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
        """The averaged state (``Algorithm``), then the period rule's own merge (``PeriodRule.resized``);
        the compressed transport's error feedback restarts (``PeriodRule.resized_transport``)."""
        state, merged = super().resized_state(ctx)
        if str(state.get("stage")) == "delay":
            k = int(state["auto.k"]) if self.auto else self.k
            merged = self.rule_spec.implementation.resized(state, k, self._outer_on_host(state)) or merged
            restarted = PeriodRule.resized_transport(state, "period.")
            merged = f"{merged}; {restarted}" if restarted else merged
        return state, merged

    def _outer_on_host(self, state: dict):
        """The outer step on the host arrays of ``state`` (a resume on another rank count), as
        ``merge(W, mean) -> W`` advancing ``state``'s buffer (zero when the checkpoint has none); None
        without an outer optimizer."""
        if self.outer is None:
            return None

        def merge(W, mean):
            import numpy as np

            W, state[outer.STATE_KEY] = self.outer.host_step(W, state.get(outer.STATE_KEY, np.zeros_like(W)), mean)
            return W
        return merge

    def _load_delay_state(self, d: dict) -> None:
        super()._load_delay_state(d)
        self.rule.load_state_dict({k[7:]: v for k, v in d.items() if k.startswith("period.")})

    def _reset_inflight(self) -> None:
        if self.rule is not None:
            self.rule.reset_inflight()


# --- the settings of ssd and its spec ---------------------------------------------------------

def _uses_local_update(run) -> bool:
    return run.comm == "step" or bool(run.rule and run.rule.uses_local_update)


def _local_update_refusal(run) -> str:
    rule = f" --comm {run.comm} --period-rule {run.period_rule}" if run.period_rule else ""
    add_comm = run.spec.uses("comm") and "comm" not in run.spec.fixed and run.given.get("comm") is None
    return (f"--local-update does not apply to --algo {run.algo}{rule}"
            + ("; it is for --comm step: add --comm step" if add_comm else "; drop it"))


def _fits_the_optimizer(run) -> None:
    """glu-paper and sgd are plain SGD steps of their own (ALGORITHM.md 4a, 4c), not the inner optimizer's:
    they fit between the global steps of an optimizer that allows them (``Optimizer.plain_local_updates``)."""
    from ssdmpi.algos import registry  # late: the registry imports this module

    spec = run.optimizer_spec
    if run.local_update in LOCAL_LR_UPDATES and spec is not None and not spec.implementation.plain_local_updates:
        fitting = registry.or_(f"--optimizer {name}" for name, s in registry.OPTIMIZERS.items()
                               if s.implementation.plain_local_updates)
        raise UserError(f"--local-update {run.local_update} is a plain SGD step of its own and does not fit "
                        f"--optimizer {run.optimizer}'s global steps; use --local-update global-momentum (the "
                        f"{run.optimizer} step with the global state), or {fitting}")


def _with_local_update(registry) -> str:
    return "--comm step or " + registry.or_(f"--period-rule {r}" for r, s in registry.RULES.items()
                                            if s.uses_local_update)


COMM = Setting("comm", "period", "communication schedule of ssd", choices=("step", "period"), group=ALGORITHM,
               structural=True, bench_tag="{}")
# Its choices and default are the rules the registry finds (``RuleSpec.default``).
PERIOD_RULE = Setting("period_rule", None, "update rule of --comm period", metavar="RULE", group=ALGORITHM,
                      applies=lambda run: run.comm == "period", where="--algo ssd --comm period", structural=True)
LOCAL_UPDATE = Setting("local_update", "global-momentum", "local update of the delay stage", choices=LOCAL_UPDATES,
                       group=ALGORITHM, applies=_uses_local_update, refusal=_local_update_refusal, structural=True,
                       where=_with_local_update, context_check=_fits_the_optimizer)
LOCAL_LR = Setting("local_lr", None, "local learning rate of --local-update glu-paper and sgd", float,
                   functools.partial(number, low=0.0, strict=True), group=ALGORITHM,
                   applies=lambda run: run.local_update in LOCAL_LR_UPDATES,
                   where="--local-update " + " or ".join(LOCAL_LR_UPDATES), default_text="world size x lr",
                   derive=lambda run, world_size: None if world_size is None else world_size * run.lr)
LOCAL_LR_SCHEDULE = Setting("local_lr_schedule", None, "schedule of the local lr", check=check_schedule,
                            metavar="SPEC", group=ALGORITHM, applies=lambda run: run.local_update in LOCAL_LR_UPDATES,
                            where="--local-update " + " or ".join(LOCAL_LR_UPDATES),
                            default_text="the global schedule's shape")
GLU_DIVISOR = Setting("glu_divisor", 12.0, "divisor C of --local-update glu-paper", float,
                      functools.partial(number, low=0.0, strict=True), metavar="C", group=ALGORITHM,
                      applies=lambda run: run.local_update == "glu-paper", where="--local-update glu-paper")
COMM_DTYPE = Setting("comm_dtype", "float32", "what --comm period's sums travel as: float32 (the model's dtype), "
                     "bfloat16 or float16 (casts), int8 (blocks of 256 with a float32 scale each); summed in "
                     "float32, the same on every rank, with error feedback (docs/ALGORITHM.md, compressed "
                     "transport)", choices=COMM_DTYPES, group=ALGORITHM, applies=lambda run: run.comm == "period",
                     where="--algo ssd --comm period", structural=True)
SETTINGS = (DELAY, DELAY_MAX, COMM, PERIOD_RULE, COMM_DTYPE, *outer.SETTINGS, LOCAL_UPDATE, LOCAL_LR, LOCAL_LR_SCHEDULE,
            GLU_DIVISOR)


def _auto_applies(run, world_size) -> None:
    """``--delay auto`` chooses a period and the merge delay that hides its allreduce: it needs a period
    rule with one (``RuleSpec.auto_chooses``); with ``--comm step`` nothing is in flight across steps."""
    from ssdmpi.algos import registry  # late: the registry imports this module

    if run.delay != "auto" or (run.rule is not None and run.rule.auto_chooses):
        return
    if run.comm == "step":
        raise UserError("--delay auto does not apply to --comm step (it sends every step, overlapped with one "
                        "step: k does not hide it); give a fixed --delay K, or use --comm period")
    with_one = registry.or_(f"--period-rule {r}" for r, s in registry.RULES.items() if s.auto_chooses)
    raise UserError(f"--delay auto chooses the period and the merge delay of {with_one}; --period-rule "
                    f"{run.period_rule} has no merge delay: give a fixed --delay K, or use {with_one}")


def _twin(cfg, rule) -> str:
    return "ssdmpi.verify.reference:StepTwin" if cfg.comm == "step" else rule.reference


def _implementation(cfg) -> str:
    return f"ssdmpi.algos.ssd:{'SSDStep' if cfg.comm == 'step' else 'SSDPeriod'}"


def _outer_step(run) -> bool:
    """The merges of ``--comm period`` with a rule whose merge adds the ranks' mean displacement to ``W``."""
    return run.comm == "period" and run.rule is not None and run.rule.outer_step


SPEC = AlgorithmSpec("ssd", _implementation, _twin,
                     lambda cfg, workers: f"ssd (k={cfg.delay}, comm {cfg.comm}, warm-up {cfg.warmup_steps} steps"
                                          f"{outer.describe(cfg)})",
                     settings=SETTINGS,
                     inspect=lambda cfg: f"comm {cfg.get('comm')}, k={cfg.get('delay')}{outer.describe(cfg)}",
                     label=("{comm}", "k={delay}"), bench=("comm", "delay"),
                     variants={f"step/{u}": {"comm": "step", "local_update": u} for u in LOCAL_UPDATES},
                     rule_variant=lambda rule: (f"period/{rule.name}",
                                                {"comm": "period", "period_rule": rule.name, **rule.variant}),
                     accuracy_defaults=("step/global-momentum",), check=_auto_applies, default=True,
                     pattern=lambda cfg: ("period", cfg.delay) if cfg.comm == "period" else ("step", 1),
                     outer_step=_outer_step)
