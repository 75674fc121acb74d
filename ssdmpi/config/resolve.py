"""A run's configuration resolved once: defaults < preset < ``--config FILE`` < flags, into a frozen
``TrainConfig``.

``Request`` is what a start asks for: the settings given on its command line (or by
``ssdmpi.train``), a config file, a preset, what to resume. ``resolve(request, checkpoint_config,
world_size)`` layers them, each over the one before:

1. the defaults;
2. a preset (``preset``, default ``default``): ``ssdmpi/presets/NAME.yaml``; when resuming, the
   checkpoint's own config replaces layers 1-2 (unless a preset is given);
3. a YAML file (``config_file``);
4. the settings given (``flags``).

Every value is checked; an error for a value from a file names the file and the key
(``my.yaml: lr must be > 0.0, got -1``). The algorithm's and optimizer's settings are resolved by the
registry, once (``registry.resolve``): a given setting that does not apply to the chosen algorithm is
refused; one from a preset, a file or a checkpoint is left out, with a note (``Resolved.notes``). The
result is the one object the trainer, the algorithm (``algo_config``: the same settings in steps), the
checkpoint and the Python API read. Imported when the CLI parser is built: no NumPy.
"""

from __future__ import annotations

import dataclasses
import os
import time

from ssdmpi.algos import registry
from ssdmpi.algos.registry import RESOLVED, AlgoConfig
from ssdmpi.config.files import load_file, load_preset, normalise
from ssdmpi.config.flags import from_flags
from ssdmpi.config.resume import checkpoint_settings
from ssdmpi.config.settings import CLEARS, CONTEXT, DEFAULT_CONTEXT, FIELD_NAMES, MODEL_SETTINGS, SETTINGS, TrainConfig
from ssdmpi.errors import UserError
from ssdmpi.optim.schedules import schedule_in_steps

GIVEN = "flag"      # the source of a value given on the command line or to ssdmpi.train
CHECKPOINT = "the checkpoint's config"


def _not_the_users(source: str) -> bool:
    """A value neither given nor in the user's file: a default, a preset's, a checkpoint's."""
    return source in ("default", CHECKPOINT) or source.startswith("preset ")


@dataclasses.dataclass(frozen=True)
class Request:
    """What one start asks for: ``flags`` the settings given (field names; refused where they do not
    apply), ``config_file`` a YAML file, ``preset`` a preset's name (None: ``default``, or the
    checkpoint's config when resuming), ``resume`` ``"auto"`` or a path (None: a fresh run)."""

    flags: dict = dataclasses.field(default_factory=dict)
    config_file: str | None = None
    preset: str | None = None
    resume: str | None = None

    @classmethod
    def from_args(cls, args) -> Request:
        """The request of ``ssdmpi train ARGS`` (an argparse namespace of ``add_arguments``)."""
        return cls(from_flags(args), getattr(args, "config", None), getattr(args, "preset", None),
                   getattr(args, "resume", None))


@dataclasses.dataclass(frozen=True)
class Resolved:
    """``resolve``'s result: the frozen ``config``, ``sources`` (``{setting: where its value came from}``:
    ``default``, ``preset NAME``, the file's path, ``the checkpoint's config``, ``flag``) and ``notes``
    (one line for each setting left out because it does not apply), ``applied`` (the algorithm's and
    optimizer's settings that apply to it), ``dropped`` (those left out)."""

    config: TrainConfig
    sources: dict
    notes: tuple
    applied: frozenset = frozenset()
    dropped: frozenset = frozenset()
    model_note: str | None = None

    def lines(self) -> tuple:
        """The note lines a run prints: the algorithm's settings left out (``note``), the model's (``model_note``)."""
        return tuple(line for line in (self.note(), self.model_note) if line)

    def note(self) -> str | None:
        """The one line a run prints for the settings left out (None: none was)."""
        if not self.dropped:
            return None
        by_source = {}
        for name in sorted(self.dropped, key=list(SETTINGS).index):
            by_source.setdefault(self.sources.get(name, GIVEN), []).append(name)
        parts = "; ".join(f"{source}: {', '.join(names)}" for source, names in by_source.items())
        return f"left out, not used by --algo {self.config.algo}: {parts} (ssdmpi train --print-config says why)"


