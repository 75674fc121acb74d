"""The registry: every training algorithm (``--algo``) and period rule (``--period-rule``) is
declared here once (the rules in their own files, ``ssdmpi/algos/rules/``), with the settings
they own; everything that depends on the algorithm asks the registry.

- ``SETTINGS``: the optimizer's and the algorithms' settings (``Setting``: default, check,
  help, when it applies); ``ssdmpi/config.py`` adds the rest of a run's and builds the flags,
  the YAML loading and ``--print-config`` from them.
- ``resolve(values, world_size)``: the one check of an algorithm's settings: each value, each
  setting given where it does not apply (a one-line ``UserError``), and the defaults filled in.
- ``AlgoConfig``: those settings in steps (the algorithm's config), ``build_algorithm``.
- ``ALGORITHMS``, ``RULES``, ``algorithm(name)``, ``find(name)``: the specs; ``variants()``: the
  named configurations the benchmarks, the GPU check and the tests run.

An algorithm's or rule's name is compared as a string nowhere else (``tests/unit/test_layering.py``).
Light: no NumPy (the command-line parser is built from it); implementations load when built.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil

from ssdmpi.algos import rules as rule_modules
from ssdmpi.algos.auto_delay import DELAY_RANGE, MIN_WARMUP_STEPS
from ssdmpi.algos.spec import AlgorithmSpec, RuleSpec, Setting, load
from ssdmpi.errors import UserError
from ssdmpi.metrics import counted
from ssdmpi.optim.local import LOCAL_LR_UPDATES, LOCAL_UPDATES
from ssdmpi.optim.schedules import LRSchedule, parse_schedule
from ssdmpi.validate import flag_name, is_int, nonnegative_int, number, positive_int

OPTIMIZER, ALGORITHM = "length and optimizer", "algorithm (docs/ALGORITHM.md)"
ASGD_ORDERS = ("arrival", "round-robin")   # asgd: pushes applied as they arrive, or in worker order (tests)
ASGD_RATES = ("plain", "staleness")        # asgd: each push's lr: the global lr, or it / (1 + staleness)


def _or(items) -> str:
    items = list(items)
    return ", ".join(items[:-1]) + " or " + items[-1] if len(items) > 1 else "".join(items)


def delay_value(text: str):
    """``--delay``'s type: a positive integer k, or ``auto``."""
    import argparse

    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer k or auto, got {text!r}") from None


def _delay(flag: str, value) -> None:
    if value != "auto" and (not is_int(value) or value < 1):
        raise UserError(f"--{flag} must be a positive integer or auto, got {value!r}")


def _schedule(flag: str, value) -> None:
    parse_schedule(value, flag)


def _auto_warmup(run) -> None:
    """``--delay auto`` measures in the SSGD warm-up: it needs enough warm-up steps to measure."""
    if run.delay == "auto" and run.warmup_steps is not None and run.warmup_steps < MIN_WARMUP_STEPS:
        raise UserError(f"--delay auto measures compute and allreduce times during the SSGD warm-up and needs "
                        f"--warmup-steps >= {MIN_WARMUP_STEPS} (got {run.warmup_steps}); lengthen the warm-up "
                        "(--warmup-steps or --warmup-epochs) or give a fixed --delay K")


def _auto_applies(run) -> None:
    """``--delay auto`` chooses a period and the merge delay that hides its allreduce: it needs a period
    rule with one (``RuleSpec.auto_chooses``); elsewhere nothing is in flight across steps to hide."""
    if run.rule is not None and run.rule.auto_chooses:
        return
    if run.comm == "step":
        raise UserError("--delay auto does not apply to --comm step (it sends every step, overlapped with one "
                        "step: k does not hide it); give a fixed --delay K, or use --comm period")
    if run.rule is not None:
        with_one = _or(f"--period-rule {r}" for r, s in RULES.items() if s.auto_chooses)
        raise UserError(f"--delay auto chooses the period and the merge delay of {with_one}; --period-rule "
                        f"{run.period_rule} has no merge delay: give a fixed --delay K, or use {with_one}")
    raise UserError(f"--delay auto does not apply to --algo {run.algo} ({run.spec.why}: there is no allreduce "
                    "in flight to hide); give a fixed --delay K")


