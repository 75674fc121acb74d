"""The registry: it finds every training algorithm (``--algo``), period rule (``--period-rule``) and inner
optimizer (``--optimizer``) by the spec each declares in its own file (``ssdmpi/spec.py``), indexes them,
and answers every question about them. It holds no table of its own about any of them.

- ``ALGORITHMS``, ``RULES``, ``OPTIMIZERS``: the specs found in ``ssdmpi/algos/``, ``ssdmpi/algos/rules/``
  and ``ssdmpi/optim/optimizers/``; ``algorithm(name)``, ``find(name)``; ``variants()``: the named configurations
  the benchmarks, the GPU check and the tests run; ``linear_maps()``: the stability tool's maps.
- ``SETTINGS``: the learning rate's, the optimizers', the algorithms' and the rules' settings
  (``Setting``: default, check, help, when it applies); ``ssdmpi/config.py`` adds the rest of a run's.
- ``resolve(values, world_size)``: the one check of those settings: each value, each setting given where
  it does not apply (a one-line ``UserError``), the defaults filled in.
- ``AlgoConfig``: those settings in steps (the algorithm's config); ``build_algorithm``.

Light: no NumPy (the command-line parser is built from it); implementations load when built.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from ssdmpi.algos.base import WARMUP_EPOCHS, WARMUP_STEPS
from ssdmpi.algos.contract import Parts
from ssdmpi.errors import UserError
from ssdmpi.optim import outer
from ssdmpi.optim.schedules import LR, LR_SCHEDULE, LR_WARMUP_EPOCHS, LRSchedule
from ssdmpi.spec import ALGORITHM, OPTIMIZER, AlgorithmSpec, OptimizerSpec, RuleSpec, Setting, load
from ssdmpi.validate import flag_name, is_int

__all__ = ["ALGORITHM", "OPTIMIZER", "Setting"]


def or_(items) -> str:
    """``"a, b or c"``."""
    items = list(items)
    return ", ".join(items[:-1]) + " or " + items[-1] if len(items) > 1 else "".join(items)


def _discover(package_name: str, kind) -> dict:
    """``{name: spec}`` of every module of ``package`` (not its subpackages) whose ``SPEC`` is a ``kind``."""
    package, found = importlib.import_module(package_name), {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.ispkg:
            continue
        spec = getattr(importlib.import_module(f"{package.__name__}.{info.name}"), "SPEC", None)
        if isinstance(spec, kind):
            if spec.name in found:
                raise ValueError(f"two {kind.__name__}s are called {spec.name!r}")
            found[spec.name] = spec
    return found


def _default(specs: dict, what: str) -> str:
    defaults = [name for name, spec in specs.items() if spec.default]
    if len(defaults) != 1:
        raise ValueError(f"exactly one {what} must be the default, found {defaults}")
    return defaults[0]


# Baseline first, then the default, then the rest by name (the order of --help and the benchmarks).
ALGORITHMS = dict(sorted(_discover("ssdmpi.algos", AlgorithmSpec).items(),
                         key=lambda item: (not item[1].baseline, not item[1].default, item[0])))
RULES = dict(sorted(_discover("ssdmpi.algos.rules", RuleSpec).items(), key=lambda item: (not item[1].default, item[0])))
OPTIMIZERS = dict(sorted(_discover("ssdmpi.optim.optimizers", OptimizerSpec).items(),
                         key=lambda item: (not item[1].default, item[0])))
DEFAULT_ALGORITHM, DEFAULT_RULE, DEFAULT_OPTIMIZER = (_default(ALGORITHMS, "algorithm"), _default(RULES, "rule"),
                                                      _default(OPTIMIZERS, "optimizer"))
BASELINE = next(name for name, spec in ALGORITHMS.items() if spec.baseline)   # what the benchmarks compare with


def _selector(name: str, specs: dict, default: str, text: str, **more) -> Setting:
    return Setting(name, default, text, choices=tuple(specs), structural=True, **more)


def _owned(s: Setting, applies, where: str, group: str) -> Setting:
    """A setting that applies with one choice only (a rule's, an optimizer's), as well as where its own
    condition says."""
    return dataclasses.replace(s, where=where, group=group,
                               applies=lambda run, base=s.applies: applies(run) and (base is None or base(run)))


def _optimizer_settings() -> list:
    """Each optimizer's settings, applying with the optimizers that declare them."""
    owners = {}
    for spec in OPTIMIZERS.values():
        for s in spec.settings:
            owners.setdefault(s.name, (s, []))[1].append(spec.name)
    out = []
    for s, names in owners.values():
        out.append(_owned(s, lambda run, names=tuple(names): run.optimizer in names,
                          "--optimizer " + or_(names), OPTIMIZER))
    return out


