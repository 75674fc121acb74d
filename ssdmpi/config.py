"""The resolved training configuration: defaults < preset < YAML file < command-line flags.

``SETTINGS`` declares every setting of a run once (``ssdmpi.spec.Setting``: default,
check, help, flag): the data, the model, the run's length, the runtime and the run directory
here, the optimizer's and the algorithms' in the registry (``ssdmpi/algos/registry.py``).
``TrainConfig``, its ``validate()``, the ``ssdmpi train`` flags, the YAML keys, the resume rules
and the ``--help`` defaults are made from it. ``resolve(args)`` builds a ``TrainConfig`` from four
layers, each overriding the one before:

1. the defaults;
2. a preset (``--preset NAME``, default ``default``): ``ssdmpi/presets/NAME.yaml``;
3. a YAML file (``--config FILE``): a mapping of the same keys (``batch_size`` or
   ``batch-size``); unknown keys are an error;
4. the flags actually given on the command line.

When resuming (``--resume``), the checkpoint's own resolved config replaces layers 1-2
(unless ``--preset`` is given explicitly), so ``ssdmpi train --resume PATH --epochs 20``
continues the same run for longer. ``validate()`` checks every field and raises a
``UserError`` with a one-line message naming the option. The resolved config is written
to the run directory as ``config.yaml`` and into every checkpoint, and can be fed back
with ``--config`` to start a new run with the same settings: ``config.yaml`` records the
invocation's own settings (``run_dir``, ``stop_at_step``) as comments only, so the new run
gets its own directory. ``--print-config`` prints the resolution (``annotated_yaml``).

Imported when the CLI parser is built: no NumPy here.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import time
from importlib import resources

import yaml

from ssdmpi.algos import registry
from ssdmpi.algos.overlap import DEFAULT_BUCKET_BYTES
from ssdmpi.algos.registry import RESOLVED, AlgoConfig, Setting
from ssdmpi.comm.progress import DEFAULTS as PROGRESS_DEFAULTS
from ssdmpi.comm.progress import PROGRESS
from ssdmpi.comm.transport import TRANSPORTS
from ssdmpi.comm.watchdog import STALL_TIMEOUT_S
from ssdmpi.data.names import DATASETS
from ssdmpi.errors import UserError
from ssdmpi.optim.schedules import parse_schedule, schedule_in_steps
from ssdmpi.parsing import parse_list, parse_size
from ssdmpi.validate import did_you_mean, flag_name, is_int, nonnegative_int, number, positive_int

DATA, LENGTH, RUNTIME, RUN_DIR = "data and model", registry.OPTIMIZER, "runtime", "run directory, checkpoints, logging"


def _name(flag: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise UserError(f"--{flag} must be a name, got {value!r}")


def _text(flag: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise UserError(f"--{flag} must be a non-empty string, got {value!r}")


def _switch(flag: str, value) -> None:
    if not isinstance(value, bool):
        raise UserError(f"--{flag} must be true or false, got {value!r}")


def _augment(flag: str, value) -> None:
    from ssdmpi.data.augment import parse_augment  # late: it imports NumPy, and the CLI parser imports this

    if not isinstance(value, str):
        raise UserError(f"--{flag} must be a string like none, flip or crop4,flip; got {value!r}")
    parse_augment(value)


def _positive_ints(flag: str, value) -> None:
    if not isinstance(value, (list, tuple)) or not value or not all(is_int(w) and w > 0 for w in value):
        raise UserError(f"--{flag} must be positive integers like 256,128; got {value!r}")


def _widths(text: str) -> list:
    return parse_list(text, "--widths", int, minimum=1, example="256,128")


def _size(text: str) -> int:
    """``--bucket-size``'s type: bytes, or argparse's error naming the flag."""
    try:
        return parse_size(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


SWITCH = {"action": "store_const", "const": True}
SETTINGS = {s.name: s for s in (
    Setting("dataset", "digits", f"dataset: {' | '.join(DATASETS)} (see ssdmpi data list)", check=_name,
            group=DATA, structural=True),
    Setting("data_path", None, "where the dataset's files are", check=_text, metavar="PATH", group=DATA,
            default_text="the dataset's usual places"),
    Setting("augment", "none", "augmentation: none, flip, crop4 or crop4,flip", check=_augment, group=DATA),
    Setting("model", "mlp", "model: mlp, wide-mlp, lenet5, resnet20, gpt (ssdmpi.nn.MODELS), or "
            "package.module:factory (docs/API.md)", check=_name, group=DATA, structural=True),
    Setting("widths", None, "hidden widths of mlp", _widths, _positive_ints, metavar="W1,W2", group=DATA,
            default_text="the model's own", structural=True),
    Setting("dtype", "float32", "parameter dtype", choices=("float32", "float64"), group=DATA, structural=True),
    Setting("batch_size", 32, "batch size PER RANK", int, positive_int, metavar="B", group=LENGTH, structural=True),
    Setting("epochs", 20, "epochs to train", int, positive_int, group=LENGTH),
    Setting("steps", None, "iterations to train (overrides --epochs)", int, positive_int, group=LENGTH,
            default_text="--epochs decides"),
    *registry.SETTINGS.values(),
    Setting("device", "auto", "array backend", choices=("auto", "cpu", "gpu"), group=RUNTIME),
    Setting("threads", None, "BLAS/OpenMP threads per rank", int, positive_int, metavar="N", group=RUNTIME,
            default_text="usable CPUs on the node // ranks on it, unless OMP_NUM_THREADS, OPENBLAS_NUM_THREADS or "
                         "MKL_NUM_THREADS is set", inherited=False),
    Setting("gpu_id", None, "CUDA device of this rank", int, nonnegative_int, metavar="ID", group=RUNTIME,
            default_text="local rank mod the number of GPUs seen, unless the launcher bound one GPU per rank",
            inherited=False),
    Setting("progress", "auto", "who drives nonblocking allreduces: {choices}; auto = "
            + ", ".join(f"{k}: {v}" for k, v in PROGRESS_DEFAULTS.items()), choices=PROGRESS, group=RUNTIME),
    Setting("transport", "auto", "how GPU buffers reach MPI", choices=TRANSPORTS, group=RUNTIME),
    Setting("stall_timeout", STALL_TIMEOUT_S, "abort the job when one wait lasts longer than this", float,
            functools.partial(number, low=0.0, strict=True), metavar="SEC", group=RUNTIME),
    Setting("bucket_size", None, "split each allreduce into pieces of SIZE bytes, and post the gradient's during the "
            "backward pass in buckets of at least SIZE, layer by layer (e.g. 4M; K, M, G are powers of 1024)", _size,
            positive_int, metavar="SIZE", group=RUNTIME,
            default_text=f"one fused buffer; the gradient's during the backward pass in buckets of "
                         f"{DEFAULT_BUCKET_BYTES // 2**20}M (PyTorch DDP's)"),
    Setting("run_dir", None, "run directory", check=_text, metavar="DIR", group=RUN_DIR, inherited=False,
            invocation=True, default_text="runs/<timestamp>-<algo>, -2, -3, ... if taken"),
    Setting("checkpoint_every", 0, "checkpoint every N steps, besides each epoch's end and the end (0: only those)",
            int, nonnegative_int, metavar="STEPS", group=RUN_DIR),
    Setting("keep_checkpoints", 3, "keep the newest N checkpoints and best, last (0: all)", int, nonnegative_int,
            metavar="N", group=RUN_DIR),
    Setting("eval_every", 1, "evaluate every N epochs (0: at the end only)", int, nonnegative_int, metavar="EPOCHS",
            group=RUN_DIR),
    Setting("log_every", 10, "metrics line every N steps", int, positive_int, metavar="STEPS", group=RUN_DIR),
    Setting("seed", 0, "seed of initialisation, data order, augmentation", int, nonnegative_int, group=RUNTIME,
            structural=True),
    Setting("progress_bar", True, "plain periodic lines instead of a progress bar", check=_switch, group=RUN_DIR,
            argparse={"flag": "--no-progress-bar", "action": "store_const", "const": False},
            default_text="a bar on a terminal", inherited=False),
    Setting("tensorboard", False, "also write TensorBoard event files to RUN/tensorboard (needs tensorboardX)",
            check=_switch, group=RUN_DIR, argparse=SWITCH),
    Setting("csv", False, "also write steps.csv and evals.csv next to metrics.jsonl", check=_switch, group=RUN_DIR,
            argparse=SWITCH),
    Setting("stop_at_step", None, "checkpoint and exit with code 85 after step N (as if preempted)", int,
            positive_int, metavar="N", group=RUN_DIR, default_text="never", inherited=False, invocation=True),
)}
FIELD_NAMES = tuple(SETTINGS)
# Left None in a config until the run resolves them: the algorithm's settings, and the warm-up
# (given in steps or in epochs).
UNSET = (*RESOLVED, "warmup_steps")
STRUCTURAL = tuple(n for n, s in SETTINGS.items() if s.structural)
# Settings that replace each other (the first one set wins), checked as a pair on resume:
# the SSGD warm-up's length, and the run's length (``steps`` wins over ``epochs``).
WARMUP = ("warmup_steps", "warmup_epochs")
RUN_LENGTH = ("steps", "epochs")
# Learning-rate schedules whose every value depends on the run's length.
LENGTH_SCHEDULES = ("cosine", "poly")
INVOCATION = tuple(n for n, s in SETTINGS.items() if s.invocation)


class _Methods:
    """Every setting of one training run (field name = YAML key = ``--flag-name``; ``SETTINGS``)."""

    def validate(self):
        """Raise ``UserError`` (one line, naming the option) for the first bad setting."""
        for name, s in SETTINGS.items():
            s.validate(getattr(self, name))
        if self.warmup_steps is not None and self.warmup_epochs is not None:
            raise UserError("give --warmup-steps or --warmup-epochs, not both")
        return self

    def to_dict(self) -> dict:
        """Plain YAML/JSON-able mapping of every field."""
        d = dataclasses.asdict(self)
        if d["widths"] is not None:
            d["widths"] = list(d["widths"])
        return d

    def to_yaml(self) -> str:
        """The run's settings as YAML, reusable with ``--config`` for a new run; the invocation's own
        settings (``INVOCATION``: where this run lives, where it was told to stop) as comments, so that
        a saved ``config.yaml`` fed back starts a new run in a new directory."""
        d = self.to_dict()
        mine = {k: v for k in INVOCATION if (v := d.pop(k)) is not None}
        text = yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
        if mine:
            text += "# this invocation's own, not read back by --config (give them as flags):\n"
            text += "".join(f"#   {line}\n" for line in yaml.dump(mine, Dumper=_Dumper, sort_keys=False,
                                                                   default_flow_style=False).splitlines())
        return text

    def warmup_iterations(self, steps_per_epoch: int) -> int:
        """``T_w`` in iterations (``warmup_epochs`` converted with this run's epoch length)."""
        if self.warmup_epochs is not None:
            return int(round(self.warmup_epochs * steps_per_epoch))
        return int(SETTINGS["warmup_steps"].default if self.warmup_steps is None else self.warmup_steps)

    def total_steps(self, steps_per_epoch: int) -> int:
        """Length of the run in iterations."""
        return int(self.steps) if self.steps is not None else int(self.epochs) * int(steps_per_epoch)


class _Dumper(yaml.SafeDumper):   # one line per setting, lists inline: widths: [256, 128]
    pass


_Dumper.add_representer(list, lambda dumper, v: dumper.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
TrainConfig = dataclasses.make_dataclass(
    "TrainConfig", [(n, object, dataclasses.field(default=None if n in UNSET else s.default))
                    for n, s in SETTINGS.items()],
    bases=(_Methods,), namespace={"__doc__": _Methods.__doc__, "__module__": __name__})


# --- the command line ------------------------------------------------------------------------

def _show(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def default_help(name: str, presets: dict) -> str:
    """``"default: ..."`` for the setting ``name``, as a run with no flags resolves it: the default
    preset's value if it has one, else the setting's default; and which other presets set their own."""
    base = presets.get("default", {})
    others = [p for p, values in presets.items() if p != "default" and name in values]
    if name in base:
        text = f"default: {_show(base[name])}, from the default preset"
        return text + (f"; preset {', '.join(others)} set{'s its' if len(others) == 1 else ' their'} own"
                       if others else "")
    s = SETTINGS[name]
    value = registry.default_text(name) if name in registry.SETTINGS else s.default_text or _show(s.default)
    return f"default: {value}" + (f"; set by preset {', '.join(others)}" if others else "")


def add_arguments(parser) -> None:
    """The ``ssdmpi train`` flags, one per setting. Every default is None: only flags actually given
    override. The help of each flag states the default a run without it gets (``default_help``)."""
    presets = {p: load_preset(p) for p in list_presets()}
    g = parser.add_argument_group("configuration")
    g.add_argument("--config", metavar="FILE",
                   help="YAML file of settings (keys as below, e.g. batch_size: 64) (default: none)")
    g.add_argument("--preset", metavar="NAME",
                   help=f"named preset: {', '.join(presets) or 'default'} (default: default)")
    g.add_argument("--print-config", action="store_true",
                   help="print the resolved settings (preset < --config FILE < flags) as YAML and exit; "
                        "writes nothing, trains nothing")
    groups, exclusive = {}, {}
    for name, s in SETTINGS.items():
        g = groups.get(s.group) or groups.setdefault(s.group, parser.add_argument_group(s.group))
        options = {k: v for k, v in s.argparse.items() if k not in ("flag", "group")}
        if "group" in s.argparse:
            g = exclusive.get(s.argparse["group"]) or exclusive.setdefault(s.argparse["group"],
                                                                           g.add_mutually_exclusive_group())
        choices = " | ".join(s.choices) if s.choices else ""
        head = s.help.format(choices=choices) if "{choices}" in s.help else f"{s.help}: {choices}" if choices \
            else s.help
        g.add_argument(s.argparse.get("flag", f"--{s.flag}"), dest=name, default=None, metavar=s.metavar,
                       **({"type": s.type} if s.type else {}), **options,
                       help=f"{head} ({default_help(name, presets)})".replace("%", "%%"))
    groups[RUN_DIR].add_argument("--resume", metavar="auto|PATH",
                                 help="auto: newest valid checkpoint of --run-dir (fresh start if none); "
                                      "PATH: a checkpoint file or a run directory (default: a fresh run)")


# --- presets and files --------------------------------------------------------------------------

def list_presets() -> list:
    """Names of the built-in presets."""
    return sorted(p.name[:-5] for p in resources.files("ssdmpi").joinpath("presets").iterdir()
                  if p.name.endswith(".yaml"))


def load_preset(name: str) -> dict:
    """The settings of preset ``name``; ``UserError`` if there is no such preset."""
    names = list_presets()
    if name not in names:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(names)}")
    text = resources.files("ssdmpi").joinpath("presets", f"{name}.yaml").read_text(encoding="utf-8")
    return normalise(_parse_yaml(text, f"preset {name}"), f"preset {name}")


def load_file(path: str) -> dict:
    """The settings of a YAML config file; ``UserError`` if unreadable, malformed or with unknown keys."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UserError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    return normalise(_parse_yaml(text, path), path)


def _parse_yaml(text: str, where: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserError(f"{where}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of settings (key: value), got {type(data).__name__}")
    return data


def normalise(data: dict, where: str) -> dict:
    """Keys with dashes or underscores -> field names (unknown keys are an error); values as the
    flags would give them (``widths: 64,32``, ``bucket_size: 4M``)."""
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name == "no_progress_bar":
            name, value = "progress_bar", not value
        if name not in SETTINGS:
            raise UserError(f"{where}: unknown setting {key!r}{did_you_mean(name, FIELD_NAMES)}; "
                            "see ssdmpi train --help for the settings")
        if name == "widths":
            value = _widths(value) if isinstance(value, str) else [value] if is_int(value) else value
        if name == "bucket_size" and isinstance(value, str):
            try:
                value = parse_size(value)
            except UserError as exc:
                raise UserError(f"{where}: bucket_size: {exc}") from None
        out[name] = value
    return out


def from_flags(args) -> dict:
    """The settings actually given on the command line (argparse defaults are None)."""
    return {name: value for name in FIELD_NAMES if (value := getattr(args, name, None)) is not None}


def merge(base: dict, override: dict) -> dict:
    """``base`` updated by ``override`` (warm-up given one way clears the other)."""
    merged = dict(base)
    merged.update(override)
    for given, other in (("warmup_epochs", "warmup_steps"), ("warmup_steps", "warmup_epochs")):
        if override.get(given) is not None and other not in override:
            merged[other] = None
    return merged


def build(settings: dict):
    """A validated ``TrainConfig`` from a mapping of field names."""
    unknown = set(settings) - set(FIELD_NAMES)
    if unknown:
        raise UserError(f"unknown setting {sorted(unknown)[0]!r}")
    cfg = TrainConfig(**settings)
    if isinstance(cfg.widths, tuple):
        cfg.widths = list(cfg.widths)
    return cfg.validate()


def resolve(args, checkpoint_config: dict | None = None):
    """The run's config from defaults, preset, ``--config`` file and flags (see module docstring).

    ``checkpoint_config``: the config stored in the checkpoint being resumed; it replaces the
    defaults and the default preset (``check_resume`` then checks the structural settings).
    """
    defaults = TrainConfig().to_dict()
    preset_name = getattr(args, "preset", None)
    if checkpoint_config is not None:
        inherited = {k: v for k, v in checkpoint_settings(checkpoint_config).items() if SETTINGS[k].inherited}
        base = merge(defaults, inherited)
        if preset_name is not None:
            base = merge(base, load_preset(preset_name))
    else:
        base = merge(defaults, load_preset(preset_name or "default"))
    if getattr(args, "config", None):
        base = merge(base, load_file(args.config))
    return build(merge(base, from_flags(args)))


def checkpoint_settings(checkpoint_config: dict) -> dict:
    """A checkpoint's config as field names (``normalise``), with the value that reproduces what it
    ran for an algorithm setting added after it was written (``registry.predating_values``)."""
    old = normalise(dict(checkpoint_config), "checkpoint config")
    return {**old, **registry.predating_values(old)}


def soft_settings(args) -> set:
    """Algorithm settings (and ``widths``) that came from a preset or checkpoint, not from the
    user's file or flags. The trainer drops those that do not apply to the chosen ``--algo``
    (or ``--model``) instead of failing: ``--model resnet20`` with the default preset's widths.
    """
    given = set(from_flags(args))
    if getattr(args, "config", None):
        given |= set(load_file(args.config))
    return {k for k in RESOLVED + ("widths",) if k not in given}


def check_resume(old: dict, cfg) -> None:
    """``UserError`` if a structural setting differs from the checkpoint's (``old``) config, if
    the SSGD warm-up changed (the switch to the delay stage cannot move: resumed past a new
    switch point the run would stay SSGD, or count its local steps from a negative ``m``), or
    if the run's length changed under a schedule that depends on it (``cosine``, ``poly``: the
    lr would jump at the resume point and the run would match neither length's run)."""
    old = checkpoint_settings(old)
    for name in STRUCTURAL:
        if name in old and old[name] != getattr(cfg, name):
            raise UserError(f"the checkpoint was trained with {SETTINGS[name].flag}={old[name]!r} but this run asks "
                            f"for {getattr(cfg, name)!r}; drop that setting or start a new run directory")
    was, now = _first_set(old, WARMUP), _first_set(cfg.to_dict(), WARMUP)
    if was != now:
        raise UserError(f"the checkpoint was trained with {_as_flag(*was)} but this run asks for {_as_flag(*now)}: a "
                        "resumed run cannot move the switch from the SSGD warm-up to the delay stage; drop that "
                        "setting or start a new run directory")
    was, now = _first_set(old, RUN_LENGTH), _first_set(cfg.to_dict(), RUN_LENGTH)
    for name in ("lr_schedule", "local_lr_schedule"):
        spec = getattr(cfg, name)
        if was != now and spec is not None and old.get(name) == spec and parse_schedule(spec)[0] in LENGTH_SCHEDULES:
            raise UserError(f"--{flag_name(name)} {spec} spreads its decay over the whole run: the checkpoint was "
                            f"trained for {_as_flag(*was)}, and resuming it for {_as_flag(*now)} would make the lr "
                            f"jump at the resume point (matching neither run); keep {_as_flag(*was)}, or train for "
                            f"{_as_flag(*now)} from the start in a new run directory")


def _first_set(settings: dict, names: tuple) -> tuple:
    """``(name, value)`` of the first of ``names`` set in ``settings`` (they replace each other),
    ``(names[0], None)`` when none is."""
    for name in names:
        if settings.get(name) is not None:
            return name, settings[name]
    return names[0], None


def _as_flag(name: str, value) -> str:
    return f"--{flag_name(name)} {_show(value)}" if value is not None else f"no --{flag_name(name)}"


def changed_settings(old: dict, cfg) -> list:
    """``["lr: 0.1 -> 0.05", ...]``: non-structural settings that differ from a checkpoint's config."""
    new = cfg.to_dict()
    skip = set(STRUCTURAL) | set(INVOCATION) | {"progress_bar"}
    return [f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in FIELD_NAMES
            if k not in skip and k in old and old.get(k) != new[k]]


def default_run_dir(cfg, when=None) -> str:
    """``runs/<YYYYmmdd-HHMMSS>-<algo>`` under the current directory."""
    return os.path.join("runs", f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}-{cfg.algo}")


# --- from a TrainConfig to the algorithm's settings ------------------------------------------------

def algorithm_values(cfg, soft: set, world_size: int | None = None, warmup_steps: int | None = None):
    """``(values, run)``: ``cfg``'s algorithm settings, less those of ``soft`` (from a preset or a
    checkpoint, ``soft_settings``) that do not apply to its ``--algo``, dropped one at a time in
    ``RESOLVED`` order (``--preset cifar10-resnet20 --algo ssgd`` is fine), and their resolution
    (``registry.resolve``). The user's own inapplicable settings are the ``UserError`` of the run.
    ``warmup_steps``: the warm-up in iterations when known (None: ``cfg``'s, if given in steps)."""
    values = {n: getattr(cfg, n) for n in registry.SETTINGS}
    values["warmup_steps"] = cfg.warmup_steps if warmup_steps is None else warmup_steps
    for key in [None] + [k for k in RESOLVED if k in soft]:
        if key is not None:
            values[key] = None
        try:
            return values, registry.resolve(values, world_size)
        except UserError:
            continue
    return values, registry.resolve(values, world_size)   # raises the error about the user's own settings


def algo_config(cfg, soft: set, steps_per_epoch: int, total_steps: int, world_size: int) -> AlgoConfig:
    """The resolved ``AlgoConfig`` of ``cfg`` (epochs converted to steps with ``steps_per_epoch``;
    inapplicable preset settings dropped, ``algorithm_values``)."""
    E, warmup = steps_per_epoch, cfg.warmup_iterations(steps_per_epoch)
    values, _ = algorithm_values(cfg, soft, world_size, warmup)
    given = {f.name for f in dataclasses.fields(AlgoConfig)} - {"lr_schedule", "local_lr_schedule"}
    return AlgoConfig(**{k: v for k, v in values.items() if k in given}, total_steps=total_steps,
                      lr_schedule=schedule_in_steps(cfg.lr_schedule, E),
                      lr_warmup_steps=int(round(cfg.lr_warmup_epochs * E)),
                      local_lr_schedule=None if values["local_lr_schedule"] is None
                      else schedule_in_steps(cfg.local_lr_schedule, E, "local-lr-schedule")).validate(world_size)


def applicable(cfg, soft: set):
    """A copy of ``cfg`` without the preset's algorithm settings (``soft``) that do not apply to its
    ``--algo`` (what ``--print-config`` shows, so that its output fed back with ``--config`` still runs)."""
    values, _ = algorithm_values(cfg, soft)
    return dataclasses.replace(cfg, **{k: values[k] for k in RESOLVED})


def resolved_settings(cfg, algo_cfg: AlgoConfig):
    """A copy of ``cfg`` with the algorithm's resolved defaults written in (what config.yaml records)."""
    out = dataclasses.replace(cfg, **{k: getattr(algo_cfg, k) for k in registry.RECORDED})
    if out.warmup_epochs is None:
        out.warmup_steps = int(algo_cfg.warmup_steps)
    return out


def data_ranks(cfg, world_size: int, soft: set = frozenset()) -> int:
    """How many ranks train on data (all but asgd's servers; ``UserError`` on a world too small)."""
    _, run = algorithm_values(cfg, soft, world_size)
    return run.spec.workers(run, world_size)


def communicator_options(cfg) -> dict:
    """Keyword arguments of ``Communicator`` for this run: ``Communicator(**communicator_options(cfg))``."""
    return {"progress": cfg.progress, "transport": cfg.transport, "stall_timeout": cfg.stall_timeout,
            "bucket_bytes": cfg.bucket_size}


# --- --print-config -----------------------------------------------------------------------------------

def _comments(cfg) -> dict:
    """``{setting: comment}`` for the algorithm settings ``cfg`` leaves unset: its ``--algo``'s default,
    or that this run does not use it (``registry.where``); {} when they do not resolve."""
    try:
        run = registry.resolve({n: getattr(cfg, n) for n in registry.SETTINGS})
    except UserError:
        return {}
    out = {}
    for key in RESOLVED:
        if getattr(cfg, key) is None:
            applies = key in run.applied
            out[key] = (f"not used by this run (only with {registry.where(key)})" if not applies
                        else f"default: {registry.default_text(key)}" if run[key] is None
                        else f"the default for --optimizer {run.optimizer}" if registry.SETTINGS[key].group ==
                        registry.OPTIMIZER and key != "optimizer" else "the default" if key == "optimizer"
                        else f"the default for --algo {cfg.algo}")
    if cfg.warmup_steps is None and cfg.warmup_epochs is not None:
        out["warmup_steps"] = "unset, --warmup-epochs decides"
    return out


def as_recorded(cfg):
    """``cfg`` as the run will record it in config.yaml (``resolved_settings``), resolved without the
    data: the algorithm's defaults written in (``--print-config`` prints this)."""
    try:
        run = registry.resolve({n: getattr(cfg, n) for n in registry.SETTINGS})
    except UserError:
        return cfg
    out = dataclasses.replace(cfg, **{k: run[k] for k in registry.RECORDED})
    if out.warmup_epochs is None:
        out.warmup_steps = cfg.warmup_iterations(1)
    return out


def annotated_yaml(cfg) -> str:
    """The settings a run of ``cfg`` uses, as YAML valid as a ``--config`` file: ``as_recorded(cfg)``,
    with a comment after each setting the algorithm chose (its default for ``--algo``) and after
    each left unset (``null``) saying what a run gets instead, or that this run does not use it."""
    presets = {p: load_preset(p) for p in list_presets()}
    lines = ["# ssdmpi train: resolved settings (defaults < preset < --config file < flags)"]
    comments = _comments(cfg)
    for line in as_recorded(cfg).to_yaml().splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in comments and (value == "null") != comments[key].startswith("the default"):
            line += f"   # {comments[key]}"
        elif sep and value == "null" and key in SETTINGS:
            line += f"   # default: {SETTINGS[key].default_text or default_help(key, presets)}"
        lines.append(line)
    if cfg.run_dir is None:
        lines.append(f"# run_dir: {default_help('run_dir', presets)}")
    return "\n".join(lines) + "\n"
