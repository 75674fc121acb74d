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
with ``--config`` to start a new run with the same settings: ``config.yaml`` records
``run_dir`` and ``stop_at_step`` as comments only (``INVOCATION``), so the new run gets its
own directory (``--run-dir`` or the default). ``--print-config`` prints the resolution.

This module is imported when the CLI parser is built: keep its top-level imports light.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields

from ssdmpi.algos.auto_delay import DELAY_RANGE
from ssdmpi.algos.config import (
    ALGOS,
    ASGD_ORDERS,
    ASGD_RATES,
    COMMS,
    DEFAULT_ASGD_RATE,
    DEFAULT_COMM,
    DEFAULT_DELAY,
    DEFAULT_GLU_DIVISOR,
    DEFAULT_LOCAL_UPDATE,
    DEFAULT_MERGE_DELAY,
    DEFAULT_SERVERS,
    AlgoConfig,
    default_period_rule,
    period_rules,
)
from ssdmpi.algos.overlap import DEFAULT_BUCKET_BYTES
from ssdmpi.comm.progress import DEFAULTS as PROGRESS_DEFAULTS
from ssdmpi.comm.progress import PROGRESS
from ssdmpi.comm.transport import TRANSPORTS
from ssdmpi.data.names import DATASETS
from ssdmpi.errors import UserError
from ssdmpi.optim.local import LOCAL_UPDATES
from ssdmpi.parsing import parse_list, parse_size
from ssdmpi.validate import choice, did_you_mean, flag_name, is_int, nonnegative_int, number, positive_int

# The choices this module owns (the others are imported from the modules that implement them).
DEVICES = ("auto", "cpu", "gpu")
DTYPES = ("float32", "float64")

# Settings that decide the shape of the state or the meaning of every step: a resumed
# run must not change them (the checkpoint would not fit, or "continue" would be a lie).
STRUCTURAL = ("dataset", "model", "widths", "dtype", "batch_size", "algo", "delay", "comm",
              "local_update", "period_rule", "merge_delay", "seed", "servers")
