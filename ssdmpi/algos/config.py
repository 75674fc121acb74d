"""``AlgoConfig``: the settings of one training algorithm, checked by ``validate()``.

Optional fields are ``None`` when the user did not set them, so that a setting that
does not apply to the chosen algorithm can be rejected (``--comm step`` with
``localsgd``) while the algorithm's own defaults still apply (``odsgd`` means ``k = 1``).
``validate(world_size)`` returns a *resolved* copy with every default filled in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ssdmpi.errors import UserError
from ssdmpi.optim.local import LOCAL_UPDATES
from ssdmpi.optim.schedules import LRSchedule
from ssdmpi.validate import choice, is_int, nonnegative_int, number

ALGOS = ("ssgd", "ssd", "odsgd", "localsgd", "asgd")
COMMS = ("step", "period")
ASGD_ORDERS = ("arrival", "round-robin")   # asgd: pushes applied as they arrive, or in worker order (tests)
# asgd: the lr of each push: the global lr, or the global lr / (1 + the push's staleness) (ALGORITHM.md 11)
ASGD_RATES = ("plain", "staleness")
DEFAULT_ASGD_RATE = "staleness"
DEFAULT_SERVERS = 1
# The sparsified schedule is the default: its rule delta-merge (docs/PERIOD_RULE.md) keeps W
# within a point of SSGD on the reference tasks at k = 5 and 10 (docs/ACCURACY.md).
DEFAULT_COMM = "period"
DEFAULT_DELAY = 5
DEFAULT_LOCAL_UPDATE = "global-momentum"
DEFAULT_GLU_DIVISOR = 12.0
DEFAULT_MERGE_DELAY = 1


def period_rules() -> dict:
    """``{name: rule class}`` of ``--comm period`` (see ``ssdmpi/algos/period.py``)."""
    from ssdmpi.algos.period import PERIOD_RULES
    return PERIOD_RULES


def default_period_rule() -> str:
    from ssdmpi.algos.period import DEFAULT_PERIOD_RULE
    return DEFAULT_PERIOD_RULE


@dataclass
class AlgoConfig:
    """Every setting ``build_algorithm`` needs (ALGORITHM.md sections 1-5).

    Lengths are in iterations (the trainer converts epochs). ``lr_schedule`` is a kind
    name (``constant``, ``step``, ``multistep``, ``cosine``, ``poly``) or a dict
    ``{"kind": ..., "every"/"milestones"/"gamma"/"power": ...}`` in global steps (see
    ``ssdmpi.optim.schedules``). The local lr (``glu-paper``, ``sgd``) is ``local_lr *
    factor(t)`` where ``factor`` is the global schedule's shape at iteration ``t``, unless
    ``local_lr_schedule`` is given: then it is that schedule (base ``local_lr``) at the
    local-update counter ``m``.
    """

    algo: str = "ssd"                     # ssgd | ssd | odsgd | localsgd | asgd
    delay: int | str | None = None        # k, or "auto" (auto_delay.py); None: 5 (ssd, localsgd), 1 (odsgd)
    delay_max: int | None = None          # the largest k of --delay auto; None: DELAY_RANGE[1] (32)
    warmup_steps: int = 500               # T_w: SSGD iterations before the delay stage
    comm: str | None = None               # step | period (ssd); None: DEFAULT_COMM for ssd, step for odsgd
    period_rule: str | None = None        # rule of --comm period; None: DEFAULT_PERIOD_RULE
    merge_delay: int | None = None        # d of a rule that merges d steps after posting (delta-merge); None: 1
    local_update: str | None = None       # global-momentum | glu-paper | sgd; None: global-momentum
    lr: float = 0.1                       # base global learning rate eta_g
    lr_schedule: object = "constant"      # kind name or dict (steps)
    lr_warmup_steps: int = 0              # linear warm-up of the global lr (steps)
    total_steps: int | None = None        # run length, for cosine and poly
    local_lr: float | None = None         # base eta_l (glu-paper, sgd); None: world_size * lr
    local_lr_schedule: object = None      # None: follow the global schedule's shape at t
    momentum: float = 0.9                 # mu
    weight_decay: float = 1e-4            # lam (weights and BN gamma only)
    glu_divisor: float | None = None      # C (glu-paper); None: 12
    servers: int | None = None            # asgd: parameter-server ranks (the last ones); None: 1
    asgd_order: str | None = None         # asgd: arrival | round-robin; None: arrival
    asgd_rate: str | None = None          # asgd: plain | staleness; None: DEFAULT_ASGD_RATE

    # --- what each algorithm uses -----------------------------------------------------

    def uses_local_update(self) -> bool:
        """True when ``local_update`` means something: ssd/odsgd with --comm step or a rule that uses it."""
        if self.algo not in ("ssd", "odsgd"):
            return False
        comm = (self.comm or DEFAULT_COMM) if self.algo == "ssd" else "step"
        if comm == "step":
            return True
        rule = period_rules().get(self.period_rule or default_period_rule())
        return bool(rule is not None and rule.uses_local_update)

    def validate(self, world_size: int | None = None) -> AlgoConfig:
        """Check every field; return a resolved copy (defaults filled in). ``UserError`` on nonsense.

        ``world_size`` is needed to resolve the default local lr (``world_size * lr``).
        """
        a = self.algo
        choice("algo", a, ALGOS)
        number("lr", self.lr, low=0.0, strict=True)
        number("momentum", self.momentum, low=0.0, high=1.0, high_open=True)
        number("weight-decay", self.weight_decay, low=0.0)
        nonnegative_int("warmup-steps", self.warmup_steps)
        if self.delay is not None and self.delay != "auto" and (not is_int(self.delay) or self.delay < 1):
            raise UserError(f"--delay must be an integer >= 1 (iterations between pulls of the global model) "
                            f"or auto, got {self.delay!r}")
        if self.comm is not None:
            choice("comm", self.comm, COMMS)
        if a == "asgd" or self.servers is not None or self.asgd_order is not None or self.asgd_rate is not None:
            return self._validate_asgd(world_size)
        if a == "ssgd" and self.delay is not None:
            raise UserError("--delay does not apply to --algo ssgd (blocking allreduce every step); drop it")
        if a in ("ssgd", "localsgd") and self.comm is not None:
            what = "averages models every --delay steps, blocking" if a == "localsgd" else "blocks every step"
            raise UserError(f"--comm {self.comm} does not apply to --algo {a} (it {what}); drop --comm")
        if a == "odsgd" and self.delay not in (None, 1):
            raise UserError(f"--algo odsgd is ssd with --delay 1 --comm step; got --delay {self.delay} "
                            "(use --algo ssd for other delays)")
        if a == "odsgd" and self.comm not in (None, "step"):
            raise UserError("--algo odsgd is ssd with --delay 1 --comm step; use --algo ssd --comm period instead")
        comm = (self.comm or DEFAULT_COMM) if a == "ssd" else ("step" if a == "odsgd" else None)
        rules = period_rules()
        if self.period_rule is not None:
            if comm != "period":
                raise UserError("--period-rule applies only to --algo ssd --comm period; drop it")
            choice("period-rule", self.period_rule, tuple(rules))
        rule = (self.period_rule or default_period_rule()) if comm == "period" else None
        delay = self.delay or (1 if a == "odsgd" else DEFAULT_DELAY if a != "ssgd" else None)
        if delay == "auto":
            _check_auto_applies(a, comm, rule)
            _check_auto_warmup(self.warmup_steps)
        resolved = dataclasses.replace(self, comm=comm, period_rule=rule, delay=delay,
                                       delay_max=_delay_max(self.delay_max, delay),
                                       merge_delay=_merge_delay(self.merge_delay, rule, delay))
        uses_local = resolved.uses_local_update()
        if self.local_update is not None:
            choice("local-update", self.local_update, LOCAL_UPDATES)
            if not uses_local:
                hint = "; it is for --comm step: add --comm step" if a == "ssd" and self.comm is None else "; drop it"
                raise UserError(f"--local-update does not apply to --algo {a}"
                                + (f" --comm period --period-rule {rule}" if rule else "") + hint)
        local = (self.local_update or DEFAULT_LOCAL_UPDATE) if uses_local else None
        wants_local_lr = local in ("glu-paper", "sgd")
        for name, value in (("local-lr", self.local_lr), ("local-lr-schedule", self.local_lr_schedule)):
            if value is not None and not wants_local_lr:
                raise UserError(f"--{name} applies only to --local-update glu-paper or sgd; drop it")
        if self.local_lr is not None:
            number("local-lr", self.local_lr, low=0.0, strict=True)
        if self.glu_divisor is not None:
            if local != "glu-paper":
                raise UserError("--glu-divisor applies only to --local-update glu-paper; drop it")
            number("glu-divisor", self.glu_divisor, low=0.0, strict=True)
        local_lr = self.local_lr
        if wants_local_lr and local_lr is None:
            if world_size is None:
                raise ValueError("world_size is needed to resolve the default local lr")
            local_lr = world_size * self.lr
        if not is_int(self.lr_warmup_steps) or self.lr_warmup_steps < 0:
            raise UserError(f"lr warm-up must be an integer number of steps >= 0, got {self.lr_warmup_steps!r}")
        resolved = dataclasses.replace(resolved, local_update=local, local_lr=local_lr,
                                       glu_divisor=(self.glu_divisor or DEFAULT_GLU_DIVISOR) if local == "glu-paper"
                                       else None)
        resolved.global_schedule()
        resolved.local_schedule()
        return resolved

    def _validate_asgd(self, world_size: int | None) -> AlgoConfig:
        """``--algo asgd`` (docs/ALGORITHM.md section 11): only the global optimizer's settings apply."""
        if self.algo != "asgd":
            flag = next(name for name in ("servers", "asgd_order", "asgd_rate") if getattr(self, name) is not None)
            raise UserError(f"--{flag.replace('_', '-')} applies only to --algo asgd; drop it")
        for name in ("delay", "delay_max", "comm", "period_rule", "merge_delay", "local_update", "local_lr",
                     "local_lr_schedule", "glu_divisor"):
            if getattr(self, name) is not None:
                raise UserError(f"--{name.replace('_', '-')} does not apply to --algo asgd "
                                "(a parameter server applying each push); drop it")
        servers = DEFAULT_SERVERS if self.servers is None else self.servers
        if not is_int(servers) or servers < 1:
            raise UserError(f"--servers must be an integer >= 1 (parameter-server ranks), got {servers!r}")
        if self.asgd_order is not None:
            choice("asgd-order", self.asgd_order, ASGD_ORDERS)
        if self.asgd_rate is not None:
            choice("asgd-rate", self.asgd_rate, ASGD_RATES)
        if world_size is not None and world_size <= servers:
            raise UserError(f"--algo asgd with --servers {servers} needs at least {servers + 1} ranks (the servers "
                            f"and at least one worker), got {world_size}; run more ranks or use fewer --servers")
        if not is_int(self.lr_warmup_steps) or self.lr_warmup_steps < 0:
            raise UserError(f"lr warm-up must be an integer number of steps >= 0, got {self.lr_warmup_steps!r}")
        resolved = dataclasses.replace(self, servers=int(servers), asgd_order=self.asgd_order or ASGD_ORDERS[0],
                                       asgd_rate=self.asgd_rate or DEFAULT_ASGD_RATE)
        resolved.global_schedule()
        return resolved

    # --- derived objects (on a resolved config) ----------------------------------------

    def global_schedule(self) -> LRSchedule:
        """``eta_g``: the global lr schedule, over global steps ``s`` (local rules evaluate it at ``t``)."""
        return LRSchedule.from_spec(self.lr, self.lr_schedule, total_steps=self.total_steps,
                                    warmup_steps=self.lr_warmup_steps)

    def local_schedule(self) -> LRSchedule | None:
        """The explicit local schedule over ``m`` (base ``local_lr``), or None (follow the global shape)."""
        if self.local_lr_schedule is None or self.local_lr is None:
            return None
        return LRSchedule.from_spec(self.local_lr, self.local_lr_schedule,
                                    total_steps=None if self.total_steps is None
                                    else max(1, self.total_steps - self.warmup_steps))

    def to_dict(self) -> dict:
        """Plain mapping (schedule dicts are rendered with ``repr`` so every value is a scalar)."""
        d = dataclasses.asdict(self)
        for key in ("lr_schedule", "local_lr_schedule"):
            if isinstance(d[key], dict):
                d[key] = repr(sorted(d[key].items()))
        return d


