"""What a setting, a training algorithm, a period rule and an optimizer declare.

Each algorithm (``--algo``), period rule (``--period-rule``) and inner optimizer (``--optimizer``)
declares its spec in its own file, beside its class: ``ssdmpi/algos/<name>.py``,
``ssdmpi/algos/rules/<name>.py``, ``ssdmpi/optim/optimizers/<name>.py``. The registry
(``ssdmpi/algos/registry.py``) finds them and answers every question about them; every table that
depends on an algorithm, a rule or an optimizer (the flags, the YAML keys, ``--print-config``, the
resume rules, the stability map, the benchmarks' variants, what ``ckpt inspect`` shows) is built
from these specs, never written out by name elsewhere.

A ``Setting`` is one field of a run's configuration (field name = YAML key = ``--flag-name``): its
default, its check, its help, and, for the settings of an algorithm, a rule or an optimizer, when it
applies. Nothing here imports NumPy: the command-line parser is built from these declarations.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from ssdmpi.validate import choice, flag_name

# The --help sections of the settings declared by specs.
OPTIMIZER, ALGORITHM = "length and optimizer", "algorithm (docs/ALGORITHM.md)"


@dataclass(frozen=True)
class Setting:
    """One setting. ``default`` is what a run gets without it, stated here only (None: unset, or a
    default that depends on the run: ``default_text`` says which, ``resolve`` computes it).

    ``check(flag, value)`` raises ``UserError`` for a bad value (``choices`` are checked first);
    ``type`` and ``argparse`` are the flag's; ``group`` its ``--help`` section. For the algorithm's
    settings: ``applies(run)`` says whether it means something for a run already resolved up to it
    (None: whenever the algorithm uses it), ``where`` says when in words, ``note`` why, and
    ``refusal(run)`` may word the error for a setting given where it does not apply.
    ``structural``: a resumed run must not change it; ``inherited``: a resumed run takes it from the
    checkpoint; ``invocation``: it belongs to one command, not to the run (config.yaml comments it).
    ``derive(run, world_size)``: the default of a setting that depends on the run (``default_text``
    says how), computed where it applies and the world size is known (None: not yet). ``where`` may
    be a callable of the registry module, for words that name what the registry found.
    ``bench_tag``: how a benchmark variant's name shows it (``k{}``); ``sweep``: the values
    ``ssdmpi bench stability`` scans by default for a setting of a rule's linear map (``"1,2,3,5"``).
    """

    name: str
    default: object = None
    help: str = ""
    type: Callable | None = None
    check: Callable | None = None
    choices: tuple | None = None
    metavar: str | None = None
    group: str = ""
    argparse: dict = field(default_factory=dict)
    applies: Callable | None = None
    where: str | None = None
    note: str = ""
    default_text: str | None = None
    refusal: Callable | None = None
    context_check: Callable | None = None
    structural: bool = False
    inherited: bool = True
    invocation: bool = False
    bench_tag: str | None = None
    sweep: str | None = None
    derive: Callable | None = None

    @property
    def flag(self) -> str:
        return flag_name(self.name)

    def validate(self, value) -> None:
        """``UserError`` (one line, naming ``--flag``) unless ``value`` is None or a good value."""
        if value is None:
            return
        if self.choices is not None:
            choice(self.flag, value, self.choices)
        if self.check is not None:
            self.check(self.flag, value)


@dataclass(frozen=True)
class LinearMap:
    """A period rule (or an algorithm) as a linear map, for its stability (``ssdmpi/algos/stability.py``):
    ``build(x, k, N, mu, **own)`` is the transition matrix of one period at every ``eta*h`` of ``x``,
    ``own`` the values of its spec's settings that have a ``sweep``. ``period``: it has a ``k`` (without
    one it is one step); ``default``: ``ssdmpi bench stability`` shows it unless told otherwise."""

    build: Callable
    period: bool = True
    default: bool = True


@dataclass(frozen=True)
class AlgorithmSpec:
    """One ``--algo``.

    ``settings``: the ``Setting`` of every algorithm setting it can use (those not listed are refused
    with ``why``; the optimizer's settings every algorithm uses);
    ``fixed``: settings it fixes (``odsgd`` is ``variant_of`` ``ssd`` with ``delay`` 1); ``delay_stage``:
    it has a delay stage after the SSGD warm-up (``k`` means something); ``warmup``: it has the
    warm-up at all. ``implementation(cfg)`` and ``reference(cfg)`` give ``"module:Name"`` of its
    class and of its reference twin for a resolved config; ``simulation`` the reference
    simulator that runs it. ``describe(cfg, workers)`` is the run's opening line's text;
    ``inspect(cfg)`` what ``ssdmpi ckpt inspect`` says of it after its name (``cfg``: a checkpoint's
    config mapping); ``label`` the parts of its plot label after the name (``"k={delay}"``: left out
    when a setting is unknown); ``variants`` named settings (``ssdmpi bench accuracy``, the GPU check,
    the tests), with ``rule_variant(rule_spec) -> (name, settings)`` the one of each period rule for an
    algorithm that has them, of which ``accuracy_defaults`` are in ``bench accuracy``'s default sweep
    (with the rules' own, ``RuleSpec.accuracy_default``); ``bench`` the
    settings a ``bench train`` variant gives after the name (``ssd:period:5``), of which the first
    ``bench_required`` must be given (None: all); ``bench_default``: ``bench train`` runs it unless told
    otherwise; ``pattern(cfg)`` its communication pattern in ``ssdmpi bench model``'s terms,
    ``(kind, k)``, or None; ``baseline``: the reference the benchmarks compare against; ``default``: it
    is the default ``--algo`` (one is);
    ``torch_peer``: the ``ssdmpi bench peers`` PyTorch peer that runs the same recipe;
    ``linear_map``: its ``LinearMap`` for the stability tool; ``check(run, world_size)`` its own
    whole-run check; ``workers(run, world_size)`` the ranks that train on data; ``outer_step(run)``: the run's
    merged averages land through the outer optimizer (``ssdmpi/optim/outer.py``, whose settings apply then;
    None: it has none).
    """

    name: str
    implementation: Callable
    reference: Callable
    describe: Callable
    settings: tuple = ()
    fixed: dict = field(default_factory=dict)
    variant_of: str | None = None
    why: str = ""
    delay_stage: bool = True
    warmup: bool = True
    simulation: str = "ssdmpi.verify.reference:Simulation"
    inspect: Callable = lambda cfg: ""
    label: tuple = ()
    variants: dict = field(default_factory=dict)
    rule_variant: Callable | None = None
    accuracy_defaults: tuple = ()
    bench: tuple = ()
    bench_required: int | None = None
    bench_default: bool = True
    pattern: Callable = lambda cfg: None
    baseline: bool = False
    default: bool = False
    torch_peer: str | None = None
    linear_map: LinearMap | None = None
    check: Callable | None = None
    workers: Callable = lambda run, world_size: world_size
    outer_step: Callable | None = None

    def uses(self, name: str) -> bool:
        """It can use setting ``name`` (given, or fixed to its value)."""
        return any(s.name == name for s in self.settings) or name in self.fixed

    def takes(self, name: str) -> bool:
        """Setting ``name`` can be given to it (it uses it, and does not fix it)."""
        return any(s.name == name for s in self.settings) and name not in self.fixed


@dataclass(frozen=True)
class RuleSpec:
    """One ``--period-rule`` of ``--comm period`` (a file of ``ssdmpi/algos/rules/``).

    ``implementation``: its ``PeriodRule`` class, built as ``implementation(state, **own)`` with the
    values of its own ``settings`` (declared here, applying only to it); ``reference``: ``"module:Name"``
    of its twin in the reference simulator; ``uses_local_update``: its delay stage steps with
    ``--local-update``; ``variant``: the settings of its ``period/<name>`` benchmark variant, in
    ``bench accuracy``'s default sweep when ``accuracy_default``; ``default``: it is the default rule
    (one rule is); ``auto_chooses``: its setting that ``--delay auto`` chooses with ``k`` (a merge delay:
    the iterations the allreduce has to hide behind; the choice keeps to the stable region of its
    ``linear_map``), None: ``--delay auto`` is refused; ``predating``: the values of its settings that a
    checkpoint written before they existed ran with (``{"setting": value}``); ``outer_step``: its merge adds
    the ranks' mean displacement to ``W``, which the outer optimizer may step instead
    (``ssdmpi/optim/outer.py``).
    """

    name: str
    implementation: type
    reference: str
    summary: str
    settings: tuple = ()
    uses_local_update: bool = False
    variant: dict = field(default_factory=dict)
    accuracy_default: bool = False
    default: bool = False
    auto_chooses: str | None = None
    linear_map: LinearMap | None = None
    predating: dict = field(default_factory=dict)
    outer_step: bool = False


@dataclass(frozen=True)
class OptimizerSpec:
    """One ``--optimizer`` (a file of ``ssdmpi/optim/optimizers/``): the inner optimizer every algorithm
    composes.

    ``implementation``: its ``ssdmpi.optim.part.Optimizer`` class, built as ``implementation(mask,
    **own)`` with the values of its ``settings``; ``defaults``: its own defaults of settings it shares
    with other optimizers (``weight_decay``); ``merges``: it has a momentum merge
    (``Optimizer.merge_mean_step``); ``default``: it is the default optimizer (one is).
    """

    name: str
    implementation: type
    summary: str
    settings: tuple = ()
    defaults: dict = field(default_factory=dict)
    merges: bool = False
    default: bool = False


def load(path: str):
    """The object ``"package.module:Name"`` names (implementations are imported when first built,
    so that reading the declarations stays light)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
