"""Learning-rate schedules: pure functions of a step counter, evaluated on the host.

``LRSchedule(base_lr, kind, ...)(s)`` is the learning rate at 0-based step ``s``.
All lengths are in the schedule's own steps (global steps ``s`` for the global lr,
iterations ``t`` or local updates ``m`` for a local lr; see ``ssdmpi/algos``). The
trainer converts epochs to steps.

| kind | ``lr(s)`` after the linear warm-up (``p = (s - w)/(total - w)`` clipped to [0, 1]) |
|---|---|
| ``constant`` | ``base`` |
| ``step`` | ``base * gamma ** (s // every)`` |
| ``multistep`` | ``base * gamma ** (number of milestones <= s)`` |
| ``cosine`` | ``base * 0.5 * (1 + cos(pi * p))`` |
| ``poly`` | ``base * (1 - p) ** power`` (power 2 by default: the published ImageNet setting) |

Linear warm-up (``warmup_steps = w > 0``): ``lr(s) = base * (s + 1) / w`` for ``s < w`` — the
first step already moves (``s/w`` would waste it), step ``w-1`` reaches ``base``. ``step``
and ``multistep`` count ``s`` from 0 (milestones are absolute), ``cosine``/``poly`` decay
over the steps after the warm-up and need ``total_steps``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from ssdmpi.errors import UserError
from ssdmpi.spec import OPTIMIZER, Setting
from ssdmpi.validate import number

KINDS = ("constant", "step", "multistep", "cosine", "poly")


@dataclass(frozen=True)
class LRSchedule:
    """A learning-rate schedule; call it with a step counter. Immutable, so safe to share."""

    base_lr: float
    kind: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None      # cosine, poly
    every: int | None = None            # step
    milestones: tuple = field(default=())   # multistep, increasing
    gamma: float = 0.1                  # step, multistep
    power: float = 2.0                  # poly

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """``UserError`` (one line) when the settings cannot define a schedule."""
        if self.kind not in KINDS:
            raise UserError(f"unknown lr schedule {self.kind!r}; choose one of {', '.join(KINDS)}")
        if not (isinstance(self.base_lr, (int, float)) and math.isfinite(self.base_lr) and self.base_lr > 0):
            raise UserError(f"learning rate must be a finite number > 0, got {self.base_lr!r}")
        if int(self.warmup_steps) != self.warmup_steps or self.warmup_steps < 0:
            raise UserError(f"lr warm-up must be a whole number of steps >= 0, got {self.warmup_steps!r}")
        if self.kind in ("cosine", "poly"):
            if self.total_steps is None or self.total_steps <= self.warmup_steps:
                raise UserError(f"lr schedule {self.kind} needs a run length longer than its lr warm-up "
                                f"(total {self.total_steps}, warm-up {self.warmup_steps})")
            if self.kind == "poly" and not self.power > 0:
                raise UserError(f"poly lr schedule needs a power > 0, got {self.power!r}")
        if self.kind == "step" and (self.every is None or self.every < 1):
            raise UserError(f"step lr schedule needs a step length >= 1, got {self.every!r}")
        if self.kind == "multistep":
            ms = list(self.milestones)
            if not ms or ms != sorted(ms) or ms[0] < 0:
                raise UserError(f"multistep lr schedule needs increasing milestones >= 0, got {ms!r}")
        if self.kind in ("step", "multistep") and not self.gamma > 0:
            raise UserError(f"lr decay factor gamma must be > 0, got {self.gamma!r}")

    def factor(self, s: int) -> float:
        """``lr(s) / base_lr``: the schedule's shape at step ``s`` (a local lr may follow it)."""
        s = int(s)
        w = int(self.warmup_steps)
        if s < w:
            return (s + 1) / w
        if self.kind == "constant":
            return 1.0
        if self.kind == "step":
            return self.gamma ** (s // int(self.every))
        if self.kind == "multistep":
            return self.gamma ** sum(1 for m in self.milestones if s >= m)
        p = min(1.0, max(0.0, (s - w) / (int(self.total_steps) - w)))
        if self.kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * p))
        return (1.0 - p) ** self.power

    def __call__(self, s: int) -> float:
        """The learning rate at 0-based step ``s``."""
        return self.base_lr * self.factor(s)

    @classmethod
    def from_spec(cls, base_lr: float, spec, total_steps: int | None = None, warmup_steps: int = 0) -> LRSchedule:
        """Build from a kind name (``"cosine"``) or a dict ``{"kind": ..., options in steps}``.

        Dict keys: ``kind``, ``every``, ``milestones``, ``gamma``, ``power``, ``warmup_steps``,
        ``total_steps`` (the last two override the arguments).
        """
        if isinstance(spec, LRSchedule):
            return spec
        if isinstance(spec, str):
            spec = {"kind": spec}
        if not isinstance(spec, dict) or "kind" not in spec:
            raise UserError(f"lr schedule must be a kind name or a mapping with a 'kind', got {spec!r}")
        options = dict(spec)
        unknown = set(options) - {"kind", "every", "milestones", "gamma", "power", "warmup_steps", "total_steps"}
        if unknown:
            raise UserError(f"unknown lr schedule option {sorted(unknown)[0]!r}")
        options.setdefault("total_steps", total_steps)
        options.setdefault("warmup_steps", warmup_steps)
        if "milestones" in options:
            options["milestones"] = tuple(int(m) for m in options["milestones"])
        return cls(base_lr=float(base_lr), **options)


