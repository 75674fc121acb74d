"""The variants of ``ssdmpi bench train`` (and ``bench peers``): one training configuration each,
written and named from the algorithms' specs (``ssdmpi/algos/registry.py``).

A variant is ``NAME[:V1[:V2]]``: an algorithm (``--algo NAME``) and the values of the settings its
spec lists in ``bench`` (``AlgorithmSpec.bench``), in order, those past ``bench_required`` optional
(their defaults); after ``auto`` (``--delay auto``) the ``--delay-max``; then any of the algorithm's or its
rule's other settings by their ``bench_tag`` (``d2``: ``--merge-delay 2``), each once. Examples:
``ssd:period:5``, ``localsgd:5``, ``asgd:2``, ``ssd:period:auto:8``, ``ssd:period:5:d2``, ``localsgd:8:f4:tau1``.
A variant's name joins the algorithm and each value's tag: ``ssd-period-k5``, ``ssd-period-kauto-max8``.

``default_variants(ks)``: the algorithms with ``bench_default``, in the registry's order (one that is
a ``variant_of`` another right after it), each bench setting with choices taking each choice (its
default first), ``delay`` each of ``ks``, any other its default. ``forms()`` and ``forms_text()``:
the forms a variant may take, for help texts and errors.
"""

from __future__ import annotations

import itertools
from argparse import ArgumentTypeError
from dataclasses import dataclass, field

from ssdmpi.algos import registry
from ssdmpi.errors import UserError

DELAY = "delay"            # the setting ``--delays`` gives the default variants
AUTO = "auto"              # ``--delay auto``: a delay chosen by the run
AUTO_MAX = "delay_max"     # the value a variant gives after ``auto``


@dataclass
class Variant:
    """One training configuration: a name, its algorithm and the settings its ``ssdmpi train`` flags give
    (``bench train`` variant ``ssd:period:5`` is ``ssd`` with ``comm: period, delay: 5``)."""

    name: str
    algo: str
    settings: dict = field(default_factory=dict)
    extra: tuple = ()              # more flags of its own (e.g. --progress thread)
    program: tuple = ("ssdmpi", "train")   # python -m PROGRAM (bench peers: its PyTorch peers)

    @property
    def spec(self):
        return registry.algorithm(self.algo)

    @property
    def by_ssdmpi(self) -> bool:
        """Trained by ``ssdmpi train`` (not by a peer that takes its flags)."""
        return self.program == ("ssdmpi", "train")

    @property
    def comm(self):
        return self.settings.get("comm")

    @property
    def k(self):
        """The delay k, given or fixed by the algorithm (``"auto"``: --delay auto), or None."""
        return self.settings.get(DELAY, self.spec.fixed.get(DELAY))

    @property
    def servers(self):
        """Parameter-server ranks, on top of the workers (an algorithm with servers)."""
        return self.settings.get("servers")

    def train_flags(self) -> list:
        return ["--algo", self.algo] + [part for name, value in self.settings.items()
                                        for part in (f"--{registry.SETTINGS[name].flag}", str(value))] \
            + list(self.extra)


def parse_variant(text: str) -> Variant:
    """``NAME[:V1[:V2]]`` -> ``Variant`` (the module docstring); ``UserError`` (one line, the forms) for
    anything else, or for settings the run would refuse."""
    name, *parts = text.strip().split(":")
    spec, given = registry.find(name), {}
    try:
        if spec is None:
            raise ValueError(text)
        required = len(spec.bench) if spec.bench_required is None else spec.bench_required
        if len(parts) < required:
            raise ValueError(text)
        for i, part in enumerate(parts):
            key = spec.bench[i] if i < len(spec.bench) else AUTO_MAX if given.get(DELAY) == AUTO and \
                AUTO_MAX not in given else _tagged(spec, part)
            s = registry.SETTINGS[key]
            if key in given:
                raise ValueError(text)
            part = part.removeprefix(s.bench_tag.split("{")[0]) if key not in spec.bench + (AUTO_MAX,) else part
            given[key] = s.type(part) if s.type else part
        registry.resolve({"algo": name, "warmup_steps": None, **given})    # what the run would refuse
    except (ValueError, UserError, ArgumentTypeError):
        raise UserError(f"--variants: {text!r} is not understood; use {forms_text()}") from None
    settings = {k: given.get(k, registry.SETTINGS[k].default) for k in spec.bench} | given
    tags = [registry.SETTINGS[k].bench_tag.format(v) for k, v in settings.items()]
    return Variant("-".join([name] + tags), name, settings)


