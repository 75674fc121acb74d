"""``ssdmpi plot RUN_DIR... [--out DIR]``: PNG figures from run directories' ``metrics.jsonl``.

Figures (each written only when the runs hold the data it needs):

| file | what |
|---|---|
| ``accuracy_vs_time.png`` | test accuracy of the global model ``W`` (solid) and of rank 0's local model ``L`` (dashed, in the delay stage) vs training seconds (wall clock in training steps), with the time-to-accuracy target (ssgd's final - 0.5 point) when an ssgd run is given |
| ``accuracy_vs_epoch.png`` | test accuracy of ``W`` and ``L`` vs epoch |
| ``loss.png`` | training loss vs step (left) and test loss vs epoch (right) |
| ``step_breakdown.png`` | each run's steady-state step split into its phases (forward+backward, update, data, exposed wait, progress calls, other; ``ssdmpi/phases.py``), ms per step |
| ``throughput_vs_k.png`` | steady-state samples/s (``Run.throughput``) vs delay ``k``, one line per algorithm/schedule (only when runs differ in ``k``) |

The accuracy figures and the training loss mark where each run's SSGD warm-up ends (the
switch to the delay stage) with a dash-dotted vertical line in the run's color. Legends sit
beside the axes (or where the curves leave room), never over the curves.

Labels come from each run's history: a run resumed with other settings shows each one's values
in order (``lr=0.05→0.01``), and ``batch`` is the global batch (per-rank batch x training
ranks), which a resume on another number of ranks keeps (``Run.history``).

This module also holds the reader of run directories (``load_run``, the one function that
reads them), shared with ``ssdmpi bench train``. A run directory holds ``metrics.jsonl`` (one
JSON object per line; the record kinds and their fields are defined in ``ssdmpi/metrics.py``:
``step`` records carry per-step means over the logging interval, ``eval`` records the
test accuracy of the global model, a ``start`` record opens each part of a resumed run with
its configuration and world size), and optionally ``summary.json`` and the resolved
config (``config.yaml``, the last part's). Metric names are read through the alias table ``FIELDS``; a
record without a ``kind`` counts as an evaluation when it carries a test accuracy.

matplotlib is imported only when figures are drawn, with the Agg backend (no display).
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
            if not values or _setting_text(values[-1]) != _setting_text(value):
                values.append(value)
        return values

    def history_text(self, name) -> str | None:
        """``history(name)`` as a label shows it (``0.05→0.01``); None where it was never set."""
        values = self.history(name)
        return None if all(v is None for v in values) else "→".join(_setting_text(v) for v in values)

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

    def throughput(self):
        """Steady-state samples/s: the harmonic mean of the logged ``samples_per_s`` past the
        warm-up. Every logged interval covers the same number of samples, so this is total
        samples over total time (a median or plain mean would over-weight the fast intervals
        of a ``--comm period`` run, whose waits fall into a few of them). Falls back to the
        summary's samples/s; None if neither exists."""
        values = [v for v in (number(get(r, "samples_per_s")) for r in self.steady_steps()) if v and v > 0]
        if values:
            return len(values) / sum(1.0 / v for v in values)
        return number(get(self.summary, "samples_per_s"))

    def final_accuracy(self):
        """Test accuracy (fraction) of the last evaluation, or of the summary; None if there is none."""
        if self.evals:
            return as_fraction(get(self.evals[-1], "test_acc"))
        return as_fraction(get(self.summary, "test_acc"))

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


# Settings that tell runs apart in a legend: each one whose value differs between the runs of
# a figure, or changed within one (a resume), is added to every label (``ssd period k=5 seed=1
# lr=0.1``), as ``name=value`` (``Run.history_text``). ``batch`` is the global batch.
LEGEND_SETTINGS = (("seed", "seed"), ("lr", "lr"), ("global_batch", "batch"), ("world_size", "ranks"),
                   ("model", "model"), ("dataset", "data"), ("widths", "widths"))


def _setting_text(value) -> str:
    if value is None:
        return "?"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def differing_settings(runs) -> list:
    """The ``(setting, name)`` pairs of ``LEGEND_SETTINGS`` whose values differ between ``runs`` or
    changed within one of them."""
    return [(key, name) for key, name in LEGEND_SETTINGS
            if len({run.history_text(key) for run in runs}) > 1 or any(len(run.history(key)) > 1 for run in runs)]


def _suffix(run, differing) -> str:
    return "".join(f" {name}={_setting_text(run.history_text(key))}" for key, name in differing)


