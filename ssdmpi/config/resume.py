"""Resuming a run: what a checkpoint's config means today, and what a resumed run may not change."""

from __future__ import annotations

from ssdmpi.algos import registry
from ssdmpi.config.files import normalise
from ssdmpi.config.flags import _show
from ssdmpi.config.settings import (
    FIELD_NAMES,
    INVOCATION,
    LENGTH_SCHEDULES,
    RUN_LENGTH,
    SETTINGS,
    STRUCTURAL,
    WARMUP,
    first_set,
)
from ssdmpi.errors import UserError
from ssdmpi.optim.schedules import parse_schedule
from ssdmpi.validate import flag_name


def checkpoint_settings(checkpoint_config: dict) -> dict:
    """A checkpoint's config as field names (``normalise``), with the value that reproduces what it
    ran for an algorithm setting added after it was written (``registry.predating_values``)."""
    old = normalise(dict(checkpoint_config), "checkpoint config")
    return {**old, **registry.predating_values(old)}


def check_resume(old: dict, cfg) -> None:
    """``UserError`` if a structural setting differs from the checkpoint's (``old``) config, if
    the SSGD warm-up changed (the switch to the delay stage cannot move: resumed past a new
    switch point the run would stay SSGD, or count its local steps from a negative ``m``), or
    if the run's length changed under a schedule that depends on it (``cosine``, ``poly``: the
    lr would jump at the resume point and the run would match neither length's run)."""
    old, new = checkpoint_settings(old), cfg.to_dict()
    for name in STRUCTURAL:
        if name in old and old[name] != new[name]:
            raise UserError(f"the checkpoint was trained with {SETTINGS[name].flag}={old[name]!r} but this run asks "
                            f"for {new[name]!r}; drop that setting or start a new run directory")
    was, now = first_set(old, WARMUP), first_set(cfg.to_dict(), WARMUP)
    if was != now:
        raise UserError(f"the checkpoint was trained with {_as_flag(*was)} but this run asks for {_as_flag(*now)}: a "
                        "resumed run cannot move the switch from the SSGD warm-up to the delay stage; drop that "
                        "setting or start a new run directory")
    was, now = first_set(old, RUN_LENGTH), first_set(cfg.to_dict(), RUN_LENGTH)
    for name in ("lr_schedule", "local_lr_schedule"):
        spec = getattr(cfg, name)
        if was != now and spec is not None and old.get(name) == spec and parse_schedule(spec)[0] in LENGTH_SCHEDULES:
            raise UserError(f"--{flag_name(name)} {spec} spreads its decay over the whole run: the checkpoint was "
                            f"trained for {_as_flag(*was)}, and resuming it for {_as_flag(*now)} would make the lr "
                            f"jump at the resume point (matching neither run); keep {_as_flag(*was)}, or train for "
                            f"{_as_flag(*now)} from the start in a new run directory")


def _as_flag(name: str, value) -> str:
    return f"--{flag_name(name)} {_show(value)}" if value is not None else f"no --{flag_name(name)}"


def changed_settings(old: dict, cfg) -> list:
    """``["lr: 0.1 -> 0.05", ...]``: non-structural settings that differ from a checkpoint's config."""
    new = cfg.to_dict()
    skip = set(STRUCTURAL) | set(INVOCATION) | {"progress_bar"}
    return [f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in FIELD_NAMES
            if k not in skip and k in old and old.get(k) != new[k]]