def _layers(request: Request, checkpoint_config: dict | None) -> list:
    """``[(source, settings)]`` in the order they apply."""
    out = [("default", TrainConfig().to_dict())]
    if checkpoint_config is not None:
        inherited = {k: v for k, v in checkpoint_settings(checkpoint_config).items() if SETTINGS[k].inherited}
        out.append((CHECKPOINT, inherited))
        if request.preset is not None:
            out.append((f"preset {request.preset}", load_preset(request.preset)))
    else:
        name = request.preset or "default"
        out.append((f"preset {name}", load_preset(name)))
    if request.config_file:
        out.append((request.config_file, load_file(request.config_file)))
    out.append((GIVEN, normalise(dict(request.flags), "ssdmpi train")))
    return out


def merge(layers: list) -> tuple[dict, dict]:
    """``(values, sources)`` of ``layers`` applied in order; a layer that sets one of a ``CLEARS`` pair
    clears the other."""
    values, sources = {}, {}
    for source, settings in layers:
        for name, value in settings.items():
            values[name], sources[name] = value, source
        for pair in CLEARS:
            for given, other in (pair, pair[::-1]):
                if settings.get(given) is not None and other not in settings:
                    values[other], sources[other] = None, source
    return values, sources


def _check(name: str, value, source: str) -> None:
    """``Setting.validate``, its error naming the file and the key for a value that came from a file."""
    try:
        SETTINGS[name].validate(value)
    except UserError as exc:
        if source == GIVEN:
            raise
        message = str(exc).replace(f"--{SETTINGS[name].flag}", name, 1)
        raise UserError(f"{source}: {message}") from None


def resolve_values(values: dict, sources: dict, world_size: int | None = None) -> Resolved:
    """The frozen config of merged ``values`` (see ``resolve``)."""
    unknown = set(values) - set(FIELD_NAMES)
    if unknown:
        raise UserError(f"unknown setting {sorted(unknown)[0]!r}")
    for name, value in values.items():
        _check(name, value, sources.get(name, GIVEN))
    soft = {n: sources[n] for n in registry.SETTINGS if values.get(n) is not None and sources.get(n, GIVEN) != GIVEN}
    run = registry.resolve({n: values.get(n) for n in registry.SETTINGS}, world_size, soft)
    out = dict(values)
    for name in RESOLVED:
        given = values.get(name) is not None and name not in run.dropped
        # a default the run decides when it starts (the local lr: world size x lr) is not written in
        out[name] = run[name] if given or SETTINGS[name].derive is None else None
    if out.get("warmup_steps") is None and out.get("warmup_epochs") is None:
        out["warmup_steps"] = SETTINGS["warmup_steps"].default
    if out.get("widths") is not None and out.get("model") != "mlp" and _not_the_users(sources.get("widths", GIVEN)):
        out["widths"] = None      # the preset's mlp widths; this model has its own shape
    if isinstance(out.get("widths"), tuple):
        out["widths"] = list(out["widths"])
    model_notes, model_note = fit_model_settings(out, sources)
    return Resolved(TrainConfig(**out).validate(), dict(sources), tuple(run.notes) + model_notes,
                    frozenset(run.applied), frozenset(run.dropped), model_note)


def _is_text(dataset) -> bool | None:
    """Whether ``dataset`` names a text dataset (None: no dataset ssdmpi knows, e.g. arrays given to the API)."""
    from ssdmpi.data.datasets import dataset_kind  # late: NumPy; the CLI parser imports this module

    try:
        return dataset_kind(dataset) == "text"
    except UserError:
        return None


def _declared_options() -> dict:
    """``{model name: the options its factory declares}`` of ``ssdmpi.nn.MODELS``; a model not in it
    (``package.module:factory``) is left to its factory, which decides when it is built."""
    import inspect

    from ssdmpi.nn.models import MODELS  # late, as above

    return {name: frozenset(inspect.signature(factory).parameters) for name, factory in MODELS.items()}