def _local_update_refusal(run) -> str:
    rule = f" --comm {run.comm} --period-rule {run.period_rule}" if run.period_rule else ""
    add_comm = run.spec.uses("comm") and "comm" not in run.spec.fixed and run.given.get("comm") is None
    return (f"--local-update does not apply to --algo {run.algo}{rule}"
            + ("; it is for --comm step: add --comm step" if add_comm else "; drop it"))


def _uses_local_update(run) -> bool:
    return run.comm == "step" or bool(run.rule and run.rule.uses_local_update)


def _check_servers(run, world_size) -> None:
    if world_size is not None and world_size <= run.servers:
        raise UserError(f"--algo asgd with --servers {run.servers} needs at least {run.servers + 1} ranks (the "
                        f"servers and at least one worker), got {world_size}; run more ranks or use fewer --servers")


def _discover_rules() -> dict:
    """``{name: RuleSpec}`` of every module of ``ssdmpi/algos/rules/`` with a ``SPEC``, by file name."""
    found = [importlib.import_module(f"{rule_modules.__name__}.{m.name}")
             for m in sorted(pkgutil.iter_modules(rule_modules.__path__), key=lambda m: m.name)]
    return {m.SPEC.name: m.SPEC for m in found if isinstance(getattr(m, "SPEC", None), RuleSpec)}


RULES = _discover_rules()
DEFAULT_RULE = next(name for name, spec in RULES.items() if spec.default)
RULE_SETTINGS = tuple(s for spec in RULES.values() for s in spec.settings)


def _rule_setting(s: Setting, rule: str) -> Setting:
    """A rule's own setting: it applies with that rule only, and is one of the algorithm's settings."""
    return dataclasses.replace(s, where=f"--comm period --period-rule {rule}", group=ALGORITHM,
                               applies=lambda run, base=s.applies: run.period_rule == rule
                               and (base is None or base(run)))