def _with_rule_settings(spec: AlgorithmSpec) -> AlgorithmSpec:
    """``spec`` with every rule's own settings right after the rule selector (for an algorithm that has
    one), each applying with its rule only, and the selector's choices and default the rules found."""
    settings = []
    for s in spec.settings:
        if callable(s.where):
            s = dataclasses.replace(s, where=s.where(_this_module()))
        if s.name != RULE_SELECTOR:
            settings.append(s)
            continue
        settings.append(dataclasses.replace(s, default=DEFAULT_RULE, choices=tuple(RULES)))
        settings += [_owned(r, lambda run, rule=rule: run.period_rule == rule, f"--comm period --period-rule {rule}",
                            ALGORITHM) for rule, rspec in RULES.items() for r in rspec.settings]
    return dataclasses.replace(spec, settings=tuple(settings))


def _algorithm_settings() -> list:
    """The algorithms' settings in the order they depend on each other (each once)."""
    out, seen = [], set()
    for spec in ALGORITHMS.values():
        for s in spec.settings:
            if s.name not in seen:
                seen.add(s.name)
                out.append(s)
    return out


def _this_module():
    import sys

    return sys.modules[__name__]


RULE_SELECTOR = "period_rule"   # the algorithm setting whose value names the --period-rule
ALGO = _selector("algo", ALGORITHMS, DEFAULT_ALGORITHM, "training algorithm", group=ALGORITHM)
OPTIMIZER_SELECTOR = _selector("optimizer", OPTIMIZERS, DEFAULT_OPTIMIZER, "inner optimizer of every step",
                               group=OPTIMIZER)
# Every algorithm has these; each resolves none of them away.
UNIVERSAL = (LR, LR_SCHEDULE, LR_WARMUP_EPOCHS, WARMUP_STEPS, WARMUP_EPOCHS)
_OPTIMIZER_SETTINGS = _optimizer_settings()
ALGORITHMS = {name: _with_rule_settings(spec) for name, spec in ALGORITHMS.items()}
_ALGORITHM_SETTINGS = _algorithm_settings()
SETTINGS = {s.name: s for s in (LR, LR_SCHEDULE, LR_WARMUP_EPOCHS, OPTIMIZER_SELECTOR, *_OPTIMIZER_SETTINGS, ALGO,
                                WARMUP_STEPS, WARMUP_EPOCHS, *_ALGORITHM_SETTINGS)}
# The settings a run resolves (None in a config: the algorithm's or optimizer's default), in the order
# they depend on each other; a resolved run records them (``config.yaml``) but for the contextual ones.
RESOLVED = (OPTIMIZER_SELECTOR.name, *(s.name for s in _OPTIMIZER_SETTINGS), *(s.name for s in _ALGORITHM_SETTINGS))
RECORDED = tuple(n for n in RESOLVED if SETTINGS[n].default_text is None and SETTINGS[n].derive is None)
# What ``resolve`` checks (the schedules and the epoch counts are checked in the form each layer holds them).
CHECKED = (LR.name, WARMUP_STEPS.name, *(n for n in RESOLVED if SETTINGS[n].check is not LR_SCHEDULE.check))
ALGORITHM_SETTINGS = tuple(n for n, s in SETTINGS.items() if s.group == ALGORITHM)


def algorithm(name) -> AlgorithmSpec:
    """The spec of ``--algo name``; ``UserError`` naming the choices for any other name."""
    ALGO.validate(name)
    return ALGORITHMS[name]


def find(name) -> AlgorithmSpec | None:
    """The spec of ``name``, or None (a run directory of an unknown or older algorithm)."""
    return ALGORITHMS.get(name)


