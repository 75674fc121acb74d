"""The reader of run directories: the one module that reads what ``ssdmpi train`` (and a benchmark's
PyTorch peer, ``ssdmpi/bench/torch_peer.py``) leaves in a run directory. ``ssdmpi plot``, the
``--csv`` tables (``ssdmpi/loggers.py``), resume's trimming and the benchmarks all read through it.

A run directory holds (each read by one function here):

- ``metrics.jsonl``: one JSON object per line, appended as the run goes (the record kinds and their
  fields: ``ssdmpi/metrics.py``; a ``start`` record opens each part of a resumed run with its
  configuration and world size): ``record_lines``, ``read_records``;
- ``summary.json``: a finished run's summary, one JSON object: ``read_summary``;
- ``config.yaml``: the resolved configuration, the last part's (a peer writes ``config.json``):
  ``read_config``.

**The rule for a bad line of ``metrics.jsonl``** (every reader here applies it): blank lines are
ignored; a line that is not a JSON object is, when it is the file's last non-blank line, what a
run killed while writing leaves: it is skipped; anywhere else it is corruption: ``CorruptMetrics``
(a ``UserError``: one line naming ``path:line`` and what to do). A missing ``metrics.jsonl`` holds
no record (``record_lines`` yields none; ``load_run`` says it is missing).

``load_run(run_dir)`` parses a whole directory into a ``Run``: its step and evaluation records,
its parts, its settings and the numbers the figures and the benchmarks compare (steady-state
throughput, final accuracy, time to an accuracy, per-step means). Metric names are read through
the alias table ``FIELDS``; a record without a ``kind`` counts as an evaluation when it carries a
test accuracy.

Light: no NumPy, no MPI; YAML is imported only to read a config.
"""

from __future__ import annotations

import json
import math
import os
import string
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from ssdmpi.algos import registry
from ssdmpi.errors import UserError

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
PEER_CONFIG = "config.json"   # what a benchmark's PyTorch peer records instead of config.yaml
CONFIG_FILES = (PEER_CONFIG, "config.yaml", "config.yml", "resolved_config.yaml")   # the first found is read


class CorruptMetrics(UserError):
    """A line of ``metrics.jsonl`` other than the last is not a JSON object."""


# ----------------------------------------------------------------------------- the files

def metrics_path(run_dir) -> str:
    """The path of ``run_dir``'s ``metrics.jsonl`` (whether or not it exists)."""
    return os.path.join(run_dir, METRICS)


def has_metrics(run_dir) -> bool:
    """Whether ``run_dir`` holds a ``metrics.jsonl`` (a run started there)."""
    return os.path.isfile(metrics_path(run_dir))