SETTINGS = {s.name: s for s in (
    Setting("lr", 0.1, "global learning rate", float, functools.partial(number, low=0.0, strict=True),
            group=OPTIMIZER),
    Setting("lr_schedule", "constant", "constant | step:EVERY[:GAMMA] | multistep:E1,E2[:GAMMA] | cosine | "
            "poly[:POWER] (epochs)", check=_schedule, metavar="SPEC", group=OPTIMIZER),
    Setting("lr_warmup_epochs", 0.0, "epochs of linear warm-up of the global lr", float,
            functools.partial(number, low=0.0), metavar="E", group=OPTIMIZER),
    Setting("momentum", 0.9, "global momentum", float, functools.partial(number, low=0.0, high=1.0, high_open=True),
            group=OPTIMIZER),
    Setting("weight_decay", 1e-4, "weight decay on weights and BN gamma", float,
            functools.partial(number, low=0.0), group=OPTIMIZER),
    Setting("algo", "ssd", "training algorithm", group=ALGORITHM, structural=True),   # choices: below
    Setting("delay", 5, "delay k, iterations between pulls of the global model (--comm period: the period; "
            "localsgd: between model averages); auto (--comm period with a rule that has a merge delay): the merge "
            "delay d that hides the allreduce and the period k that amortises it, within the rule's stable region, "
            "measured in the SSGD warm-up (needs --warmup-steps >= 5; docs/ALGORITHM.md section 12)",
            delay_value, _delay, metavar="K|auto", group=ALGORITHM, context_check=_auto_warmup, structural=True,
            bench_tag="k{}"),
    Setting("delay_max", DELAY_RANGE[1], "the largest k (and d) --delay auto may choose: a cap on staleness "
            "(below what hiding the allreduce needs, part of it is exposed)", int, positive_int, metavar="K",
            group=ALGORITHM, applies=lambda run: run.delay == "auto", where="--delay auto",
            note="it caps the k auto chooses", bench_tag="max{}"),
    Setting("warmup_steps", 0, "SSGD warm-up iterations", int, nonnegative_int, metavar="T", group=ALGORITHM,
            argparse={"group": "warmup"}),
    Setting("warmup_epochs", None, "SSGD warm-up in epochs (instead of --warmup-steps)", float,
            functools.partial(number, low=0.0), metavar="E", group=ALGORITHM, argparse={"group": "warmup"},
            default_text="unset, --warmup-steps decides"),
    Setting("comm", "period", "communication schedule of ssd", choices=("step", "period"), group=ALGORITHM,
            structural=True, bench_tag="{}"),
    Setting("local_update", "global-momentum", "local update of the delay stage", choices=LOCAL_UPDATES,
            group=ALGORITHM, applies=_uses_local_update, refusal=_local_update_refusal, structural=True,
            where="--comm step or " + _or(f"--period-rule {r}" for r, s in RULES.items() if s.uses_local_update)),
    Setting("local_lr", None, "local learning rate of --local-update glu-paper and sgd", float,
            functools.partial(number, low=0.0, strict=True), group=ALGORITHM,
            applies=lambda run: run.local_update in LOCAL_LR_UPDATES, where=f"--local-update {_or(LOCAL_LR_UPDATES)}",
            default_text="world size x lr"),
    Setting("local_lr_schedule", None, "schedule of the local lr", check=_schedule, metavar="SPEC", group=ALGORITHM,
            applies=lambda run: run.local_update in LOCAL_LR_UPDATES, where=f"--local-update {_or(LOCAL_LR_UPDATES)}",
            default_text="the global schedule's shape"),
    Setting("glu_divisor", 12.0, "divisor C of --local-update glu-paper", float,
            functools.partial(number, low=0.0, strict=True), metavar="C", group=ALGORITHM,
            applies=lambda run: run.local_update == "glu-paper", where="--local-update glu-paper"),
    Setting("period_rule", DEFAULT_RULE, "update rule of --comm period", choices=tuple(RULES), metavar="RULE",
            group=ALGORITHM, applies=lambda run: run.comm == "period", where="--algo ssd --comm period",
            structural=True),
    *(_rule_setting(s, spec.name) for spec in RULES.values() for s in spec.settings),
    Setting("servers", 1, "asgd: parameter-server ranks (the last S ranks)", int, positive_int, metavar="S",
            group=ALGORITHM, structural=True, bench_tag="s{}"),
    Setting("asgd_order", ASGD_ORDERS[0], "asgd: apply pushes as they arrive, or in worker order (deterministic, "
            "for tests)", choices=ASGD_ORDERS, group=ALGORITHM),
    Setting("asgd_rate", "staleness", "asgd: the lr of each push: the global lr, or the global lr / (1 + the "
            "push's staleness)", choices=ASGD_RATES, group=ALGORITHM),
)}
# The settings an algorithm resolves (None in a config: the algorithm's default), in the order they
# depend on each other; a resolved run records them (``config.yaml``) but for the contextual ones.
RESOLVED = ("delay", "delay_max", "comm", "period_rule", *(s.name for s in RULE_SETTINGS), "local_update",
            "local_lr", "local_lr_schedule", "glu_divisor", "servers", "asgd_order", "asgd_rate")
RECORDED = tuple(n for n in RESOLVED if SETTINGS[n].default_text is None)
# What ``resolve`` checks (the schedules and the epoch counts are checked in the form each layer holds them).
CHECKED = ("lr", "momentum", "weight_decay", "warmup_steps", *(n for n in RESOLVED if n != "local_lr_schedule"))
SSD_SETTINGS = ("delay", "delay_max", "comm", "period_rule", *(s.name for s in RULE_SETTINGS), "local_update",
                "local_lr", "local_lr_schedule", "glu_divisor")