def variants() -> dict:
    """``{variant name: settings}`` of every algorithm's named configurations (with ``algo``): its own, and
    one per period rule for an algorithm that has them (``AlgorithmSpec.rule_variant``)."""
    out = {}
    for spec in ALGORITHMS.values():
        own = dict(spec.variants)
        if spec.rule_variant is not None:
            own.update(spec.rule_variant(rule) for rule in RULES.values())
        out.update({v: {"algo": spec.name, **settings} for v, settings in own.items()})
    return out


def accuracy_defaults() -> tuple:
    """The variants ``ssdmpi bench accuracy`` runs unless told otherwise: each algorithm's
    ``accuracy_defaults``, and the rule variants of the rules marked ``accuracy_default``."""
    out = []
    for spec in ALGORITHMS.values():
        out += spec.accuracy_defaults
        if spec.rule_variant is not None:
            out += [spec.rule_variant(rule)[0] for rule in RULES.values() if rule.accuracy_default]
    return tuple(out)


def linear_maps() -> dict:
    """``{name: LinearMap}`` of every algorithm and rule that has one (``ssdmpi/algos/stability.py``)."""
    specs = [*ALGORITHMS.values(), *RULES.values()]
    return {spec.name: spec.linear_map for spec in specs if spec.linear_map is not None}


def swept(name: str) -> tuple:
    """The settings of rule (or algorithm) ``name`` that its linear map takes (those with a ``sweep``)."""
    spec = RULES.get(name) or ALGORITHMS[name]
    return tuple(s for s in spec.settings if s.sweep is not None) if name in RULES else ()


def where(name: str) -> str:
    """When setting ``name`` applies, in words: its own condition, or the algorithms that use it."""
    s = SETTINGS[name]
    return s.where or "--algo " + or_(a for a, spec in ALGORITHMS.items() if spec.uses(name))


def default_value(name: str, optimizer: str | None = None):
    """The default of setting ``name`` for ``optimizer`` (an optimizer's own default of a shared setting)."""
    spec = OPTIMIZERS.get(optimizer or DEFAULT_OPTIMIZER)
    if spec is not None and name in spec.defaults:
        return spec.defaults[name]
    return SETTINGS[name].default


def default_text(name: str) -> str:
    """What a run gets without setting ``name`` (for ``--help``): its default, and for an algorithm's
    setting when that applies and what the algorithms that fix it fix it to."""
    s = SETTINGS[name]
    if s.default_text is not None:
        return s.default_text
    own = [f"{default_value(name, o):g} with --optimizer {o}" for o, spec in OPTIMIZERS.items()
           if name in spec.defaults]
    if own:
        return "; ".join(own)
    if name not in RESOLVED:
        return str(s.default)
    users = [a for a, spec in ALGORITHMS.items() if spec.takes(name)]
    fixed = "".join(f"; {a}: {spec.fixed[name]}" for a, spec in ALGORITHMS.items() if name in spec.fixed)
    value = f"{s.default:g}" if isinstance(s.default, float) else s.default
    if not users and not s.where:
        return str(value)
    return f"{value} with {s.where or '--algo ' + or_(users)}{fixed}"


class Run(dict):
    """An algorithm's settings as far as resolved, read as attributes (None when unset); ``spec``,
    ``rule`` (its ``RuleSpec``, or None), ``optimizer_spec`` (the ``OptimizerSpec``), ``given`` (the values
    asked for), ``applied`` (the settings that apply)."""

    __getattr__ = dict.get


def _universal(spec: AlgorithmSpec, name: str) -> bool:
    return name in (OPTIMIZER_SELECTOR.name, *(s.name for s in _OPTIMIZER_SETTINGS))


def _refusal(s: Setting, run: Run, value) -> str:
    """The error for setting ``s`` given as ``value`` where it does not apply: why the algorithm has no
    use for a setting several use, or where it applies."""
    spec, shown = run.spec, f" {value}" if s.choices else ""
    if s.refusal is not None:
        return s.refusal(run)
    if (not spec.uses(s.name) and spec.why and s.where is None
            and sum(a.uses(s.name) for a in ALGORITHMS.values()) > 1):
        return f"--{s.flag}{shown} does not apply to --algo {spec.name} ({spec.why}); drop it"
    return f"--{s.flag} applies only to {where(s.name)}" + (f" ({s.note})" if s.note else "") + "; drop it"