def record_lines(path):
    """``(line, record)`` for each record of the ``metrics.jsonl`` at ``path``, in file order, ``line``
    as written (with its newline, if it has one); none when there is no file. Applies the module's rule
    for a bad line (a last line cut short is skipped; ``CorruptMetrics`` for one elsewhere);
    ``UserError`` for a file that cannot be read as UTF-8 text."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: unreadable ({exc})") from None
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if i == last:
                return      # the run was killed mid-write
            raise CorruptMetrics(f"{path}:{i + 1}: corrupt metrics line ({exc}); the file is not JSON lines: "
                                 "repair or delete that line") from None
        yield line, record


def read_records(path) -> list[dict]:
    """The records of the ``metrics.jsonl`` at ``path`` (``record_lines``; [] when there is none)."""
    return [record for _, record in record_lines(path)]


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not readable JSON ({exc}); re-run the job or remove the file") from None
    return data if isinstance(data, dict) else {}


def read_summary(run_dir) -> dict:
    """``summary.json`` of ``run_dir`` ({} while the run has not finished: no file; {} for JSON that is
    not an object); ``UserError`` (one line) for a file that is not JSON."""
    path = Path(run_dir) / SUMMARY
    return _read_json(path) if path.is_file() else {}


def read_config(run_dir) -> dict:
    """The configuration ``run_dir`` records (the first of ``CONFIG_FILES`` found), as a mapping; {}
    when there is none, or it cannot be read (a config only labels a run)."""
    run_dir = Path(run_dir)
    for name in CONFIG_FILES:
        path = run_dir / name
        if not path.is_file():
            continue
        if name.endswith(".json"):
            return _read_json(path)
        try:
            import yaml

            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except Exception:   # a config we cannot read only costs us labels
            return {}
        return data if isinstance(data, dict) else {}
    return {}


# ----------------------------------------------------------------------------- fields of a record

# Canonical name -> spellings accepted in metrics.jsonl / summary.json (first match wins).
# Dotted names look inside nested objects ("test.acc" is record["test"]["acc"]).
FIELDS = {
    "step": ("step", "iteration", "t"),
    "epoch": ("epoch", "epoch_float", "epochs"),
    # Training time: wall seconds spent in training steps (evaluations and checkpoints, the
    # same bookkeeping for every algorithm, left out); falls back to the run's wall time.
    "train_time": ("train_s", "time", "wall_time", "wall_s", "elapsed", "elapsed_s", "time_s"),
    "time": ("time", "wall_time", "wall_s", "elapsed", "elapsed_s", "time_s"),
    "loss": ("loss", "train_loss"),
    "test_acc": ("test_acc", "test_accuracy", "test.acc", "test.accuracy",
                 "eval.acc", "global.acc", "test_acc_global"),
    "test_loss": ("test_loss", "test.loss", "eval.loss", "global.loss", "test_loss_global"),
    "local_acc": ("test_acc_local", "local_acc", "local.acc", "test.local_acc"),
    "samples_per_s": ("samples_per_s", "samples_per_sec", "samples/s", "throughput", "sps"),
    "tokens_per_s": ("tokens_per_s",),
    "val_loss": ("val_loss",),
    "compute_s": ("compute_s", "compute_time", "compute", "time_compute", "timing.compute_s"),
    "inflight_s": ("inflight_s", "in_flight_s", "comm_inflight_s", "in_flight", "inflight",
                   "timing.inflight_s", "timing.in_flight_s"),
    "wait_s": ("wait_s", "exposed_wait_s", "exposed_s", "exposed_wait", "wait", "timing.wait_s"),
    "bytes_sent": ("bytes_sent", "bytes", "comm_bytes", "sent_bytes", "timing.bytes_sent"),
    "stage": ("stage",),
    "kind": ("kind", "type", "event", "record"),
}


WARMUP_STAGES = ("warmup", "warm-up", "switch")


def get(record: dict, name: str, default=None):
    """The value of canonical field ``name`` in ``record`` (see ``FIELDS``), or ``default``."""
    for key in FIELDS.get(name, (name,)):
        value = record
        for part in key.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            else:
                value = None
                break
        if value is not None:
            return value
    return default


def number(value):
    """``value`` as a finite float, or None."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def as_fraction(acc):
    """Accuracy as a fraction in [0, 1] (accepts percentages)."""
    acc = number(acc)
    if acc is None:
        return None
    return acc / 100.0 if acc > 1.0 else acc