def parse_schedule(spec: str, flag: str = "lr-schedule") -> tuple[str, dict]:
    """``(kind, options)`` of a schedule string; ``UserError`` if malformed.

    ``constant`` | ``step:EVERY[:GAMMA]`` | ``multistep:E1,E2,...[:GAMMA]`` | ``cosine`` |
    ``poly[:POWER]``. Epoch counts are in epochs of the schedule's own counter (global
    steps for the global lr, local updates for the local lr). GAMMA defaults to 0.1,
    POWER to 2.
    """
    if not isinstance(spec, str) or not spec:
        raise UserError(f"--{flag} must be a string like constant, multistep:80,120 or cosine; got {spec!r}")
    kind, *rest = spec.split(":")
    try:
        if kind in ("constant", "cosine") and not rest:
            return kind, {}
        if kind == "poly" and len(rest) <= 1:
            power = float(rest[0]) if rest else 2.0
            if not power > 0:
                raise ValueError
            return kind, {"power": power}
        if kind == "step" and 1 <= len(rest) <= 2:
            every = float(rest[0])
            gamma = float(rest[1]) if len(rest) > 1 else 0.1
            if not (every > 0 and 0 < gamma):
                raise ValueError
            return kind, {"every": every, "gamma": gamma}
        if kind == "multistep" and 1 <= len(rest) <= 2:
            milestones = [float(m) for m in rest[0].split(",")]
            gamma = float(rest[1]) if len(rest) > 1 else 0.1
            if not milestones or any(m <= 0 for m in milestones) or milestones != sorted(milestones) or not gamma > 0:
                raise ValueError
            return kind, {"milestones": milestones, "gamma": gamma}
    except ValueError:
        pass
    raise UserError(f"--{flag} {spec!r} is not understood; use constant, step:EVERY[:GAMMA], "
                    "multistep:E1,E2[:GAMMA], cosine or poly[:POWER] (epochs)")


def schedule_in_steps(spec: str, steps_per_epoch: int, flag: str = "lr-schedule") -> dict:
    """A schedule string (epochs) as ``AlgoConfig``'s dict in steps: ``{"kind", "every"/"milestones", ...}``."""
    kind, options = parse_schedule(spec, flag)
    out = {"kind": kind}
    if kind == "step":
        out.update(every=max(1, round(options["every"] * steps_per_epoch)), gamma=options["gamma"])
    elif kind == "multistep":
        out.update(milestones=[round(m * steps_per_epoch) for m in options["milestones"]], gamma=options["gamma"])
    elif kind == "poly":
        out["power"] = options["power"]
    return out


def check_schedule(flag: str, value) -> None:
    """A setting's check: ``value`` is a schedule string (``parse_schedule``'s one-line error otherwise)."""
    parse_schedule(value, flag)


# The learning rate's settings (every algorithm has them): the global lr, its schedule, its linear warm-up.
LR = Setting("lr", 0.1, "global learning rate", float, functools.partial(number, low=0.0, strict=True),
             group=OPTIMIZER)
LR_SCHEDULE = Setting("lr_schedule", "constant", "constant | step:EVERY[:GAMMA] | multistep:E1,E2[:GAMMA] | cosine "
                      "| poly[:POWER] (epochs)", check=check_schedule, metavar="SPEC", group=OPTIMIZER)
LR_WARMUP_EPOCHS = Setting("lr_warmup_epochs", 0.0, "epochs of linear warm-up of the global lr", float,
                           functools.partial(number, low=0.0), metavar="E", group=OPTIMIZER)