def _delay_max(delay_max, delay) -> int | None:
    """The resolved ``--delay-max``: the cap of ``--delay auto`` (default ``DELAY_RANGE[1]``), None
    with a fixed delay; ``UserError`` when it is set without ``--delay auto`` or is not a k."""
    from ssdmpi.algos.auto_delay import DELAY_RANGE

    if delay_max is None:
        return DELAY_RANGE[1] if delay == "auto" else None
    if delay != "auto":
        raise UserError("--delay-max applies only to --delay auto (it caps the k auto chooses); drop it")
    if not is_int(delay_max) or delay_max < DELAY_RANGE[0]:
        raise UserError(f"--delay-max must be an integer >= {DELAY_RANGE[0]} (the largest k --delay auto may "
                        f"choose), got {delay_max!r}")
    return int(delay_max)


def _merge_delay(merge_delay, rule, delay) -> int | None:
    """The resolved ``--merge-delay`` d: the rule's (``uses_merge_delay``) setting in ``1..k``, default
    ``DEFAULT_MERGE_DELAY`` (None with ``--delay auto``: chosen with k); None for other rules."""
    uses = rule is not None and period_rules()[rule].uses_merge_delay
    if merge_delay is None:
        return DEFAULT_MERGE_DELAY if uses and delay != "auto" else None
    if not uses:
        raise UserError("--merge-delay applies only to --comm period --period-rule delta-merge; drop it")
    if not is_int(merge_delay) or merge_delay < 1:
        raise UserError(f"--merge-delay must be an integer >= 1 (iterations from posting a period's sum to "
                        f"merging it), got {merge_delay!r}")
    if delay != "auto" and merge_delay > delay:
        raise UserError(f"--merge-delay {merge_delay} is longer than the period --delay {delay}: a period's sum "
                        "must be merged before the next one is posted; use --merge-delay <= --delay")
    return int(merge_delay)