def resolve(values: dict, world_size: int | None = None, soft: dict | None = None) -> Run:
    """The algorithm's settings of ``values`` (field names; missing or None: unset) resolved: each
    checked, a setting given where it does not apply refused, the defaults of ``--algo`` and
    ``--optimizer`` filled in (a default that depends on the run, ``Setting.derive``, once ``world_size``
    is known). ``UserError`` (one line) on any of it. ``soft``: ``{setting: where it came from}`` for the
    values the user did not give on this command line (a preset, a config file, a checkpoint's config):
    one of those that does not apply is left out instead, with a line in ``run.notes``. Returns the
    ``Run``: the ``RESOLVED`` settings, ``spec``, ``rule``, ``applied`` (those that apply), ``notes`` and
    ``dropped`` (the settings left out).

    This is the one resolution of a run's algorithm settings: ``ssdmpi train`` and ``ssdmpi.train`` call
    it once per start (``ssdmpi/config/``), everything after it reads the frozen config it made."""
    soft = soft or {}
    spec = algorithm(values.get("algo", ALGO.default))
    for name in CHECKED:
        SETTINGS[name].validate(values.get(name))
    run = Run({k: values.get(k, SETTINGS[k].default) for k in ("algo", "lr", "warmup_steps")}, spec=spec,
              given=values, applied=set(), notes=[], dropped=set())

    def refuse(name: str, value, message: str) -> None:
        if name not in soft:
            raise UserError(message)
        run.dropped.add(name)
        run.notes.append(f"{soft[name]}: {name}: {value} left out ({message.removesuffix('; drop it')})")

    for name in RESOLVED:
        s, given = SETTINGS[name], values.get(name)
        if name in spec.fixed:
            if given is not None and given != spec.fixed[name]:
                fixed = " ".join(f"--{flag_name(k)} {v}" for k, v in spec.fixed.items())
                refuse(name, given, f"--algo {spec.name} is {spec.variant_of} with {fixed}; got --{s.flag} {given} "
                                    f"(use --algo {spec.variant_of} for that)")
            run[name] = spec.fixed[name]
        elif (not spec.uses(name) and not _universal(spec, name)) or (s.applies is not None and not s.applies(run)):
            if given is not None:
                refuse(name, given, _refusal(s, run, given))
            run[name] = None
            continue
        else:
            run[name] = given if given is not None else default_value(name, run.optimizer)
            if s.context_check is not None:
                s.context_check(run)
        run.applied.add(name)
        if name == RULE_SELECTOR:
            run["rule"] = RULES.get(run.period_rule)
        elif name == OPTIMIZER_SELECTOR.name:
            run["optimizer_spec"] = OPTIMIZERS.get(run.optimizer)
    auto = run.rule.auto_chooses if run.delay == "auto" and run.rule is not None else None
    if auto and values.get(auto) is None:
        run[auto] = None        # chosen with k at the switch (ssdmpi/algos/auto_delay.py)
    _derive(run, world_size)
    if spec.check is not None:
        spec.check(run, world_size)
    return run


def _derive(run: Run, world_size: int | None) -> None:
    for name in RESOLVED:
        s = SETTINGS[name]
        if s.derive is not None and run[name] is None and name in run.applied:
            run[name] = s.derive(run, world_size)


def complete(values: dict, world_size: int) -> dict:
    """``values`` (settings ``resolve`` has resolved, lengths now in steps) completed for a run on
    ``world_size`` ranks: the defaults that depend on the run (``Setting.derive``) filled in where they
    apply, and each applying setting's checks against the others (``context_check``: ``--delay auto``'s
    warm-up, now in steps) made again. Not a resolution: nothing is refused, dropped or defaulted."""
    spec = ALGORITHMS[values["algo"]]
    run = Run(values, spec=spec, given=values, notes=[], rule=RULES.get(values.get(RULE_SELECTOR)))
    run["applied"] = {n for n in RESOLVED if n in spec.fixed or _universal(spec, n) or spec.uses(n)
                      and (SETTINGS[n].applies is None or SETTINGS[n].applies(run))}
    for name in sorted(run.applied):
        if SETTINGS[name].context_check is not None:
            SETTINGS[name].context_check(run)
    _derive(run, world_size)
    return {n: run[n] for n in RESOLVED}


