"""What a setting, a training algorithm and a period rule declare (``ssdmpi/algos/registry.py``
holds the declarations and answers every question about them).

A ``Setting`` is one field of a run's configuration (field name = YAML key = ``--flag-name``):
its default, its check, its help, and, for the algorithm's settings, when it applies. An
``AlgorithmSpec`` (``--algo``) and a ``RuleSpec`` (``--period-rule``) name the settings they
use, their implementation, their twin in the reference simulator (``ssdmpi/algos/reference.py``)
and how the benchmarks name them. Nothing here imports NumPy: the command-line parser is
built from these declarations.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from ssdmpi.validate import choice, flag_name


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
    ``bench_tag``: how a benchmark variant's name shows it (``k{}``).
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
class AlgorithmSpec:
    """One ``--algo``.

    ``settings``: every algorithm setting it can use (those not listed are refused with ``why``);
    ``fixed``: settings it fixes (``odsgd`` is ``variant_of`` ``ssd`` with ``delay`` 1); ``delay_stage``:
    it has a delay stage after the SSGD warm-up (``k`` means something); ``warmup``: it has the
    warm-up at all. ``implementation(cfg)`` and ``reference(cfg)`` give ``"module:Name"`` of its
    class and of its reference twin for a resolved config; ``simulation`` the reference
    simulator that runs it. ``describe(cfg, workers)`` is the run's opening line's text;
    ``label`` the parts of its plot label after the name (``"k={delay}"``: left out when a setting is
    unknown); ``variants`` named settings
    (``ssdmpi bench accuracy``, the GPU check, the tests); ``bench`` the settings a ``bench
    train`` variant gives after the name (``ssd:period:5``), of which the first ``bench_required`` must
    be given (None: all); ``pattern(cfg)`` its communication
    pattern in ``ssdmpi bench model``'s terms, ``(kind, k)``, or None; ``baseline``: the
    reference the benchmarks compare against; ``check(run, world_size)`` its own whole-run check;
    ``workers(run, world_size)`` the ranks that train on data.
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
    simulation: str = "ssdmpi.algos.reference:Simulation"
    label: tuple = ()
    variants: dict = field(default_factory=dict)
    bench: tuple = ()
    bench_required: int | None = None
    pattern: Callable = lambda cfg: None
    baseline: bool = False
    check: Callable | None = None
    workers: Callable = lambda run, world_size: world_size

    def uses(self, name: str) -> bool:
        """It can use setting ``name`` (given, or fixed to its value)."""
        return name in self.settings or name in self.fixed

    def takes(self, name: str) -> bool:
        """Setting ``name`` can be given to it (it uses it, and does not fix it)."""
        return name in self.settings and name not in self.fixed


@dataclass(frozen=True)
class RuleSpec:
    """One ``--period-rule`` of ``--comm period`` (a file of ``ssdmpi/algos/rules/``).

    ``implementation``: its ``PeriodRule`` class; ``reference``: ``"module:Name"`` of its twin in
    the reference simulator; ``settings``: its own settings (declared here, applying only to it);
    ``uses_local_update``: its delay stage steps with ``--local-update``; ``variant``: the settings of
    its ``period/<name>`` benchmark variant; ``default``: it is the default rule (one rule is);
    ``auto_chooses``: its setting that ``--delay auto`` chooses with ``k`` (a merge delay: the
    iterations the allreduce has to hide behind; the choice keeps to the rule's stable region, its
    linear map of the same name in ``ssdmpi/algos/stability.py``), None: ``--delay auto`` is refused.
    """

    name: str
    implementation: type
    reference: str
    summary: str
    settings: tuple = ()
    uses_local_update: bool = False
    variant: dict = field(default_factory=dict)
    default: bool = False
    auto_chooses: str | None = None


def load(path: str):
    """The object ``"package.module:Name"`` names (implementations are imported when first built,
    so that reading the declarations stays light)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