def _check_auto_applies(algo: str, comm: str | None, rule: str | None) -> None:
    """``--delay auto`` chooses the period and the merge delay of ``--comm period`` with a rule that
    has one (delta-merge); elsewhere there is no merge delay to hide the allreduce behind."""
    if algo == "localsgd":
        raise UserError("--delay auto does not apply to --algo localsgd (its averaging blocks: there is no "
                        "allreduce in flight to hide); give a fixed --delay K")
    if comm == "step":
        raise UserError("--delay auto does not apply to --comm step (it sends every step, overlapped with one "
                        "step: k does not hide it); give a fixed --delay K, or use --comm period")
    if rule is not None and not period_rules()[rule].uses_merge_delay:
        raise UserError(f"--delay auto chooses the period and the merge delay of --period-rule delta-merge; "
                        f"--period-rule {rule} has no merge delay: give a fixed --delay K, or use delta-merge")


def _check_auto_warmup(warmup_steps: int) -> None:
    """``--delay auto`` measures in the SSGD warm-up: it needs enough warm-up steps to measure."""
    from ssdmpi.algos.auto_delay import MIN_WARMUP_STEPS

    if warmup_steps < MIN_WARMUP_STEPS:
        raise UserError(f"--delay auto measures compute and allreduce times during the SSGD warm-up and needs "
                        f"--warmup-steps >= {MIN_WARMUP_STEPS} (got {warmup_steps}); lengthen the warm-up "
                        "(--warmup-steps or --warmup-epochs) or give a fixed --delay K")