def predating_values(old: dict) -> dict:
    """``{setting: value}`` for the settings a run's config ``old`` (field names, as a checkpoint stores it)
    predates and that change what it ran: its period rule's ``RuleSpec.predating`` values of settings the
    config does not have. ``{}`` when there is none."""
    spec = ALGORITHMS.get(old.get("algo") or ALGO.default)
    if spec is None or not spec.uses(RULE_SELECTOR):
        return {}
    comm = spec.fixed.get("comm", old.get("comm") or SETTINGS["comm"].default)
    rule = RULES.get(old.get(RULE_SELECTOR) or DEFAULT_RULE)
    if comm != "period" or rule is None:
        return {}
    return {name: value for name, value in rule.predating.items() if name not in old}


def _algo_config_fields() -> list:
    """``AlgoConfig``'s fields: the settings above (lengths in steps), the run's length."""
    skip = {WARMUP_EPOCHS.name, LR_WARMUP_EPOCHS.name}
    return [(n, object, dataclasses.field(default=None if n in RESOLVED else s.default))
            for n, s in SETTINGS.items() if n not in skip] + \
        [("lr_warmup_steps", int, dataclasses.field(default=0)), ("total_steps", object, None),
         ("resolved", bool, dataclasses.field(default=False, compare=False))]


class _AlgoConfigMethods:
    """``AlgoConfig``: every setting ``build_algorithm`` needs (ALGORITHM.md sections 1-5).

    Lengths are in iterations (the trainer converts epochs). ``lr_schedule`` is a kind name
    (``constant``, ``step``, ``multistep``, ``cosine``, ``poly``) or a dict ``{"kind": ...,
    "every"/"milestones"/"gamma"/"power": ...}`` in global steps (``ssdmpi.optim.schedules``). The
    local lr (``glu-paper``, ``sgd``) is ``local_lr * factor(t)`` where ``factor`` is the global
    schedule's shape at iteration ``t``, unless ``local_lr_schedule`` is given: then it is that
    schedule (base ``local_lr``) at the local-update counter ``m``. Settings left None are the
    algorithm's to choose (``validate`` fills them in). ``resolved``: made from a resolved run's config
    (``ssdmpi/config/``): ``build_algorithm`` does not resolve it again.
    """

    def validate(self, world_size: int | None = None):
        """Check every field (``resolve``); return a resolved copy (defaults filled in)."""
        if not is_int(self.lr_warmup_steps) or self.lr_warmup_steps < 0:
            raise UserError(f"lr warm-up must be an integer number of steps >= 0, got {self.lr_warmup_steps!r}")
        run = resolve(dataclasses.asdict(self), world_size)
        resolved = dataclasses.replace(self, **{n: run[n] for n in RESOLVED}, resolved=True)
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
        del d["resolved"]
        for key in ("lr_schedule", "local_lr_schedule"):
            if isinstance(d[key], dict):
                d[key] = repr(sorted(d[key].items()))
        return d


AlgoConfig = dataclasses.make_dataclass("AlgoConfig", _algo_config_fields(), bases=(_AlgoConfigMethods,),
                                        namespace={"__doc__": _AlgoConfigMethods.__doc__,
                                                   "__module__": __name__})


def own_settings(specs: tuple, cfg) -> dict:
    """``{name: value}`` of the settings a rule's or an optimizer's spec declares, from a resolved ``cfg``."""
    return {s.name: getattr(cfg, s.name) for s in specs}


def build_optimizer(cfg, mask):
    """The inner optimizer ``cfg.optimizer`` with its settings, for weights with decay ``mask``."""
    spec = OPTIMIZERS[cfg.optimizer]
    return spec.implementation(mask, **own_settings(spec.settings, cfg))


def build_algorithm(config, model, communicator):
    """The algorithm ``config.algo`` on ``model`` (the API: ``ssdmpi/algos/__init__.py``)."""
    cfg = config if config.resolved else config.validate(world_size=communicator.size)
    spec = ALGORITHMS[cfg.algo]
    rule = RULES.get(cfg.period_rule) if cfg.period_rule is not None else None
    mask = model.flat.decay_mask()
    parts = Parts(optimizer=build_optimizer(cfg, mask), rule=rule,
                  rule_settings=own_settings(rule.settings, cfg) if rule is not None else {},
                  outer=outer.build(cfg, mask))
    return load(spec.implementation(cfg))(cfg, model, communicator, parts)