@dataclass
class Run:
    """One run directory, parsed.

    ``steps``: training-step records in file order; ``evals``: evaluation records (those
    with a test accuracy); ``config``: the resolved config (the last part's) merged under
    ``summary``; ``segments``: one per ``start`` record (the run and each resume), in order:
    ``{"step", "world_size", "workers", "global_batch", "config"}``.
    """

    path: Path
    steps: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    segments: list = field(default_factory=list)

    def setting(self, name, default=None):
        """A run setting (``algo``, ``delay``, ``comm``, ...) from the config, then the summary."""
        for source in (self.config, self.config.get("algo") if isinstance(self.config.get("algo"), dict) else {},
                       self.summary, self.summary.get("config", {}) if isinstance(self.summary, dict) else {}):
            if isinstance(source, dict) and source.get(name) is not None and not isinstance(source.get(name), dict):
                return source[name]
        return default

    def history(self, name) -> list:
        """The values setting ``name`` took over the run's parts (``segments``), in order, each change
        once: ``[0.05, 0.01]`` for a run resumed at another lr. Besides the settings: ``world_size``
        and ``global_batch`` (per-rank batch x training ranks; None where the world size is unknown).
        A run without ``start`` records has one part, its config's."""
        parts = self.segments or [{"world_size": self.setting("world_size"), "config": self.config}]
        values = []
        for part in parts:
            value = self._value(part, name)
            if not values or setting_text(values[-1]) != setting_text(value):
                values.append(value)
        return values

    def history_text(self, name) -> str | None:
        """``history(name)`` as a label shows it (``0.05→0.01``); None where it was never set."""
        values = self.history(name)
        return None if all(v is None for v in values) else "→".join(setting_text(v) for v in values)

    def _value(self, part: dict, name):
        """Setting ``name`` in one part of the run (see ``history``)."""
        config = part.get("config") or {}
        if name == "world_size":
            return part.get("world_size")
        if name == "global_batch":
            if part.get("global_batch") is not None:
                return part["global_batch"]
            batch, workers = config.get("batch_size", self.setting("batch_size")), part.get("workers")
            if workers is None and part.get("world_size") is not None and self.spec is not None:
                try:
                    workers = self.spec.workers(SimpleNamespace(**config), int(part["world_size"]))
                except (AttributeError, TypeError, ValueError):
                    workers = None
            return int(batch) * int(workers) if number(batch) is not None and number(workers) is not None else None
        value = config.get(name)
        return self.setting(name) if value is None and not self.segments else value

    @property
    def algo(self) -> str:
        return str(self.setting("algo", "?"))

    @property
    def spec(self):
        """The algorithm's spec (``ssdmpi/algos/registry.py``), or None for an unknown name."""
        return registry.find(self.algo)

    @property
    def baseline(self) -> bool:
        """A run of the algorithm the others are compared with (ssgd)."""
        return bool(self.spec and self.spec.baseline)

    @property
    def warmup(self) -> bool:
        """The algorithm has an SSGD warm-up (all but ssgd, which is warm-up forever)."""
        return self.spec is None or self.spec.warmup

    @property
    def k(self):
        """The delay/period ``k`` when it matters for this algorithm (fixed or set), else None."""
        spec = self.spec
        if spec is not None and not spec.delay_stage:
            return None
        if spec is not None and "delay" in spec.fixed:
            return spec.fixed["delay"]
        k = self.setting("delay", self.setting("k"))
        return int(k) if number(k) is not None else None

    @property
    def label(self) -> str:
        """A short legend label: ``ssgd``, ``ssd period k=5``, ``localsgd k=5`` (the algorithm's ``label``
        parts with this run's settings, as their history reads: ``k=5→10``; an unknown algorithm shows
        its k; no algorithm: the dir name)."""
        if self.algo == "?":
            return self.path.name
        spec = self.spec
        fixed = spec is not None and "delay" in spec.fixed
        delay = None if self.k is None else str(self.k) if fixed else self.history_text("delay") or str(self.k)
        values = {"delay": delay} | {name: self.history_text(name) for name in registry.SETTINGS if name != "delay"}
        parts = self.spec.label if self.spec is not None else ("k={delay}",)
        shown = [p.format(**values) for p in parts if all(values.get(n) is not None for n in _fields(p))]
        return " ".join([self.algo] + shown)

    def series(self, records, x: str, y: str):
        """Paired lists (xs, ys) of fields ``x`` and ``y`` over ``records`` where both are numbers."""
        xs, ys = [], []
        for r in records:
            a, b = number(get(r, x)), number(get(r, y))
            if a is not None and b is not None:
                xs.append(a)
                ys.append(b)
        return xs, ys

    def steady_steps(self) -> list:
        """Step records past the SSGD warm-up (all of them when every record is warm-up, as
        for ``ssgd``, which is warm-up forever). A record is past the warm-up when it covers
        none of the first ``warmup_steps`` steps: the record logged at the switch says
        ``delay`` (the stage after its last step) but timed warm-up steps."""
        warmup = number(self.setting("warmup_steps")) if self.warmup else None
        steady, prev = [], 0.0
        for r in self.steps:
            step = number(get(r, "step"))
            covers_warmup = warmup is not None and prev < warmup
            if str(get(r, "stage", "")).lower() not in WARMUP_STAGES and not covers_warmup:
                steady.append(r)
            prev = step if step is not None else prev
        return steady or self.steps

    def throughput(self, name: str = "samples_per_s"):
        """Steady-state samples/s (``name``: ``tokens_per_s`` for a language model's tokens/s): the
        harmonic mean of the logged values past the warm-up. Every logged interval covers the same
        number of samples, so this is total samples over total time (a median or plain mean would
        over-weight the fast intervals of a ``--comm period`` run, whose waits fall into a few of
        them). Falls back to the summary's; None if neither exists."""
        values = [v for v in (number(get(r, name)) for r in self.steady_steps()) if v and v > 0]
        if values:
            return len(values) / sum(1.0 / v for v in values)
        return number(get(self.summary, name))

    def final_accuracy(self):
        """Test accuracy (fraction) of the last evaluation, or of the summary; None if there is none."""
        if self.evals:
            return as_fraction(get(self.evals[-1], "test_acc"))
        return as_fraction(get(self.summary, "test_acc"))

    def final_val_loss(self):
        """A language model's validation loss (nats per token) of the last evaluation, or of the summary;
        None for a run without one (a classifier)."""
        if self.evals:
            return number(get(self.evals[-1], "val_loss"))
        return number(get(self.summary, "val_loss"))

    def warmup_end(self, x: str):
        """Where the SSGD warm-up ends and the delay stage begins, on axis ``x`` (``step``,
        ``epoch`` or ``train_time``, the last interpolated between step records); None for a run
        without one (ssgd, no warm-up steps) or that never left it."""
        warmup = number(self.setting("warmup_steps")) if self.warmup else None
        left = any(str(get(r, "stage", "")).lower() not in WARMUP_STAGES + ("",) for r in self.steps + self.evals)
        if not warmup or warmup <= 0 or not left:
            return None
        if x == "step":
            return warmup
        points = [(0.0, 0.0)] + list(zip(*self.series(self.steps, "step", x)))
        for (s0, v0), (s1, v1) in zip(points, points[1:]):
            if s0 <= warmup <= s1 and s1 > s0:
                return v0 + (warmup - s0) / (s1 - s0) * (v1 - v0)
        return None

    def time_to_accuracy(self, target: float):
        """Training seconds (``train_time``) of the first evaluation with test accuracy >= ``target``
        (a fraction), else None."""
        for r in self.evals:
            acc, t = as_fraction(get(r, "test_acc")), number(get(r, "train_time"))
            if acc is not None and t is not None and acc >= target - 1e-12:
                return t
        return None

    def time_to_val_loss(self, target: float):
        """Training seconds (``train_time``) of the first evaluation with validation loss <= ``target``,
        else None."""
        for r in self.evals:
            loss, t = number(get(r, "val_loss")), number(get(r, "train_time"))
            if loss is not None and t is not None and loss <= target + 1e-12:
                return t
        return None


