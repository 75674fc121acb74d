"""Every setting of a run, declared once, and ``TrainConfig``: one resolved run, frozen.

``SETTINGS``: the data, the model, the run's length, the runtime and the run directory here; the
learning rate's, the optimizers', the algorithms' and the rules' from the registry
(``ssdmpi/algos/registry.py``, each declared in its own spec's file). Field name = YAML key =
``--flag-name``. ``ALTERNATIVES``: the settings that state one thing two ways. Imported when the
command-line parser is built: no NumPy here.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import yaml

from ssdmpi.algos import registry
from ssdmpi.algos.overlap import DEFAULT_BUCKET_BYTES
from ssdmpi.algos.registry import RESOLVED, Setting
from ssdmpi.comm.progress import DEFAULTS as PROGRESS_DEFAULTS
from ssdmpi.comm.progress import PROGRESS
from ssdmpi.comm.transport import TRANSPORTS
from ssdmpi.comm.watchdog import STALL_TIMEOUT_S
from ssdmpi.data.names import DATASETS
from ssdmpi.errors import UserError
from ssdmpi.parsing import parse_list, parse_size
from ssdmpi.validate import is_int, nonnegative_int, number, positive_int

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


def widths_value(text: str) -> list:
    return parse_list(text, "--widths", int, minimum=1, example="256,128")


def _size(text: str) -> int:
    """``--bucket-size``'s type: bytes, or argparse's error naming the flag."""
    try:
        return parse_size(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dropout(flag: str, value) -> None:
    number(flag, value, low=0.0, high=1.0, high_open=True)


# The settings of a model's shape (structural, passed to its factory when given): each applies to the
# models whose factory declares it (``ssdmpi/nn/models.py``: gpt's sizes, mlp's and gpt's dropout);
# given as a flag for another model it is refused, from a preset, a file or a checkpoint left out with a
# note (``ssdmpi/config/resolve.py``). ``widths`` (mlp's hidden widths) is declared below, as before.
GPT_SIZE = "the model's own (ssdmpi/nn/models.py)"
MODEL_SETTINGS = (
    Setting("n_layer", None, "transformer blocks of --model gpt", int, positive_int, metavar="N", group=DATA,
            default_text=GPT_SIZE, structural=True),
    Setting("n_head", None, "attention heads per block of --model gpt (a divisor of --d-model)", int, positive_int,
            metavar="N", group=DATA, default_text=GPT_SIZE, structural=True),
    Setting("d_model", None, "embedding width of --model gpt", int, positive_int, metavar="N", group=DATA,
            default_text=GPT_SIZE, structural=True),
    Setting("dropout", None, "dropout rate of --model gpt or mlp, in [0, 1)", float, _dropout, metavar="P",
            group=DATA, default_text="the model's own (0)", structural=True),
)
# The context of a language model: the tokens of each window of a text dataset (ssdmpi/data/text.py).
# A run on a text dataset that does not give it gets DEFAULT_CONTEXT; another dataset has no windows.
DEFAULT_CONTEXT = 128
CONTEXT = Setting("context", None, "tokens per window of a text dataset (a language model's context)", int,
                  positive_int, metavar="T", group=DATA, default_text=f"{DEFAULT_CONTEXT} with a text dataset",
                  structural=True)
# What a model's factory receives from the run's settings (when set): ``model_options``.
MODEL_OPTIONS = ("widths",) + tuple(s.name for s in MODEL_SETTINGS)

SWITCH = {"action": "store_const", "const": True}
SETTINGS = {s.name: s for s in (
    Setting("dataset", "digits", f"dataset: {' | '.join(DATASETS)} (see ssdmpi data list)", check=_name,
            group=DATA, structural=True),
    Setting("data_path", None, "where the dataset's files are", check=_text, metavar="PATH", group=DATA,
            default_text="the dataset's usual places"),
    Setting("augment", "none", "augmentation: none, flip, crop4 or crop4,flip", check=_augment, group=DATA),
    Setting("model", "mlp", "model: mlp, wide-mlp, lenet5, resnet20, gpt (ssdmpi.nn.MODELS), or "
            "package.module:factory (docs/API.md)", check=_name, group=DATA, structural=True),
    Setting("widths", None, "hidden widths of mlp", widths_value, _positive_ints, metavar="W1,W2", group=DATA,
            default_text="the model's own", structural=True),
    CONTEXT,
    *MODEL_SETTINGS,
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
# Left None until a run resolves them: the algorithm's and optimizer's settings, and the warm-up
# (given in steps or in epochs).
UNSET = (*RESOLVED, "warmup_steps")
STRUCTURAL = tuple(n for n, s in SETTINGS.items() if s.structural)
INVOCATION = tuple(n for n, s in SETTINGS.items() if s.invocation)
# The settings that state one thing two ways (the first one set wins), each pair compared as one on
# resume: the SSGD warm-up's length, and the run's length (``steps`` wins over ``epochs``). ``CLEARS``:
# a layer that sets one of these pairs' settings clears the other (the warm-up; ``epochs`` has a
# default, so ``--steps`` only wins over it).
WARMUP = ("warmup_steps", "warmup_epochs")
RUN_LENGTH = ("steps", "epochs")
ALTERNATIVES = (WARMUP, RUN_LENGTH)
CLEARS = (WARMUP,)
# Learning-rate schedules whose every value depends on the run's length.
LENGTH_SCHEDULES = ("cosine", "poly")


def model_options(settings) -> dict:
    """The options a run passes to its model's factory: each of ``MODEL_OPTIONS`` that ``settings`` (a
    ``TrainConfig`` or a config mapping, e.g. a checkpoint's) sets, ``widths`` as a tuple."""
    values = settings if isinstance(settings, dict) else settings.to_dict()
    return {name: tuple(values[name]) if name == "widths" else values[name] for name in MODEL_OPTIONS
            if values.get(name) is not None}


