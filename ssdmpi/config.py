"""The resolved training configuration: defaults < preset < YAML file < command-line flags.

``TrainConfig`` is one flat dataclass holding every setting of a training run. It is
built by ``resolve(args)`` from four layers, each overriding the one before:

1. the dataclass defaults below;
2. a preset (``--preset NAME``, default ``default``): ``ssdmpi/presets/NAME.yaml``;
3. a YAML file (``--config FILE``): a mapping of the same keys (``batch_size`` or
   ``batch-size``); unknown keys are an error;
4. the flags actually given on the command line.

When resuming (``--resume``), the checkpoint's own resolved config replaces layers 1-2
(unless ``--preset`` is given explicitly), so ``ssdmpi train --resume PATH --epochs 20``
continues the same run for longer. ``validate()`` checks every field and raises a
``UserError`` with a one-line message naming the option. The resolved config is written
to the run directory as ``config.yaml`` and into every checkpoint, and can be fed back
with ``--config``.

This module is imported when the CLI parser is built: keep its top-level imports light.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, fields

from ssdmpi.errors import UserError


ALGOS = ("ssgd", "ssd", "odsgd", "localsgd")
COMMS = ("step", "period")
LOCAL_UPDATES = ("global-momentum", "glu-paper", "sgd")
DEVICES = ("auto", "cpu", "gpu")
PROGRESS = ("auto", "test", "thread", "blocking")
TRANSPORTS = ("auto", "cuda-aware", "host")
DTYPES = ("float32", "float64")

# Settings that decide the shape of the state or the meaning of every step: a resumed
# run must not change them (the checkpoint would not fit, or "continue" would be a lie).
STRUCTURAL = ("dataset", "model", "widths", "dtype", "batch_size", "algo", "delay", "comm",
              "local_update", "period_rule", "seed")


@dataclass
class TrainConfig:
    """Every setting of one training run (field name = YAML key = ``--flag-name``)."""

    # data
    dataset: str = "digits"            # a name ssdmpi.data.load_dataset knows
    data_path: str | None = None       # where its files are (None: the dataset's default places)
    augment: str = "none"              # none | flip | crop4 | crop4,flip (pad-4 random crop + flip)
    # model
    model: str = "mlp"                 # a name in ssdmpi.nn.MODELS
    widths: list | None = None         # hidden widths of mlp (None: the model's default)
    dtype: str = "float32"
    # length of the run (steps wins over epochs when both are set)
    batch_size: int = 32               # per rank
    epochs: int = 20
    steps: int | None = None
    # global optimizer (ALGORITHM.md section 3)
    lr: float = 0.1
    lr_schedule: str = "constant"      # constant | step:EPOCHS[:GAMMA] | multistep:E1,E2[:GAMMA] | cosine | poly[:POWER]
    lr_warmup_epochs: float = 0.0      # linear learning-rate warm-up of the global lr
    momentum: float = 0.9
    weight_decay: float = 1e-4
    # algorithm (ALGORITHM.md sections 1, 4, 5). None: the algorithm's own default (see
    # ssdmpi.algos.config); a setting that does not apply to --algo is an error.
    algo: str = "ssd"
    delay: int | None = None           # k (5; odsgd: 1)
    warmup_steps: int | None = None    # SSGD warm-up iterations (500), or warmup_epochs
    warmup_epochs: float | None = None
    comm: str | None = None            # step | period
    local_update: str | None = None    # global-momentum | glu-paper | sgd
    local_lr: float | None = None      # glu-paper, sgd (world size x lr)
    local_lr_schedule: str | None = None   # None: the global schedule's shape
    glu_divisor: float | None = None   # C of glu-paper (12)
    period_rule: str | None = None     # rule of --comm period
    # runtime
    device: str = "auto"
    progress: str = "auto"             # how nonblocking allreduces progress
    transport: str = "auto"            # how GPU buffers reach MPI
    stall_timeout: float = 300.0       # seconds a wait may take before the job is aborted
    # run directory, checkpoints, logging
    run_dir: str | None = None         # None: runs/<timestamp>-<algo> under the current directory
    checkpoint_every: int = 0          # steps (0: only at epoch ends and at the end)
    keep_checkpoints: int = 3          # keep the newest N checkpoint files (0: keep all)
    eval_every: int = 1                # epochs (0: only at the end)
    log_every: int = 10                # steps between metrics lines (and signal checks)
    seed: int = 0
    progress_bar: bool = True          # rank 0 shows a tqdm bar on a terminal
    stop_at_step: int | None = None    # checkpoint and exit 85 after this step (testing, job splitting)

    def validate(self) -> "TrainConfig":
        """Raise ``UserError`` (one line, naming the option) for the first bad setting."""
        _choice("algo", self.algo, ALGOS)
        if self.comm is not None:
            _choice("comm", self.comm, COMMS)
        if self.local_update is not None:
            _choice("local-update", self.local_update, LOCAL_UPDATES)
        _choice("device", self.device, DEVICES)
        _choice("progress", self.progress, PROGRESS)
        _choice("transport", self.transport, TRANSPORTS)
        _choice("dtype", self.dtype, DTYPES)
        if not isinstance(self.augment, str):
            raise UserError(f"--augment must be a string like none, flip or crop4,flip; got {self.augment!r}")
        from ssdmpi.data.augment import parse_augment

        parse_augment(self.augment)
        for name in ("dataset", "model"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise UserError(f"--{_flag(name)} must be a name, got {getattr(self, name)!r}")
        _positive_int("batch-size", self.batch_size)
        _positive_int("epochs", self.epochs)
        if self.steps is not None:
            _positive_int("steps", self.steps)
        if self.delay is not None:
            _positive_int("delay", self.delay)
        if self.widths is not None:
            if not isinstance(self.widths, (list, tuple)) or not self.widths or \
                    not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in self.widths):
                raise UserError(f"--widths must be positive integers like 256,128; got {self.widths!r}")
        _number("lr", self.lr, low=0.0, strict=True)
        _number("momentum", self.momentum, low=0.0, high=1.0, high_open=True)
        _number("weight-decay", self.weight_decay, low=0.0)
        _number("lr-warmup-epochs", self.lr_warmup_epochs, low=0.0)
        if self.glu_divisor is not None:
            _number("glu-divisor", self.glu_divisor, low=0.0, strict=True)
        _number("stall-timeout", self.stall_timeout, low=0.0, strict=True)
        if self.local_lr is not None:
            _number("local-lr", self.local_lr, low=0.0, strict=True)
        if self.warmup_steps is not None:
            _nonnegative_int("warmup-steps", self.warmup_steps)
        if self.warmup_epochs is not None:
            _number("warmup-epochs", self.warmup_epochs, low=0.0)
        if self.warmup_steps is not None and self.warmup_epochs is not None:
            raise UserError("give --warmup-steps or --warmup-epochs, not both")
        parse_schedule(self.lr_schedule, "lr-schedule")
        if self.local_lr_schedule is not None:
            parse_schedule(self.local_lr_schedule, "local-lr-schedule")
        _nonnegative_int("checkpoint-every", self.checkpoint_every)
        _nonnegative_int("keep-checkpoints", self.keep_checkpoints)
        _nonnegative_int("eval-every", self.eval_every)
        _positive_int("log-every", self.log_every)
        _nonnegative_int("seed", self.seed)
        if self.stop_at_step is not None:
            _positive_int("stop-at-step", self.stop_at_step)
        if not isinstance(self.progress_bar, bool):
            raise UserError(f"progress_bar must be true or false, got {self.progress_bar!r}")
        for name in ("run_dir", "data_path", "period_rule"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise UserError(f"--{_flag(name)} must be a non-empty string, got {value!r}")
        return self

    def to_dict(self) -> dict:
        """Plain YAML/JSON-able mapping of every field."""
        d = dataclasses.asdict(self)
        if d["widths"] is not None:
            d["widths"] = list(d["widths"])
        return d

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)

    def warmup_iterations(self, steps_per_epoch: int) -> int:
        """``T_w`` in iterations (``warmup_epochs`` converted with this run's epoch length)."""
        if self.warmup_epochs is not None:
            return int(round(self.warmup_epochs * steps_per_epoch))
        return int(self.warmup_steps or 0)

    def total_steps(self, steps_per_epoch: int) -> int:
        """Length of the run in iterations."""
        return int(self.steps) if self.steps is not None else int(self.epochs) * int(steps_per_epoch)


FIELD_NAMES = tuple(f.name for f in fields(TrainConfig))


# --- validation helpers -----------------------------------------------------------------

def _flag(name: str) -> str:
    return name.replace("_", "-")


def _choice(flag, value, choices):
    if value not in choices:
        raise UserError(f"--{flag} {value!r} is not one of {', '.join(choices)}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_int(flag, value):
    if not _is_int(value) or value < 1:
        raise UserError(f"--{flag} must be a positive integer, got {value!r}")


def _nonnegative_int(flag, value):
    if not _is_int(value) or value < 0:
        raise UserError(f"--{flag} must be an integer >= 0, got {value!r}")


def _number(flag, value, low=None, high=None, strict=False, high_open=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"--{flag} must be a finite number, got {value!r}")
    if low is not None and (value < low or (strict and value == low)):
        raise UserError(f"--{flag} must be {'>' if strict else '>='} {low}, got {value!r}")
    if high is not None and (value > high or (high_open and value == high)):
        raise UserError(f"--{flag} must be {'<' if high_open else '<='} {high}, got {value!r}")


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


# --- the command line -------------------------------------------------------------------

def _int_list(text: str) -> list:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise UserError(f"--widths must be comma-separated positive integers like 256,128; got {text!r}") from None
    return values


def add_arguments(parser) -> None:
    """The ``ssdmpi train`` flags. Every default is None: only flags actually given override."""
    S = None
    g = parser.add_argument_group("configuration")
    g.add_argument("--config", metavar="FILE", help="YAML file of settings (keys as below, e.g. batch_size: 64)")
    g.add_argument("--preset", metavar="NAME",
                   help=f"named preset: {', '.join(list_presets()) or 'default'} (default: default)")
    g = parser.add_argument_group("data and model")
    g.add_argument("--dataset", default=S, help="dataset name (default: digits, built in)")
    g.add_argument("--data-path", default=S, metavar="PATH", help="where the dataset's files are")
    g.add_argument("--augment", default=S, help="augmentation: none, flip, crop4 or crop4,flip (default: none)")
    g.add_argument("--model", default=S, help="model: mlp, wide-mlp, lenet5, resnet20 (default: mlp)")
    g.add_argument("--widths", default=S, type=_int_list, metavar="W1,W2", help="hidden widths of mlp")
    g.add_argument("--dtype", default=S, help="float32 (default) or float64")
    g = parser.add_argument_group("length and optimizer")
    g.add_argument("--batch-size", type=int, default=S, metavar="B", help="batch size PER RANK (default preset: 16)")
    g.add_argument("--epochs", type=int, default=S, help="epochs to train (default: preset's)")
    g.add_argument("--steps", type=int, default=S, help="iterations to train (overrides --epochs)")
    g.add_argument("--lr", type=float, default=S, help="global learning rate")
    g.add_argument("--lr-schedule", default=S, metavar="SPEC",
                   help="constant | step:EVERY[:GAMMA] | multistep:E1,E2[:GAMMA] | cosine | poly[:POWER] (epochs)")
    g.add_argument("--lr-warmup-epochs", type=float, default=S, metavar="E", help="linear lr warm-up")
    g.add_argument("--momentum", type=float, default=S, help="global momentum (default 0.9)")
    g.add_argument("--weight-decay", type=float, default=S, help="weight decay on weights and BN gamma (1e-4)")
    g = parser.add_argument_group("algorithm (docs/ALGORITHM.md)")
    g.add_argument("--algo", default=S, help=f"{' | '.join(ALGOS)} (default: ssd)")
    g.add_argument("--delay", type=int, default=S, metavar="K", help="steps delay k (default 5)")
    w = g.add_mutually_exclusive_group()
    w.add_argument("--warmup-steps", type=int, default=S, metavar="T", help="SSGD warm-up iterations (default 500)")
    w.add_argument("--warmup-epochs", type=float, default=S, metavar="E", help="SSGD warm-up in epochs")
    g.add_argument("--comm", default=S, help="communication schedule of ssd: step | period (default: the algorithm's)")
    g.add_argument("--local-update", default=S, help=f"{' | '.join(LOCAL_UPDATES)}")
    g.add_argument("--local-lr", type=float, default=S, help="local learning rate (default: world size x lr)")
    g.add_argument("--local-lr-schedule", default=S, metavar="SPEC", help="schedule of the local lr")
    g.add_argument("--glu-divisor", type=float, default=S, metavar="C", help="GLU divisor C (default 12)")
    g.add_argument("--period-rule", default=S, metavar="RULE", help="update rule of --comm period")
    g = parser.add_argument_group("runtime")
    g.add_argument("--device", default=S, help="auto | cpu | gpu (default: auto)")
    g.add_argument("--progress", default=S, help="allreduce progress: auto | test | thread | blocking")
    g.add_argument("--transport", default=S, help="GPU buffers to MPI: auto | cuda-aware | host")
    g.add_argument("--stall-timeout", type=float, default=S, metavar="SEC", help="abort a wait longer than this")
    g.add_argument("--seed", type=int, default=S, help="seed of initialisation, data order, augmentation")
    g = parser.add_argument_group("run directory, checkpoints, logging")
    g.add_argument("--run-dir", default=S, metavar="DIR", help="default: runs/<timestamp>-<algo>")
    g.add_argument("--resume", metavar="auto|PATH",
                   help="auto: newest valid checkpoint of --run-dir (fresh start if none); "
                        "PATH: a checkpoint file or a run directory")
    g.add_argument("--checkpoint-every", type=int, default=S, metavar="STEPS",
                   help="checkpoint every N steps (always at each epoch's end and at the end)")
    g.add_argument("--keep-checkpoints", type=int, default=S, metavar="N", help="keep the newest N (0: all; default 3)")
    g.add_argument("--eval-every", type=int, default=S, metavar="EPOCHS", help="evaluate every N epochs (0: at the end only)")
    g.add_argument("--log-every", type=int, default=S, metavar="STEPS", help="metrics line every N steps (default 10)")
    g.add_argument("--no-progress-bar", dest="progress_bar", action="store_const", const=False, default=S,
                   help="plain periodic lines instead of a progress bar")
    g.add_argument("--stop-at-step", type=int, default=S, metavar="N",
                   help="checkpoint and exit with code 85 after step N (as if preempted)")


# --- presets and files --------------------------------------------------------------------

def list_presets() -> list:
    """Names of the built-in presets."""
    from importlib import resources

    try:
        return sorted(p.name[:-5] for p in resources.files("ssdmpi").joinpath("presets").iterdir()
                      if p.name.endswith(".yaml"))
    except (ModuleNotFoundError, FileNotFoundError):
        return []


def load_preset(name: str) -> dict:
    """The settings of preset ``name``; ``UserError`` if there is no such preset."""
    from importlib import resources

    names = list_presets()
    if name not in names:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(names)}")
    text = resources.files("ssdmpi").joinpath("presets", f"{name}.yaml").read_text(encoding="utf-8")
    return _normalise(_parse_yaml(text, f"preset {name}"), f"preset {name}")


def load_file(path: str) -> dict:
    """The settings of a YAML config file; ``UserError`` if unreadable, malformed or with unknown keys."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UserError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    return _normalise(_parse_yaml(text, path), path)


def _parse_yaml(text: str, where: str) -> dict:
    import yaml

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


def _normalise(data: dict, where: str) -> dict:
    """Keys with dashes or underscores -> field names; unknown keys are an error."""
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name == "no_progress_bar":
            name, value = "progress_bar", not value
        if name not in FIELD_NAMES:
            raise UserError(f"{where}: unknown setting {key!r} (see ssdmpi train --help for the settings)")
        if name == "widths" and isinstance(value, str):
            value = _int_list(value)
        if name == "widths" and isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if isinstance(value, int) and not isinstance(value, bool) and \
                isinstance(getattr(TrainConfig, name, None), float):
            value = float(value)
        out[name] = value
    return out


def from_flags(args) -> dict:
    """The settings actually given on the command line (argparse defaults are None)."""
    out = {}
    for name in FIELD_NAMES:
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    # --warmup-steps and --warmup-epochs replace each other, whichever layer set the other.
    return out


def merge(base: dict, override: dict) -> dict:
    """``base`` updated by ``override`` (warm-up given one way clears the other)."""
    merged = dict(base)
    merged.update(override)
    if "warmup_epochs" in override and override["warmup_epochs"] is not None and "warmup_steps" not in override:
        merged["warmup_steps"] = None
    if "warmup_steps" in override and override["warmup_steps"] is not None and "warmup_epochs" not in override:
        merged["warmup_epochs"] = None
    return merged


def build(settings: dict) -> TrainConfig:
    """A validated ``TrainConfig`` from a mapping of field names."""
    unknown = set(settings) - set(FIELD_NAMES)
    if unknown:
        raise UserError(f"unknown setting {sorted(unknown)[0]!r}")
    cfg = TrainConfig(**settings)
    if isinstance(cfg.widths, tuple):
        cfg.widths = list(cfg.widths)
    return cfg.validate()


ALGO_SETTINGS = ("delay", "comm", "period_rule", "local_update", "local_lr", "local_lr_schedule", "glu_divisor")
NOT_INHERITED = ("run_dir", "stop_at_step", "progress_bar")   # a resumed run does not take these from the checkpoint


def resolve(args, checkpoint_config: dict | None = None) -> TrainConfig:
    """The run's config from defaults, preset, ``--config`` file and flags (see module docstring).

    ``checkpoint_config``: the config stored in the checkpoint being resumed; it replaces the
    defaults and the default preset (``check_resume`` then checks the structural settings).
    """
    defaults = TrainConfig().to_dict()
    preset_name = getattr(args, "preset", None)
    if checkpoint_config is not None:
        inherited = {k: v for k, v in _normalise(dict(checkpoint_config), "checkpoint config").items()
                     if k not in NOT_INHERITED}
        base = merge(defaults, inherited)
        if preset_name is not None:
            base = merge(base, load_preset(preset_name))
    else:
        base = merge(defaults, load_preset(preset_name or "default"))
    if getattr(args, "config", None):
        base = merge(base, load_file(args.config))
    return build(merge(base, from_flags(args)))


def soft_settings(args, resuming: bool = False) -> set:
    """Algorithm settings (and ``widths``) that came from a preset or checkpoint, not from the
    user's file or flags. The trainer drops those that do not apply to the chosen ``--algo``
    (or ``--model``) instead of failing: ``--model resnet20`` with the default preset's widths.
    """
    given = set(from_flags(args))
    if getattr(args, "config", None):
        given |= set(load_file(args.config))
    return {k for k in ALGO_SETTINGS + ("widths",) if k not in given}


def check_resume(old: dict, cfg: TrainConfig) -> None:
    """``UserError`` if a structural setting differs from the checkpoint's (``old``) config."""
    old = _normalise(dict(old), "checkpoint config")
    for name in STRUCTURAL:
        if name in old and old[name] != getattr(cfg, name):
            raise UserError(f"the checkpoint was trained with {_flag(name)}={old[name]!r} but this run asks for "
                            f"{getattr(cfg, name)!r}; drop that setting or start a new run directory")


def changed_settings(old: dict, cfg: TrainConfig) -> list:
    """``["lr: 0.1 -> 0.05", ...]``: non-structural settings that differ from a checkpoint's config."""
    new = cfg.to_dict()
    skip = set(STRUCTURAL) | {"run_dir", "stop_at_step", "progress_bar"}
    return [f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in FIELD_NAMES
            if k not in skip and k in old and old.get(k) != new[k]]


def default_run_dir(cfg: TrainConfig, when=None) -> str:
    """``runs/<YYYYmmdd-HHMMSS>-<algo>`` under the current directory."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    return os.path.join("runs", f"{stamp}-{cfg.algo}")