def _ssd_twin(cfg) -> str:
    return "ssdmpi.algos.reference:StepTwin" if cfg.comm == "step" else RULES[cfg.period_rule].reference


ALGORITHMS = {spec.name: spec for spec in (
    AlgorithmSpec("ssgd", lambda cfg: "ssdmpi.algos.base:SSGD", lambda cfg: None, lambda cfg, workers: "ssgd",
                  why="blocking allreduce every step", delay_stage=False, warmup=False, variants={"ssgd": {}},
                  pattern=lambda cfg: ("ssgd", 1), baseline=True),
    AlgorithmSpec("ssd", lambda cfg: f"ssdmpi.algos.ssd:{'SSDStep' if cfg.comm == 'step' else 'SSDPeriod'}",
                  _ssd_twin, lambda cfg, workers: f"ssd (k={cfg.delay}, comm {cfg.comm}, warm-up "
                                                 f"{cfg.warmup_steps} steps)",
                  settings=SSD_SETTINGS, label=("{comm}", "k={delay}"), bench=("comm", "delay"),
                  variants={**{f"step/{u}": {"comm": "step", "local_update": u} for u in LOCAL_UPDATES},
                            **{f"period/{r}": {"comm": "period", "period_rule": r, **s.variant}
                               for r, s in RULES.items()}},
                  pattern=lambda cfg: ("period", cfg.delay) if cfg.comm == "period" else ("step", 1)),
    AlgorithmSpec("odsgd", lambda cfg: "ssdmpi.algos.ssd:ODSGD", _ssd_twin,
                  lambda cfg, workers: f"odsgd (k=1, comm step, warm-up {cfg.warmup_steps} steps)",
                  settings=SSD_SETTINGS, fixed={"delay": 1, "comm": "step"}, variant_of="ssd",
                  variants={"odsgd": {}}, pattern=lambda cfg: ("step", 1)),
    AlgorithmSpec("localsgd", lambda cfg: "ssdmpi.algos.localsgd:LocalSGD",
                  lambda cfg: "ssdmpi.algos.reference:LocalSGDTwin", lambda cfg, workers: f"localsgd (k={cfg.delay})",
                  settings=("delay", "delay_max"), why="it averages models every --delay steps, blocking",
                  label=("k={delay}",), bench=("delay",), variants={"localsgd": {}},
                  pattern=lambda cfg: ("localsgd", cfg.delay)),
    AlgorithmSpec("asgd", lambda cfg: "ssdmpi.algos.asgd:ASGD", lambda cfg: None,
                  lambda cfg, workers: f"asgd ({counted(cfg.servers, 'server')}, {counted(workers, 'worker')}, "
                                       f"order {cfg.asgd_order}, warm-up {cfg.warmup_steps} steps)",
                  settings=("servers", "asgd_order", "asgd_rate"), why="a parameter server applying each push",
                  delay_stage=False,
                  simulation="ssdmpi.algos.reference:ASGDSimulation", bench=("servers",), bench_required=0,
                  variants={"asgd": {"servers": 1, "asgd_order": "round-robin"},
                            "asgd/plain": {"servers": 1, "asgd_order": "round-robin", "asgd_rate": "plain"}},
                  check=_check_servers,
                  workers=lambda run, world_size: world_size - run.servers),
)}
SETTINGS["algo"] = dataclasses.replace(SETTINGS["algo"], choices=tuple(ALGORITHMS))
ALGORITHM_SETTINGS = tuple(n for n, s in SETTINGS.items() if s.group == ALGORITHM)


def algorithm(name) -> AlgorithmSpec:
    """The spec of ``--algo name``; ``UserError`` naming the choices for any other name."""
    SETTINGS["algo"].validate(name)
    return ALGORITHMS[name]