def _tagged(spec, part: str) -> str:
    """The setting of ``spec`` whose ``bench_tag`` prefixes ``part`` (``d2``: ``d{}``)."""
    for setting in spec.settings:
        key = setting.name
        prefix = (registry.SETTINGS[key].bench_tag or "{").split("{")[0]
        if prefix and key not in spec.bench and part.startswith(prefix):
            return key
    raise ValueError(part)


def _ordered_specs() -> list:
    """Every algorithm's spec in the registry's order, one that is a ``variant_of`` another right after it."""
    specs = list(registry.ALGORITHMS.values())
    out = []
    for spec in specs:
        if spec.variant_of is None or spec.variant_of not in registry.ALGORITHMS:
            out += [spec] + [s for s in specs if s.variant_of == spec.name]
    return out


def _choices(name: str) -> tuple:
    """A setting's choices, its default first (empty for a setting without choices)."""
    s = registry.SETTINGS[name]
    return tuple(sorted(s.choices or (), key=lambda c: c != s.default))


def default_variants(ks) -> list:
    """The variants ``bench train`` runs unless told otherwise (the module docstring), for delays ``ks``."""
    out = []
    for spec in _ordered_specs():
        if not spec.bench_default:
            continue
        values = [list(ks) if n == DELAY else _choices(n) or (registry.SETTINGS[n].default,) for n in spec.bench]
        out += [parse_variant(":".join([spec.name, *map(str, combo)])) for combo in itertools.product(*values)]
    return out


def _accepts(algo: str, settings: dict) -> bool:
    """Whether a run of ``algo`` with ``settings`` resolves (``registry.resolve``)."""
    try:
        registry.resolve({"algo": algo, "warmup_steps": None, **settings})
    except (UserError, ValueError):
        return False
    return True


def forms() -> list:
    """``[(form, spec, settings with choices)]``: every variant form, e.g. ``("ssd:period:K", ssd,
    {"comm": "period"})``, each setting with choices spelt out and the others by their metavar."""
    out = []
    for spec in _ordered_specs():
        values = [_choices(n) or (None,) for n in spec.bench]
        for combo in itertools.product(*values):
            text = spec.name
            for n, choice in zip(spec.bench, combo):
                part = choice if choice is not None else (registry.SETTINGS[n].metavar or "V").split("|")[0]
                text += f":{part}"
            out.append((text, spec, {n: c for n, c in zip(spec.bench, combo) if c is not None}))
    return out


def forms_text() -> str:
    """The forms for a help text or an error: ``ssgd, ssd:period:K, ... (K: --delay, ...; ssd:period:K
    also takes auto ..., and ssd:period:K:dD (--merge-delay D with --period-rule delta-merge))``."""
    found = forms()
    metavars = {}
    for _, spec, _ in found:
        required = len(spec.bench) if spec.bench_required is None else spec.bench_required
        for i, n in enumerate(spec.bench):
            s = registry.SETTINGS[n]
            if not s.choices:
                optional = f" ({spec.name}: default {s.default} when left out)" if i >= required else ""
                metavars.setdefault((s.metavar or "V").split("|")[0], f"--{s.flag}{optional}")
    notes = [", ".join(f"{m}: {flag}" for m, flag in metavars.items())]
    max_setting = registry.SETTINGS[AUTO_MAX]
    auto = [":".join([spec.name, *given.values()]) for _, spec, given in found
            if DELAY in spec.bench and _accepts(spec.name, {**given, DELAY: AUTO})]
    if auto:
        notes.append(f"{' and '.join(auto)} also take{'s' if len(auto) == 1 else ''} {AUTO} or {AUTO}:M, M the "
                     f"--{max_setting.flag}")
    for text, spec, given in found:
        for s in spec.settings:
            if s.bench_tag and s.name not in spec.bench and s.name != AUTO_MAX and s.applies is None \
                    and _accepts(spec.name, {**given, s.name: s.default}):
                metavar = s.metavar or "V"
                notes.append(f"{text}:{s.bench_tag.format(metavar)} (--{s.flag} {metavar})")
        for rule in registry.RULES.values():
            for s in rule.settings:
                if s.bench_tag and _accepts(spec.name, {**given, registry.RULE_SELECTOR: rule.name,
                                                         s.name: s.default}):
                    metavar = s.metavar or "V"
                    notes.append(f"{text}:{s.bench_tag.format(metavar)} (--{s.flag} {metavar} with "
                                 f"--{registry.SETTINGS[registry.RULE_SELECTOR].flag} {rule.name})")
    return f"{', '.join(text for text, _, _ in found)} ({'; '.join(notes)})"