# Settings that tell runs apart in a legend: each one whose value differs between the runs of
# a figure, or changed within one (a resume), is added to every label (``ssd period k=5 seed=1


def setting_text(value) -> str:
    """A setting's value as a label shows it (``0.05``, ``256,128``; ``?`` when unknown)."""
    if value is None:
        return "?"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _fields(template: str) -> list:
    """The setting names a label part like ``"k={delay}"`` reads."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


# ----------------------------------------------------------------------------- the whole directory

def load_run(run_dir) -> Run:
    """Parse ``run_dir`` into a ``Run``; ``UserError`` (one line) for a missing directory, a missing or
    empty ``metrics.jsonl``, a corrupt line (the module's rule) or an unreadable ``summary.json``."""
    run_dir = Path(run_dir)
    path = Path(metrics_path(run_dir))
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    if not path.is_file():
        raise UserError(f"{path}: missing; is {run_dir} a run directory written by 'ssdmpi train'?")
    run = Run(path=run_dir, summary=read_summary(run_dir), config=read_config(run_dir))
    for _, record in record_lines(path):
        kind = str(get(record, "kind", "")).lower()
        if kind == "start":
            config = record.get("config")
            run.segments.append({"step": record.get("step"), "world_size": record.get("world_size"),
                                 "workers": record.get("workers"), "global_batch": record.get("global_batch"),
                                 "config": config if isinstance(config, dict) else {}})
        elif kind == "eval" or (not kind and get(record, "test_acc") is not None):
            run.evals.append(record)
        elif kind in ("step", ""):
            run.steps.append(record)
        # other kinds (checkpoint, stop) say nothing the figures use
    if not run.steps and not run.evals:
        raise UserError(f"{path}: empty (no step or evaluation records); did the run start?")
    if run.segments:       # the last part's settings, under config.yaml's (which the last part wrote)
        run.config = {**run.segments[-1]["config"], **run.config}
    return run


def per_step_means(run, names) -> dict:
    """``{name: per-step mean}`` of step-record fields over the run's steady-state records.

    The trainer logs one record every ``--log-every`` steps holding per-step means over
    that interval (``ssdmpi/metrics.py``); records are weighted by the steps they cover
    (the steps since the previous record), so a short last interval counts for less.
    None where no steady record has the field.
    """
    totals = dict.fromkeys(names, 0.0)
    seen = dict.fromkeys(names, False)
    steady = {id(r) for r in run.steady_steps()}
    steps, prev = 0, 0.0   # the first record covers the steps since the start
    for r in run.steps:
        step = number(get(r, "step"))
        n = step - prev if (step is not None and prev is not None) else None
        prev = step if step is not None else prev
        if n is None or n <= 0 or id(r) not in steady:
            continue
        steps += n
        for name in totals:
            value = number(get(r, name))
            if value is not None:
                totals[name] += value * n
                seen[name] = True
    if not steps:
        return dict.fromkeys(names)
    return {name: (totals[name] / steps if seen[name] else None) for name in totals}