def fit_model_settings(out: dict, sources: dict) -> tuple[tuple, str | None]:
    """The model's settings fitted to the run, in ``out`` (the merged values): ``context`` only with a
    text dataset (``DEFAULT_CONTEXT`` there when unset), each of ``MODEL_SETTINGS`` only for a model
    whose factory declares it. One that does not apply is refused when given as a flag (``UserError``),
    left out otherwise; returns ``(per-setting notes, the run's note line or None)``."""
    model, dataset = out.get("model"), out.get("dataset")
    text, declared = _is_text(dataset), _declared_options()
    unused = [(CONTEXT, f"--dataset {dataset}", f"is the window length of a text dataset, and {dataset} is not "
                                                 "one")] if text is False else []
    if isinstance(model, str) and model in declared:
        unused += [(s, f"--model {model}", "applies to --model " + " or ".join(m for m in declared
                                                                               if s.name in declared[m])
                    + f", not to {model}") for s in MODEL_SETTINGS if s.name not in declared[model]]
    left, notes = {}, []
    for setting, where, what in unused:
        if out.get(setting.name) is None:
            continue
        source = sources.get(setting.name, GIVEN)
        if source == GIVEN:
            raise UserError(f"--{setting.flag} {what}: drop it")
        out[setting.name] = None
        left.setdefault(where, {}).setdefault(source, []).append(setting.name)
        notes.append(f"{setting.name}: left out, not used with {where} ({source})")
    if text and out.get("context") is None:
        out["context"] = DEFAULT_CONTEXT
    if not left:
        return (), None
    parts = "; ".join(f"not used with {where}: " + "; ".join(f"{source}: {', '.join(names)}"
                                                           for source, names in by_source.items())
                      for where, by_source in left.items())
    return tuple(notes), f"left out, {parts}"


def resolve(request, checkpoint_config: dict | None = None, world_size: int | None = None) -> TrainConfig:
    """The run's frozen config (``resolve_request``'s ``config``); ``request``: a ``Request``, or the
    argparse namespace of ``ssdmpi train``."""
    return resolve_request(request, checkpoint_config, world_size).config


def resolve_request(request, checkpoint_config: dict | None = None, world_size: int | None = None) -> Resolved:
    """``request`` (a ``Request`` or ``ssdmpi train``'s namespace) resolved over the defaults, its preset
    (or ``checkpoint_config``, the config of the checkpoint it resumes) and its file, for ``world_size``
    ranks (None: not known yet, e.g. ``--print-config``). ``UserError`` (one line) on a bad value."""
    return resolve_values(*merge(_layers(as_request(request), checkpoint_config)), world_size)


def as_request(request) -> Request:
    """``request`` itself, or the ``Request`` of ``ssdmpi train``'s argparse namespace."""
    return request if isinstance(request, Request) else Request.from_args(request)


def algo_config(cfg: TrainConfig, steps_per_epoch: int, total_steps: int, world_size: int) -> AlgoConfig:
    """``cfg``'s algorithm settings in steps (epochs converted with ``steps_per_epoch``), for
    ``world_size`` ranks: the algorithm's config, already resolved (``registry.complete`` fills in the
    defaults that depend on the run and checks the warm-up in steps; nothing is resolved again)."""
    E = steps_per_epoch
    values = {n: getattr(cfg, n) for n in registry.SETTINGS}
    values["warmup_steps"] = cfg.warmup_iterations(E)
    values.update(registry.complete(values, world_size))
    fields = {f.name for f in dataclasses.fields(AlgoConfig)}
    algo = AlgoConfig(**{k: v for k, v in values.items() if k in fields and k not in ("lr_schedule",
                                                                                      "local_lr_schedule")},
                      total_steps=total_steps, lr_schedule=schedule_in_steps(cfg.lr_schedule, E),
                      lr_warmup_steps=int(round(cfg.lr_warmup_epochs * E)),
                      local_lr_schedule=None if cfg.local_lr_schedule is None
                      else schedule_in_steps(cfg.local_lr_schedule, E, "local-lr-schedule"), resolved=True)
    algo.global_schedule()
    algo.local_schedule()
    return algo


def recorded(cfg: TrainConfig, algo: AlgoConfig) -> TrainConfig:
    """What ``config.yaml`` records: ``cfg`` with the warm-up in steps when it was not given in epochs."""
    return cfg if cfg.warmup_epochs is not None else dataclasses.replace(cfg, warmup_steps=int(algo.warmup_steps))


def communicator_options(cfg) -> dict:
    """Keyword arguments of ``Communicator`` for this run: ``Communicator(**communicator_options(cfg))``."""
    return {"progress": cfg.progress, "transport": cfg.transport, "stall_timeout": cfg.stall_timeout,
            "bucket_bytes": cfg.bucket_size}


def default_run_dir(cfg, when=None) -> str:
    """``runs/<YYYYmmdd-HHMMSS>-<algo>`` under the current directory."""
    return os.path.join("runs", f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}-{cfg.algo}")