# Settings that replace each other (the first one set wins), checked as a pair on resume:
# the SSGD warm-up's length, and the run's length (``steps`` wins over ``epochs``).
WARMUP = ("warmup_steps", "warmup_epochs")
RUN_LENGTH = ("steps", "epochs")
# Learning-rate schedules whose every value depends on the run's length.
LENGTH_SCHEDULES = ("cosine", "poly")


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
    lr: float = AlgoConfig.lr          # the algorithm's defaults are AlgoConfig's
    lr_schedule: str = "constant"      # see parse_schedule
    lr_warmup_epochs: float = 0.0      # linear learning-rate warm-up of the global lr
    momentum: float = AlgoConfig.momentum
    weight_decay: float = AlgoConfig.weight_decay
    # algorithm (ALGORITHM.md sections 1, 4, 5). None: the algorithm's own default (see
    # ssdmpi.algos.config); a setting that does not apply to --algo is an error.
    algo: str = "ssd"
    delay: int | str | None = None     # k, or "auto" (chosen from the warm-up's measurements)
    delay_max: int | None = None       # the largest k --delay auto may choose
    warmup_steps: int | None = None    # SSGD warm-up iterations (None and no warmup_epochs: 0)
    warmup_epochs: float | None = None
    comm: str | None = None            # communication schedule of ssd
    local_update: str | None = None
    local_lr: float | None = None      # glu-paper, sgd
    local_lr_schedule: str | None = None
    glu_divisor: float | None = None   # C of glu-paper
    period_rule: str | None = None     # rule of --comm period
    merge_delay: int | None = None     # d of --period-rule delta-merge
    servers: int | None = None         # asgd: parameter-server ranks (the last ones)
    asgd_order: str | None = None      # asgd: arrival | round-robin
    asgd_rate: str | None = None       # asgd: plain | staleness
    # runtime
    device: str = "auto"
    threads: int | None = None         # BLAS/OpenMP threads per rank (None: chosen per node, comm/node.py)
    gpu_id: int | None = None          # CUDA device of every rank (None: one per local rank, comm/node.py)
    progress: str = "auto"             # how nonblocking allreduces progress
    transport: str = "auto"            # how GPU buffers reach MPI
    stall_timeout: float = 300.0       # seconds a wait may take before the job is aborted
    bucket_size: int | None = None     # bytes per allreduce piece (None: one fused buffer)
    # run directory, checkpoints, logging
    run_dir: str | None = None         # None: runs/<timestamp>-<algo> under the current directory
    checkpoint_every: int = 0          # steps (0: only at epoch ends and at the end)
    keep_checkpoints: int = 3          # keep the newest N checkpoints, plus best and last (0: keep all)
    eval_every: int = 1                # epochs (0: only at the end)
    log_every: int = 10                # steps between metrics lines (and signal checks)
    seed: int = 0
    progress_bar: bool = True          # rank 0 shows a tqdm bar on a terminal
    tensorboard: bool = False          # also write TensorBoard event files (RUN/tensorboard/)
    csv: bool = False                  # also write the step and eval records as CSV (RUN/*.csv)
    stop_at_step: int | None = None    # checkpoint and exit 85 after this step (testing, job splitting)

    def validate(self) -> TrainConfig:
        """Raise ``UserError`` (one line, naming the option) for the first bad setting."""
        choice("algo", self.algo, ALGOS)
        if self.comm is not None:
            choice("comm", self.comm, COMMS)
        if self.local_update is not None:
            choice("local-update", self.local_update, LOCAL_UPDATES)
        if self.servers is not None:
            positive_int("servers", self.servers)
        if self.asgd_order is not None:
            choice("asgd-order", self.asgd_order, ASGD_ORDERS)
        if self.asgd_rate is not None:
            choice("asgd-rate", self.asgd_rate, ASGD_RATES)
        choice("device", self.device, DEVICES)
        if self.threads is not None:
            positive_int("threads", self.threads)
        if self.gpu_id is not None:
            nonnegative_int("gpu-id", self.gpu_id)
        choice("progress", self.progress, PROGRESS)
        choice("transport", self.transport, TRANSPORTS)
        choice("dtype", self.dtype, DTYPES)
        if not isinstance(self.augment, str):
            raise UserError(f"--augment must be a string like none, flip or crop4,flip; got {self.augment!r}")
        from ssdmpi.data.augment import parse_augment

        parse_augment(self.augment)
        for name in ("dataset", "model"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise UserError(f"--{flag_name(name)} must be a name, got {getattr(self, name)!r}")
        positive_int("batch-size", self.batch_size)
        positive_int("epochs", self.epochs)
        if self.steps is not None:
            positive_int("steps", self.steps)
        if self.delay is not None and self.delay != "auto":
            positive_int("delay", self.delay)
        if self.delay_max is not None:
            positive_int("delay-max", self.delay_max)
        if self.merge_delay is not None:
            positive_int("merge-delay", self.merge_delay)
        if self.widths is not None:
            if not isinstance(self.widths, (list, tuple)) or not self.widths or \
                    not all(is_int(w) and w > 0 for w in self.widths):
                raise UserError(f"--widths must be positive integers like 256,128; got {self.widths!r}")
        number("lr", self.lr, low=0.0, strict=True)
        number("momentum", self.momentum, low=0.0, high=1.0, high_open=True)
        number("weight-decay", self.weight_decay, low=0.0)
        number("lr-warmup-epochs", self.lr_warmup_epochs, low=0.0)
        if self.glu_divisor is not None:
            number("glu-divisor", self.glu_divisor, low=0.0, strict=True)
        number("stall-timeout", self.stall_timeout, low=0.0, strict=True)
        if self.bucket_size is not None:
            positive_int("bucket-size", self.bucket_size)
        if self.local_lr is not None:
            number("local-lr", self.local_lr, low=0.0, strict=True)
        if self.warmup_steps is not None:
            nonnegative_int("warmup-steps", self.warmup_steps)
        if self.warmup_epochs is not None:
            number("warmup-epochs", self.warmup_epochs, low=0.0)
        if self.warmup_steps is not None and self.warmup_epochs is not None:
            raise UserError("give --warmup-steps or --warmup-epochs, not both")
        parse_schedule(self.lr_schedule, "lr-schedule")
        if self.local_lr_schedule is not None:
            parse_schedule(self.local_lr_schedule, "local-lr-schedule")
        nonnegative_int("checkpoint-every", self.checkpoint_every)
        nonnegative_int("keep-checkpoints", self.keep_checkpoints)
        nonnegative_int("eval-every", self.eval_every)
        positive_int("log-every", self.log_every)
        nonnegative_int("seed", self.seed)
        if self.stop_at_step is not None:
            positive_int("stop-at-step", self.stop_at_step)
        for name in ("progress_bar", "tensorboard", "csv"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("run_dir", "data_path", "period_rule"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise UserError(f"--{flag_name(name)} must be a non-empty string, got {value!r}")
        return self

    def to_dict(self) -> dict:
        """Plain YAML/JSON-able mapping of every field."""
        d = dataclasses.asdict(self)
        if d["widths"] is not None:
            d["widths"] = list(d["widths"])
        return d

    def to_yaml(self) -> str:
        """The run's settings as YAML, reusable with ``--config`` for a new run.

        The settings of one invocation (``INVOCATION``: where this run lives, where it was
        told to stop) are written as comments, not settings: a saved ``config.yaml`` fed back
        with ``--config`` starts a new run in a new directory instead of colliding with the
        run it came from.
        """
        import yaml

        d = self.to_dict()
        mine = {k: v for k in INVOCATION if (v := d.pop(k)) is not None}
        class Dumper(yaml.SafeDumper):   # one line per setting, lists inline: widths: [256, 128]
            pass

        Dumper.add_representer(list, lambda dumper, v: dumper.represent_sequence(
            "tag:yaml.org,2002:seq", v, flow_style=True))
        text = yaml.dump(d, Dumper=Dumper, sort_keys=False, default_flow_style=False)
        if mine:
            text += "# this invocation's own, not read back by --config (give them as flags):\n"
            text += "".join(f"#   {line}\n" for line in yaml.dump(mine, Dumper=Dumper, sort_keys=False,
                                                                   default_flow_style=False).splitlines())
        return text

    def warmup_iterations(self, steps_per_epoch: int) -> int:
        """``T_w`` in iterations (``warmup_epochs`` converted with this run's epoch length)."""
        if self.warmup_epochs is not None:
            return int(round(self.warmup_epochs * steps_per_epoch))
        return int(self.warmup_steps or 0)

    def total_steps(self, steps_per_epoch: int) -> int:
        """Length of the run in iterations."""
        return int(self.steps) if self.steps is not None else int(self.epochs) * int(steps_per_epoch)


FIELD_NAMES = tuple(f.name for f in fields(TrainConfig))
# Settings of one invocation, not of the run: a saved config.yaml holds them as comments only.
INVOCATION = ("run_dir", "stop_at_step")


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

def _widths(text: str) -> list:
    return parse_list(text, "--widths", int, minimum=1, example="256,128")


def _size(text: str) -> int:
    """``--bucket-size``'s type: bytes, or argparse's error naming the flag."""
    import argparse

    try:
        return parse_size(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _show(value) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _algorithm_defaults() -> dict:
    """Help text of the settings whose default depends on ``--algo`` (``AlgoConfig`` decides)."""
    return {
        "delay": f"{DEFAULT_DELAY} (the algorithm's; odsgd: 1)",
        "delay_max": f"{DELAY_RANGE[1]} with --delay auto",
        "comm": f"{DEFAULT_COMM} (ssd's; odsgd: step)",
        "servers": f"{DEFAULT_SERVERS} with --algo asgd",
        "asgd_order": f"{ASGD_ORDERS[0]} with --algo asgd",
        "asgd_rate": f"{DEFAULT_ASGD_RATE} with --algo asgd",
        "period_rule": f"{default_period_rule()}",
        "merge_delay": f"{DEFAULT_MERGE_DELAY} with --period-rule delta-merge; with --delay auto chosen with k",
        "local_update": f"{DEFAULT_LOCAL_UPDATE}, where the schedule uses one",
        "local_lr": "world size x lr",
        "local_lr_schedule": "the global schedule's shape",
        "glu_divisor": f"{DEFAULT_GLU_DIVISOR:g}",
        "warmup_steps": "0",
        "widths": "the model's own",
        "run_dir": "runs/<timestamp>-<algo>, -2, -3, ... if taken",
        "data_path": "the dataset's usual places",
        "steps": "--epochs decides",
        "bucket_size": f"one fused buffer; the gradient's during the backward pass in buckets of "
                       f"{DEFAULT_BUCKET_BYTES // 2**20}M (PyTorch DDP's)",
        "warmup_epochs": "unset, --warmup-steps decides",
        "stop_at_step": "never",
        "threads": "usable CPUs on the node // ranks on it, unless OMP_NUM_THREADS, OPENBLAS_NUM_THREADS or "
                   "MKL_NUM_THREADS is set",
        "gpu_id": "local rank mod the number of GPUs seen, unless the launcher bound one GPU per rank",
    }


def default_help(name: str, presets: dict | None = None) -> str:
    """``"default: ..."`` for the setting ``name``, as a run with no flags resolves it.

    A value of the default preset wins over the dataclass's; the text says when other
    presets set their own. ``presets``: ``{name: settings}`` (default: the built-in ones).
    """
    presets = {p: load_preset(p) for p in list_presets()} if presets is None else presets
    base = presets.get("default", {})
    others = [p for p, values in presets.items() if p != "default" and name in values]
    if name in base:
        text = f"default: {_show(base[name])}, from the default preset"
        return text + (f"; preset {', '.join(others)} set{'s its' if len(others) == 1 else ' their'} own"
                       if others else "")
    value = getattr(TrainConfig, name, None)
    text = f"default: {_show(value) if value is not None else _algorithm_defaults()[name]}"
    return text + (f"; set by preset {', '.join(others)}" if others else "")



# Where each algorithm setting means something: --print-config's comment on one that does not.
_APPLIES_TO = {
    "delay": "--algo ssd, odsgd or localsgd",
    "delay_max": "--delay auto",
    "comm": "--algo ssd",
    "period_rule": "--algo ssd --comm period",
    "merge_delay": "--comm period --period-rule delta-merge",
    "local_update": "--comm step or --period-rule replay",
    "local_lr": "--local-update glu-paper or sgd",
    "local_lr_schedule": "--local-update glu-paper or sgd",
    "glu_divisor": "--local-update glu-paper",
    "servers": "--algo asgd",
    "asgd_order": "--algo asgd",
    "asgd_rate": "--algo asgd",
}


def _algo_values(cfg: TrainConfig) -> dict:
    """``AlgoConfig`` keywords of ``cfg``'s algorithm settings, to check which apply without the
    data (a local schedule stands in as a valid schedule)."""
    return dict(algo=cfg.algo, delay=cfg.delay, delay_max=cfg.delay_max, comm=cfg.comm,
                period_rule=cfg.period_rule, merge_delay=cfg.merge_delay, local_update=cfg.local_update,
                local_lr=cfg.local_lr,
                local_lr_schedule=None if cfg.local_lr_schedule is None else "constant",
                glu_divisor=cfg.glu_divisor, servers=cfg.servers, asgd_order=cfg.asgd_order, asgd_rate=cfg.asgd_rate)


def _resolved_algo(cfg: TrainConfig) -> AlgoConfig | None:
    """``cfg``'s algorithm settings resolved without the data (None if they do not validate; a
    stand-in local lr where its default needs the world size)."""
    values = _algo_values(cfg)
    try:
        try:
            return AlgoConfig(**values).validate(None)
        except ValueError:       # the default local lr needs the world size; any stand-in will do here
            return AlgoConfig(**dict(values, local_lr=cfg.lr)).validate(None)
    except UserError:
        return None


def _algorithm_comments(cfg: TrainConfig) -> dict:
    """``{setting: comment}`` for the algorithm settings ``cfg`` leaves unset: the value its
    ``--algo`` resolves them to, or that this run does not use them (``_APPLIES_TO``)."""
    resolved = _resolved_algo(cfg)
    if resolved is None:
        return {}
    out = {}
    for key, where in _APPLIES_TO.items():
        value = getattr(resolved, key)
        shown = f"{value:g} for --algo {cfg.algo}" if isinstance(value, float) else f"{value} for --algo {cfg.algo}"
        if key in ("local_lr", "local_lr_schedule"):
            value = shown = _algorithm_defaults()[key] if resolved.local_update in ("glu-paper", "sgd") else None
        if getattr(cfg, key) is None:
            out[key] = f"not used by this run (only with {where})" if value is None else f"default: {shown}"
    if cfg.warmup_steps is None and cfg.warmup_epochs is not None:
        out["warmup_steps"] = "unset, --warmup-epochs decides"
    return out


def as_recorded(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` as the run will record it in config.yaml (``resolved_settings``), resolved without
    the data: the algorithm's defaults written in (``--print-config`` prints this)."""
    resolved = _resolved_algo(cfg)
    if resolved is None:
        return cfg
    out = dataclasses.replace(cfg)
    for key in RESOLVED_BY_ALGO:
        setattr(out, key, getattr(resolved, key))
    if out.warmup_epochs is None:
        out.warmup_steps = int(cfg.warmup_steps or 0)
    return out


def annotated_yaml(cfg: TrainConfig) -> str:
    """The settings a run of ``cfg`` uses, as YAML valid as a ``--config`` file: ``as_recorded(cfg)``
    (what config.yaml will say), with a comment after each setting the algorithm chose (its
    default for ``--algo``) and after each left unset (``null``) saying what a run gets instead
    (``default_help``), or that this run does not use it."""
    presets = {p: load_preset(p) for p in list_presets()}
    lines = ["# ssdmpi train: resolved settings (defaults < preset < --config file < flags)"]
    comments = _algorithm_comments(cfg)
    for line in as_recorded(cfg).to_yaml().splitlines():
        key, sep, value = line.partition(": ")
        if sep and value == "null" and key in FIELD_NAMES:
            text = ("default: the model's own" if key == "widths" else comments[key] if key in comments
                    else default_help(key, presets).split("; set by preset")[0].split("; preset ")[0])
            line += f"   # {text}"
        elif sep and key in comments and comments[key].startswith("default: "):
            line += f"   # the default for --algo {cfg.algo}"
        lines.append(line)
    if cfg.run_dir is None:
        lines.append(f"# run_dir: {default_help('run_dir', presets)}")
    return "\n".join(lines) + "\n"


def delay_value(text: str):
    """``--delay``: a positive integer k, or ``auto``."""
    import argparse

    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer k or auto, got {text!r}") from None



# (field, flag keywords, what it is). Help adds the choices and "(default: ...)".
_FLAGS = {
    "data and model": [
        ("dataset", {"choices_help": DATASETS}, "dataset: {choices} (see ssdmpi data list)"),
        ("data_path", {"metavar": "PATH"}, "where the dataset's files are"),
        ("augment", {}, "augmentation: none, flip, crop4 or crop4,flip"),
        ("model", {}, "model: mlp, wide-mlp, lenet5, resnet20 (ssdmpi.nn.MODELS), or package.module:factory "
                      "(docs/API.md)"),
        ("widths", {"type": _widths, "metavar": "W1,W2"}, "hidden widths of mlp"),
        ("dtype", {"choices_help": DTYPES}, "parameter dtype"),
    ],
    "length and optimizer": [
        ("batch_size", {"type": int, "metavar": "B"}, "batch size PER RANK"),
        ("epochs", {"type": int}, "epochs to train"),
        ("steps", {"type": int}, "iterations to train (overrides --epochs)"),
        ("lr", {"type": float}, "global learning rate"),
        ("lr_schedule", {"metavar": "SPEC"},
         "constant | step:EVERY[:GAMMA] | multistep:E1,E2[:GAMMA] | cosine | poly[:POWER] (epochs)"),
        ("lr_warmup_epochs", {"type": float, "metavar": "E"}, "epochs of linear warm-up of the global lr"),
        ("momentum", {"type": float}, "global momentum"),
        ("weight_decay", {"type": float}, "weight decay on weights and BN gamma"),
    ],
    "algorithm (docs/ALGORITHM.md)": [
        ("algo", {"choices_help": ALGOS}, "training algorithm"),
        ("delay", {"type": delay_value, "metavar": "K|auto"},
         "delay k, iterations between pulls of the global model (--comm period: the period; localsgd: "
         "between model averages); auto (--comm period --period-rule delta-merge): the merge delay d that "
         "hides the allreduce and the period k that amortises it, within the rule's stable region, measured "
         "in the SSGD warm-up (needs --warmup-steps >= 5; docs/ALGORITHM.md section 12)"),
        ("delay_max", {"type": int, "metavar": "K"},
         "the largest k (and d) --delay auto may choose: a cap on staleness (below what hiding the allreduce "
         "needs, part of it is exposed)"),
        ("warmup_steps", {"type": int, "metavar": "T", "group": "warmup"}, "SSGD warm-up iterations"),
        ("warmup_epochs", {"type": float, "metavar": "E", "group": "warmup"},
         "SSGD warm-up in epochs (instead of --warmup-steps)"),
        ("comm", {"choices_help": COMMS}, "communication schedule of ssd"),
        ("local_update", {"choices_help": LOCAL_UPDATES}, "local update of the delay stage"),
        ("local_lr", {"type": float}, "local learning rate of --local-update glu-paper and sgd"),
        ("local_lr_schedule", {"metavar": "SPEC"}, "schedule of the local lr"),
        ("glu_divisor", {"type": float, "metavar": "C"}, "divisor C of --local-update glu-paper"),
        ("period_rule", {"metavar": "RULE", "choices_help": "period_rules"}, "update rule of --comm period"),
        ("merge_delay", {"type": int, "metavar": "D"},
         "delta-merge: iterations from posting a period's sum to merging it (1..k); a larger d hides a longer "
         "allreduce, at a cost in stability (docs/PERIOD_RULE.md)"),
        ("servers", {"type": int, "metavar": "S"}, "asgd: parameter-server ranks (the last S ranks)"),
        ("asgd_order", {"choices_help": ASGD_ORDERS},
         "asgd: apply pushes as they arrive, or in worker order (deterministic, for tests)"),
        ("asgd_rate", {"choices_help": ASGD_RATES},
         "asgd: the lr of each push: the global lr, or the global lr / (1 + the push's staleness)"),
    ],
    "runtime": [
        ("device", {"choices_help": DEVICES}, "array backend"),
        ("threads", {"type": int, "metavar": "N"}, "BLAS/OpenMP threads per rank"),
        ("gpu_id", {"type": int, "metavar": "ID"}, "CUDA device of this rank"),
        ("progress", {"choices_help": PROGRESS},
         "who drives nonblocking allreduces: {choices}; auto = "
         + ", ".join(f"{k}: {v}" for k, v in PROGRESS_DEFAULTS.items())),
        ("transport", {"choices_help": TRANSPORTS}, "how GPU buffers reach MPI"),
        ("bucket_size", {"type": _size, "metavar": "SIZE"},
         "split each allreduce into pieces of SIZE bytes, and post the gradient's during the backward "
         "pass in buckets of at least SIZE, layer by layer (e.g. 4M; K, M, G are powers of 1024)"),
        ("stall_timeout", {"type": float, "metavar": "SEC"}, "abort the job when one wait lasts longer than this"),
        ("seed", {"type": int}, "seed of initialisation, data order, augmentation"),
    ],
    "run directory, checkpoints, logging": [
        ("run_dir", {"metavar": "DIR"}, "run directory"),
        ("checkpoint_every", {"type": int, "metavar": "STEPS"},
         "checkpoint every N steps, besides each epoch's end and the end (0: only those)"),
        ("keep_checkpoints", {"type": int, "metavar": "N"}, "keep the newest N checkpoints and best, last (0: all)"),
        ("eval_every", {"type": int, "metavar": "EPOCHS"}, "evaluate every N epochs (0: at the end only)"),
        ("log_every", {"type": int, "metavar": "STEPS"}, "metrics line every N steps"),
        ("stop_at_step", {"type": int, "metavar": "N"},
         "checkpoint and exit with code 85 after step N (as if preempted)"),
        ("tensorboard", {"action": "store_const", "const": True},
         "also write TensorBoard event files to RUN/tensorboard (needs tensorboardX)"),
        ("csv", {"action": "store_const", "const": True}, "also write steps.csv and evals.csv next to metrics.jsonl"),
    ],
}



def add_arguments(parser) -> None:
    """The ``ssdmpi train`` flags. Every default is None: only flags actually given override.

    The help of each flag states the default a run without it gets (``default_help``).
    """
    presets = {p: load_preset(p) for p in list_presets()}
    g = parser.add_argument_group("configuration")
    g.add_argument("--config", metavar="FILE",
                   help="YAML file of settings (keys as below, e.g. batch_size: 64) (default: none)")
    g.add_argument("--preset", metavar="NAME",
                   help=f"named preset: {', '.join(presets) or 'default'} (default: default)")
    g.add_argument("--print-config", action="store_true",
                   help="print the resolved settings (preset < --config FILE < flags) as YAML and exit; "
                        "writes nothing, trains nothing")
    for title, flags in _FLAGS.items():
        g = parser.add_argument_group(title)
        exclusive = {}
        for name, options, what in flags:
            options = dict(options)
            choices = options.pop("choices_help", None)
            choices = tuple(period_rules()) if choices == "period_rules" else choices
            where = options.pop("group", None)
            if where is not None and where not in exclusive:
                exclusive[where] = g.add_mutually_exclusive_group()
            target = g if where is None else exclusive[where]
            head = what.format(choices=" | ".join(choices)) if "{choices}" in what \
                else f"{what}: {' | '.join(choices)}" if choices else what
            target.add_argument(f"--{flag_name(name)}", default=None, **options,
                                help=f"{head} ({default_help(name, presets)})".replace("%", "%%"))
        if title == "run directory, checkpoints, logging":
            g.add_argument("--resume", metavar="auto|PATH",
                           help="auto: newest valid checkpoint of --run-dir (fresh start if none); "
                                "PATH: a checkpoint file or a run directory (default: a fresh run)")
            g.add_argument("--no-progress-bar", dest="progress_bar", action="store_const", const=False,
                           default=None,
                           help="plain periodic lines instead of a progress bar (default: a bar on a terminal)")


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
            raise UserError(f"{where}: unknown setting {key!r}{did_you_mean(name, FIELD_NAMES)}; "
                            "see ssdmpi train --help for the settings")
        if name == "widths" and isinstance(value, str):
            value = _widths(value)
        if name == "widths" and is_int(value):
            value = [value]
        if name == "bucket_size" and isinstance(value, str):
            try:
                value = parse_size(value)
            except UserError as exc:
                raise UserError(f"{where}: bucket_size: {exc}") from None
        if is_int(value) and \
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


ALGO_SETTINGS = ("delay", "delay_max", "comm", "period_rule", "merge_delay", "local_update", "local_lr",
                 "local_lr_schedule", "glu_divisor")
# The settings a run records as its algorithm resolved them (config.yaml, checkpoints; ``resolved_settings``).
RESOLVED_BY_ALGO = ("delay", "delay_max", "comm", "period_rule", "merge_delay", "local_update", "glu_divisor",
                    "servers", "asgd_order", "asgd_rate")
# A resumed run does not take these from the checkpoint (threads and GPU belong to the machine, not the run).
NOT_INHERITED = ("run_dir", "stop_at_step", "progress_bar", "threads", "gpu_id")


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
    """``UserError`` if a structural setting differs from the checkpoint's (``old``) config, if
    the SSGD warm-up changed (the switch to the delay stage cannot move: resumed past a new
    switch point the run would stay SSGD, or count its local steps from a negative ``m``), or
    if the run's length changed under a schedule that depends on it (``cosine``, ``poly``: the
    lr would jump at the resume point and the run would match neither length's run)."""
    old = _normalise(dict(old), "checkpoint config")
    for name in STRUCTURAL:
        if name in old and old[name] != getattr(cfg, name):
            raise UserError(f"the checkpoint was trained with {flag_name(name)}={old[name]!r} but this run asks for "
                            f"{getattr(cfg, name)!r}; drop that setting or start a new run directory")
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


# --- from a TrainConfig to the objects of a run -------------------------------------------

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


def algo_config(cfg: TrainConfig, soft: set, steps_per_epoch: int, total_steps: int, world_size: int) -> AlgoConfig:
    """The resolved ``AlgoConfig`` of ``cfg`` (epochs converted to steps with ``steps_per_epoch``).

    Algorithm settings that came from a preset or checkpoint (``soft``, see
    ``soft_settings``) and do not apply to the chosen algorithm are dropped, one at a time
    in ``ALGO_SETTINGS`` order (``--preset cifar10-resnet20 --algo ssgd`` is fine); the
    user's own inapplicable settings are a ``UserError``.
    """
    values = dict(
        algo=cfg.algo, delay=cfg.delay, delay_max=cfg.delay_max, warmup_steps=cfg.warmup_iterations(steps_per_epoch),
        comm=cfg.comm, period_rule=cfg.period_rule, merge_delay=cfg.merge_delay, local_update=cfg.local_update,
        lr=cfg.lr,
        lr_schedule=schedule_in_steps(cfg.lr_schedule, steps_per_epoch),
        lr_warmup_steps=int(round(cfg.lr_warmup_epochs * steps_per_epoch)), total_steps=total_steps,
        local_lr=cfg.local_lr,
        local_lr_schedule=None if cfg.local_lr_schedule is None
        else schedule_in_steps(cfg.local_lr_schedule, steps_per_epoch),
        momentum=cfg.momentum, weight_decay=cfg.weight_decay, glu_divisor=cfg.glu_divisor,
        servers=cfg.servers, asgd_order=cfg.asgd_order, asgd_rate=cfg.asgd_rate)
    droppable = [k for k in ALGO_SETTINGS if k in soft]
    try:
        return AlgoConfig(**values).validate(world_size)
    except UserError:
        if not droppable:
            raise
    for key in droppable:
        values[key] = None
        try:
            return AlgoConfig(**values).validate(world_size)
        except UserError:
            continue
    return AlgoConfig(**values).validate(world_size)   # raises the error about the user's own settings


def applicable(cfg: TrainConfig, soft: set) -> TrainConfig:
    """A copy of ``cfg`` without the preset's algorithm settings (``soft``) that do not apply to
    its ``--algo``, dropped as ``algo_config`` drops them, but checked without the data (what
    ``--print-config`` shows, so that its output fed back with ``--config`` still runs). The
    user's own settings that do not apply raise the ``UserError`` the run would raise."""
    out = dataclasses.replace(cfg)
    values = _algo_values(cfg)
    for key in [None] + [k for k in ALGO_SETTINGS if k in soft]:
        if key is not None:
            values[key] = None
            setattr(out, key, None)
        try:
            AlgoConfig(**values).validate(None)
            return out
        except ValueError:       # everything applies; only the world size (default local lr) is missing
            return out
        except UserError:        # something does not apply: drop the next preset setting
            continue
    AlgoConfig(**values).validate(None)   # the user's own settings do not apply: the run's UserError
    return out


def resolved_settings(cfg: TrainConfig, algo_cfg: AlgoConfig) -> TrainConfig:
    """A copy of ``cfg`` with the algorithm's resolved defaults written in (what config.yaml records)."""
    out = dataclasses.replace(cfg)
    for key in RESOLVED_BY_ALGO:
        setattr(out, key, getattr(algo_cfg, key))
    if out.warmup_epochs is None:
        out.warmup_steps = int(algo_cfg.warmup_steps)
    return out


def data_ranks(cfg: TrainConfig, world_size: int) -> int:
    """How many ranks train on data: all of them, but for asgd only the workers (``UserError``
    on a world too small for its servers)."""
    if cfg.algo != "asgd":
        return world_size
    from ssdmpi.algos.asgd import worker_count

    servers = cfg.servers if cfg.servers is not None else DEFAULT_SERVERS
    AlgoConfig(algo="asgd", servers=servers, asgd_order=cfg.asgd_order, asgd_rate=cfg.asgd_rate).validate(world_size)
    return worker_count(world_size, servers)


def communicator_options(cfg: TrainConfig) -> dict:
    """Keyword arguments of ``Communicator`` for this run: ``Communicator(**communicator_options(cfg))``."""
    return {"progress": cfg.progress, "transport": cfg.transport, "stall_timeout": cfg.stall_timeout,
            "bucket_bytes": cfg.bucket_size}