def _fields(template: str) -> list:
    """The setting names a label part like ``"k={delay}"`` reads."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def legend_labels(runs) -> list:
    """One legend label per run, each different from the others where the runs differ: ``Run.label``
    plus every ``LEGEND_SETTINGS`` value that differs between the runs; two runs that still
    read the same (repeats of one setting) get their directory names added."""
    differing = differing_settings(runs)
    labels = [run.label + _suffix(run, differing) for run in runs]
    return [f"{label} ({run.path.name})" if labels.count(label) > 1 else label for label, run in zip(labels, runs)]


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not readable JSON ({exc}); re-run the job or remove the file") from None
    return data if isinstance(data, dict) else {}


def _read_config(run_dir: Path) -> dict:
    for name in ("config.json", "config.yaml", "config.yml", "resolved_config.yaml"):
        path = run_dir / name
        if not path.is_file():
            continue
        if name.endswith(".json"):
            return _read_json(path)
        try:
            import yaml

            data = yaml.safe_load(path.read_text())
        except Exception:   # a config we cannot read only costs us legend labels
            return {}
        return data if isinstance(data, dict) else {}
    return {}


def load_run(run_dir) -> Run:
    """Parse ``run_dir``; raises ``UserError`` (one line) for a missing, empty or corrupt metrics file.

    A truncated LAST line (a run killed while writing) is tolerated and skipped; a bad
    line anywhere else means the file is corrupt.
    """
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    if not path.is_file():
        raise UserError(f"{path}: missing; is {run_dir} a run directory written by 'ssdmpi train'?")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: unreadable ({exc})") from None
    lines = [(i, line) for i, line in enumerate(lines, 1) if line.strip()]
    summary = run_dir / "summary.json"
    run = Run(path=run_dir, summary=_read_json(summary) if summary.is_file() else {}, config=_read_config(run_dir))
    for n, (lineno, line) in enumerate(lines):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if n == len(lines) - 1 and n > 0:
                continue   # the run was killed mid-write
            raise UserError(f"{path}:{lineno}: corrupt metrics line ({exc}); the file is not JSON lines") from None
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


# ----------------------------------------------------------------------------- figures

def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError("'ssdmpi plot' needs matplotlib: pip install 'ssdmpi[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """Write atomically (temporary file + rename), so a reader never sees half a PNG."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    os.replace(tmp, path)
    return path


WARMUP_END = "end of the SSGD warm-up"   # the legend entry of the dash-dotted vertical lines


def _mark_warmup_end(ax, run, x: str, color) -> bool:
    """A dash-dotted vertical line in ``color`` where ``run``'s warm-up ends on axis ``x``; whether one was drawn."""
    at = run.warmup_end(x)
    if at is None:
        return False
    ax.axvline(at, color=color, linestyle="-.", linewidth=1, label="_" + WARMUP_END)
    return True


def _warmup_legend_entry(ax) -> None:
    """One legend entry for every warm-up line (a gray dash-dotted sample)."""
    ax.plot([], [], color="gray", linestyle="-.", linewidth=1, label=WARMUP_END)


def _accuracy_figure(plt, runs, x: str, xlabel: str, title: str):
    """Test accuracy of ``W`` (solid) and of rank 0's local model ``L`` (dashed, the same color;
    in the delay stage) on axis ``x``; a dash-dotted line where each run's warm-up ends."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = marked = 0
    for run, label in zip(runs, legend_labels(runs)):
        xs, ys = run.series(run.evals, x, "test_acc")
        if not xs:
            continue
        (line,) = ax.plot(xs, [100 * as_fraction(y) for y in ys], marker="o", markersize=3, label=f"{label}: W")
        lx, ly = run.series(run.evals, x, "local_acc")
        if lx:
            ax.plot(lx, [100 * as_fraction(y) for y in ly], color=line.get_color(), linestyle="--", marker="x",
                    markersize=3, linewidth=1, label=f"{label}: rank 0's L")
        marked += _mark_warmup_end(ax, run, x, line.get_color())
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    if marked:
        _warmup_legend_entry(ax)
    target = next((run.final_accuracy() for run in runs if run.baseline and run.final_accuracy()), None)
    if target is not None:
        ax.axhline(100 * target - 0.5, color="gray", linestyle=":", linewidth=1,
                   label="target: ssgd's final - 0.5 point")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%): global model W, rank 0's local model L")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    _legend_beside(ax)
    return fig


def _legend_beside(ax) -> None:
    """The legend to the right of the axes, top-aligned: it never covers a curve (the saved
    figure grows to hold it)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small")