def find(name) -> AlgorithmSpec | None:
    """The spec of ``name``, or None (a run directory of an unknown or older algorithm)."""
    return ALGORITHMS.get(name)


def variants() -> dict:
    """``{variant name: settings}`` of every algorithm's named configurations (with ``algo``)."""
    return {v: {"algo": spec.name, **settings} for spec in ALGORITHMS.values() for v, settings in spec.variants.items()}


def where(name: str) -> str:
    """When setting ``name`` applies, in words: its own condition, or the algorithms that use it."""
    s = SETTINGS[name]
    return s.where or "--algo " + _or(a for a, spec in ALGORITHMS.items() if spec.uses(name))


def default_text(name: str) -> str:
    """What a run gets without setting ``name`` (for ``--help``): its default, and for an algorithm's
    setting when that applies and what the algorithms that fix it fix it to."""
    s = SETTINGS[name]
    if s.default_text is not None:
        return s.default_text
    if name not in RESOLVED:
        return str(s.default)
    users = [a for a, spec in ALGORITHMS.items() if name in spec.settings and name not in spec.fixed]
    fixed = "".join(f"; {a}: {spec.fixed[name]}" for a, spec in ALGORITHMS.items() if name in spec.fixed)
    value = f"{s.default:g}" if isinstance(s.default, float) else s.default
    return f"{value} with {s.where or '--algo ' + _or(users)}{fixed}"


class Run(dict):
    """An algorithm's settings as far as resolved, read as attributes (None when unset); ``spec``,
    ``rule`` (its ``RuleSpec``, or None), ``given`` (the values asked for)."""

    __getattr__ = dict.get


def _refusal(s: Setting, run: Run, value) -> str:
    """The error for setting ``s`` given as ``value`` where it does not apply: why the algorithm has no
    use for a setting several use, or where it applies."""
    spec, shown = run.spec, f" {value}" if s.choices else ""
    if s.refusal is not None:
        return s.refusal(run)
    if not spec.uses(s.name) and spec.why and s.where is None and sum(a.uses(s.name) for a in ALGORITHMS.values()) > 1:
        return f"--{s.flag}{shown} does not apply to --algo {spec.name} ({spec.why}); drop it"
    return f"--{s.flag} applies only to {where(s.name)}" + (f" ({s.note})" if s.note else "") + "; drop it"


def resolve(values: dict, world_size: int | None = None) -> Run:
    """The algorithm's settings of ``values`` (field names; missing or None: unset) resolved: each
    checked, a setting given where it does not apply refused, the defaults of ``--algo`` filled in
    (the local lr's needs ``world_size``: None until known). ``UserError`` (one line) on any of it.
    Returns the ``Run``: the ``RESOLVED`` settings, ``spec``, ``rule``, ``applied`` (those that apply)."""
    spec = algorithm(values.get("algo", SETTINGS["algo"].default))
    for name in CHECKED:
        SETTINGS[name].validate(values.get(name))
    run = Run({k: values.get(k, SETTINGS[k].default) for k in ("algo", "lr", "warmup_steps")}, spec=spec,
              given=values, applied=set())
    for name in RESOLVED:
        s, given = SETTINGS[name], values.get(name)
        if name in spec.fixed:
            if given is not None and given != spec.fixed[name]:
                fixed = " ".join(f"--{flag_name(k)} {v}" for k, v in spec.fixed.items())
                raise UserError(f"--algo {spec.name} is {spec.variant_of} with {fixed}; got --{s.flag} {given} "
                                f"(use --algo {spec.variant_of} for that)")
            run[name] = spec.fixed[name]
        elif not spec.uses(name) or (s.applies is not None and not s.applies(run)):
            if given is not None:
                raise UserError(_refusal(s, run, given))
            run[name] = None
            continue
        else:
            run[name] = given if given is not None else s.default
            if s.context_check is not None:
                s.context_check(run)
        run.applied.add(name)
        if name == "period_rule":
            run["rule"] = RULES.get(run.period_rule)
    if run.delay == "auto":
        _auto_applies(run)
        if values.get(run.rule.auto_chooses) is None:
            run[run.rule.auto_chooses] = None       # chosen with k at the switch (ssdmpi/algos/auto_delay.py)
    if run.local_lr is None and "local_lr" in run.applied and world_size is not None:
        run["local_lr"] = world_size * run.lr
    if spec.check is not None:
        spec.check(run, world_size)
    return run