def first_set(settings: dict, names: tuple) -> tuple:
    """``(name, value)`` of the first of ``names`` set in ``settings`` (they replace each other),
    ``(names[0], None)`` when none is."""
    for name in names:
        if settings.get(name) is not None:
            return name, settings[name]
    return names[0], None


class _Methods:
    """One training run's every setting, resolved (field name = YAML key = ``--flag-name``;
    ``SETTINGS``), frozen: ``ssdmpi/config/resolve.py`` makes it, the trainer, the algorithm, the
    checkpoint and the Python API read it; a change is a new object (``dataclasses.replace``)."""

    def validate(self):
        """Raise ``UserError`` (one line, naming the option) for the first bad setting."""
        for name, s in SETTINGS.items():
            s.validate(getattr(self, name))
        for names in ALTERNATIVES:
            given = [n for n in names if getattr(self, n) is not None]
            if len(given) > 1 and names in CLEARS:
                raise UserError(f"give --{SETTINGS[names[0]].flag} or --{SETTINGS[names[1]].flag}, not both")
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
        return int(SETTINGS["warmup_steps"].default if self.warmup_steps is None else self.warmup_steps)

    def total_steps(self, steps_per_epoch: int) -> int:
        """Length of the run in iterations (``first_set`` of ``RUN_LENGTH``)."""
        name, value = first_set(self.to_dict(), RUN_LENGTH)
        return int(value) if name == "steps" else int(value) * int(steps_per_epoch)

    def workers(self, world_size: int) -> int:
        """How many of ``world_size`` ranks train on data (all but asgd's servers)."""
        return registry.ALGORITHMS[self.algo].workers(self, world_size)


class Dumper(yaml.SafeDumper):   # one line per setting, lists inline: widths: [256, 128]
    pass


Dumper.add_representer(list, lambda dumper, v: dumper.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
TrainConfig = dataclasses.make_dataclass(
    "TrainConfig", [(n, object, dataclasses.field(default=None if n in UNSET else s.default))
                    for n, s in SETTINGS.items()],
    bases=(_Methods,), frozen=True, namespace={"__doc__": _Methods.__doc__, "__module__": __name__})