def _loss_figure(plt, runs, prefix=""):
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    drawn_left = drawn_right = marked = 0
    for run, label in zip(runs, legend_labels(runs)):
        xs, ys = run.series(run.steps, "step", "loss")
        if xs:
            (line,) = left.plot(xs, ys, linewidth=1, label=label)
            marked += _mark_warmup_end(left, run, "step", line.get_color())
            drawn_left += 1
        xs, ys = run.series(run.evals, "epoch", "test_loss")
        if xs:
            right.plot(xs, ys, marker="o", markersize=3, label=label)
            drawn_right += 1
    if not drawn_left and not drawn_right:
        plt.close(fig)
        return None
    if marked:
        _warmup_legend_entry(left)
    left.set_xlabel("step")
    left.set_ylabel("training loss (mean over ranks and log interval)")
    left.set_title(prefix + "Training loss")
    right.set_xlabel("epoch")
    right.set_ylabel("test loss of global model W")
    right.set_title(prefix + "Test loss")
    for ax, drawn in ((left, drawn_left), (right, drawn_right)):
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    return fig


def throughput_by_k(runs):
    """{series label: sorted [(k, steady-state samples/s)]} plus the ssgd baseline (or None).

    One series per algorithm/schedule and per value of each setting the runs differ in
    (``ssd period seed=1``: see ``legend_labels``)."""
    lines, baseline = {}, None
    differing = differing_settings(runs)
    for run in runs:
        sps = run.throughput()
        if sps is None:
            continue
        if run.baseline:
            baseline = sps if baseline is None else max(baseline, sps)
            continue
        if run.k is None:
            continue
        name = run.label.rsplit(" k=", 1)[0] + _suffix(run, differing)
        lines.setdefault(name, []).append((run.k, sps))
    return {name: sorted(points) for name, points in lines.items()}, baseline


def _throughput_figure(plt, runs, prefix=""):
    ks = {run.k for run in runs if run.k is not None}
    if len(ks) < 2:
        return None
    lines, baseline = throughput_by_k(runs)
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in lines.items():
        ax.plot([k for k, _ in points], [s for _, s in points], marker="o", label=name)
    if baseline is not None:
        ax.axhline(baseline, color="black", linestyle="--", linewidth=1, label="ssgd (no delay)")
    ax.set_xlabel("delay / period k (steps)")
    ax.set_ylabel("training throughput (samples/s, all ranks)")
    ax.set_title(prefix + "Throughput vs k (after the warm-up)")
    ax.set_xticks(sorted(ks))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    _legend_beside(ax)
    return fig


def _breakdown_figure(plt, runs, prefix=""):
    """``step_breakdown.png``: each run's steady-state step as stacked bars of its phases
    (ssdmpi/phases.py), ms per step; None when no run logged a breakdown."""
    from ssdmpi.phases import BREAKDOWN, LABELS

    rows = []
    for run, label in zip(runs, legend_labels(runs)):   # the legends' labels: runs of one algorithm differ
        means = per_step_means(run, BREAKDOWN)
        if all(means[k] is not None for k in BREAKDOWN):
            rows.append((label, means))
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.5 * len(rows)))
    left = [0.0] * len(rows)
    for key in BREAKDOWN:
        widths = [max(0.0, 1e3 * means[key]) for _, means in rows]
        ax.barh(range(len(rows)), widths, left=left, label=LABELS[key])
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (mean over ranks, after the warm-up)")
    ax.set_title(prefix + "Where a step goes")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize="small", ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.05 * len(rows)))
    return fig


def make_figures(runs, out_dir, title: str = "") -> list:
    """Draw every figure the runs have data for into ``out_dir``; return the written paths."""
    plt = _pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"{title}: " if title else ""
    figures = {
        "accuracy_vs_time.png": _accuracy_figure(plt, runs, "train_time",
                                                 "training time (s, wall clock, evaluations excluded)",
                                                 prefix + "Test accuracy vs training time"),
        "accuracy_vs_epoch.png": _accuracy_figure(plt, runs, "epoch", "epoch",
                                                  prefix + "Test accuracy vs epochs"),
        "loss.png": _loss_figure(plt, runs, prefix),
        "throughput_vs_k.png": _throughput_figure(plt, runs, prefix),
        "step_breakdown.png": _breakdown_figure(plt, runs, prefix),
    }
    written = []
    for name, fig in figures.items():
        if fig is None:
            continue
        written.append(_save(fig, out_dir / name))
        plt.close(fig)
    return written


def add_arguments(parser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories holding metrics.jsonl")
    parser.add_argument("--out", default="figures", metavar="DIR",
                        help="directory for the PNG files (created if needed; default ./%(default)s)")
    parser.add_argument("--title", default="", help="prefix for the figure titles (e.g. the experiment name)")


def run(args) -> int:
    runs = [load_run(d) for d in args.run_dirs]
    written = make_figures(runs, args.out, title=args.title)
    if not written:
        raise UserError("no figure could be drawn: the runs log no test accuracy, loss or samples/s")
    for path in written:
        print(path)
    return 0