def predating_values(old: dict) -> dict:
    """``{setting: value}`` for the algorithm settings a run's config ``old`` (field names, as a checkpoint
    stores it) predates and that change what it ran: ``merge_momentum`` 0 for a run of a period rule that
    has it now (there was no momentum merge before the setting). ``{}`` when there is none."""
    spec = ALGORITHMS.get(old.get("algo") or SETTINGS["algo"].default)
    if spec is None or "merge_momentum" in old or not spec.uses("period_rule"):
        return {}
    comm = spec.fixed.get("comm", old.get("comm") or SETTINGS["comm"].default)
    rule = RULES.get(old.get("period_rule") or DEFAULT_RULE)
    has_it = rule is not None and any(s.name == "merge_momentum" for s in rule.settings)
    return {"merge_momentum": 0.0} if comm == "period" and has_it else {}


def _algo_config_fields() -> list:
    """``AlgoConfig``'s fields: the settings above (lengths in steps), the run's length."""
    skip = {"warmup_epochs", "lr_warmup_epochs"}
    return [(n, object, dataclasses.field(default=None if n in RESOLVED else s.default))
            for n, s in SETTINGS.items() if n not in skip] + \
        [("lr_warmup_steps", int, dataclasses.field(default=0)), ("total_steps", object, None)]


class _AlgoConfigMethods:
    """``AlgoConfig``: every setting ``build_algorithm`` needs (ALGORITHM.md sections 1-5).

    Lengths are in iterations (the trainer converts epochs). ``lr_schedule`` is a kind name
    (``constant``, ``step``, ``multistep``, ``cosine``, ``poly``) or a dict ``{"kind": ...,
    "every"/"milestones"/"gamma"/"power": ...}`` in global steps (``ssdmpi.optim.schedules``). The
    local lr (``glu-paper``, ``sgd``) is ``local_lr * factor(t)`` where ``factor`` is the global
    schedule's shape at iteration ``t``, unless ``local_lr_schedule`` is given: then it is that
    schedule (base ``local_lr``) at the local-update counter ``m``. Settings left None are the
    algorithm's to choose (``validate`` fills them in).
    """

    def validate(self, world_size: int | None = None):
        """Check every field (``resolve``); return a resolved copy (defaults filled in)."""
        if not is_int(self.lr_warmup_steps) or self.lr_warmup_steps < 0:
            raise UserError(f"lr warm-up must be an integer number of steps >= 0, got {self.lr_warmup_steps!r}")
        run = resolve(dataclasses.asdict(self), world_size)
        resolved = dataclasses.replace(self, **{n: run[n] for n in RESOLVED})
        resolved.global_schedule()
        resolved.local_schedule()
        return resolved

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


AlgoConfig = dataclasses.make_dataclass("AlgoConfig", _algo_config_fields(), bases=(_AlgoConfigMethods,),
                                        namespace={"__doc__": _AlgoConfigMethods.__doc__,
                                                   "__module__": __name__})


def build_algorithm(config, model, communicator):
    """The algorithm ``config.algo`` on ``model`` (the API: ``ssdmpi/algos/__init__.py``)."""
    cfg = config.validate(world_size=communicator.size)
    return load(ALGORITHMS[cfg.algo].implementation(cfg))(cfg, model, communicator)
