"""``ssdmpi plot RUN_DIR... [--out DIR]``: PNG figures from run directories' ``metrics.jsonl``.

Figures (each written only when the runs hold the data it needs):

| file | what |
|---|---|
| ``accuracy_vs_time.png`` | test accuracy of the global model ``W`` (solid) and of rank 0's local model ``L`` (dashed, in the delay stage) vs training seconds (wall clock in training steps), with the time-to-accuracy target (ssgd's final - 0.5 point) when an ssgd run is given |
| ``accuracy_vs_epoch.png`` | test accuracy of ``W`` and ``L`` vs epoch |
| ``loss.png`` | training loss vs step (left) and test loss (a language model's: validation loss) vs epoch (right) |
| ``val_loss_vs_time.png`` | a language model's validation loss (nats per token) of ``W`` (solid) and of rank 0's ``L`` (dashed, in the delay stage) vs training seconds |
| ``val_loss_vs_tokens.png`` | the same vs the tokens trained on (step x global batch x context) |
| ``step_breakdown.png`` | each run's steady-state step split into its phases (forward+backward, update, data, exposed wait, progress calls, other; ``ssdmpi/phases.py``), ms per step |
| ``throughput_vs_k.png`` | steady-state samples/s (``Run.throughput``) vs delay ``k``, one line per algorithm/schedule (only when runs differ in ``k``) |

Language-model runs (on a text dataset) are evaluated on a validation loss, not an accuracy: they
draw the validation-loss figures, classifier runs the accuracy ones.

The accuracy figures and the training loss mark where each run's SSGD warm-up ends (the
switch to the delay stage) with a dash-dotted vertical line in the run's color. Legends sit
beside the axes (or where the curves leave room), never over the curves.

Labels come from each run's history: a run resumed with other settings shows each one's values
in order (``lr=0.05→0.01``), and ``batch`` is the global batch (per-rank batch x training
ranks), which a resume on another number of ranks keeps (``Run.history``).

Runs are read by ``ssdmpi/rundir.py`` (``load_run``: the records of ``metrics.jsonl``, ``summary.json``
and the resolved config, and the numbers each figure shows).

matplotlib is imported only when figures are drawn, with the Agg backend (no display).
"""

from __future__ import annotations

import os
from pathlib import Path

from ssdmpi.errors import UserError
from ssdmpi.rundir import as_fraction, load_run, per_step_means, setting_text

# Settings that tell runs apart in a legend: each one whose value differs between the runs of
# a figure, or changed within one (a resume), is added to every label (``ssd period k=5 seed=1
# lr=0.1``), as ``name=value`` (``Run.history_text``). ``batch`` is the global batch.
LEGEND_SETTINGS = (("seed", "seed"), ("lr", "lr"), ("global_batch", "batch"), ("world_size", "ranks"),
                   ("model", "model"), ("dataset", "data"), ("widths", "widths"))


def differing_settings(runs) -> list:
    """The ``(setting, name)`` pairs of ``LEGEND_SETTINGS`` whose values differ between ``runs`` or
    changed within one of them."""
    return [(key, name) for key, name in LEGEND_SETTINGS
            if len({run.history_text(key) for run in runs}) > 1 or any(len(run.history(key)) > 1 for run in runs)]


def _suffix(run, differing) -> str:
    return "".join(f" {name}={setting_text(run.history_text(key))}" for key, name in differing)


def legend_labels(runs) -> list:
    """One legend label per run, each different from the others where the runs differ: ``Run.label``
    plus every ``LEGEND_SETTINGS`` value that differs between the runs; two runs that still
    read the same (repeats of one setting) get their directory names added."""
    differing = differing_settings(runs)
    labels = [run.label + _suffix(run, differing) for run in runs]
    return [f"{label} ({run.path.name})" if labels.count(label) > 1 else label for label, run in zip(labels, runs)]


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


def _keep(plt, fig, drawn, marked, ax) -> bool:
    """Whether figure ``fig`` is kept: False (the figure closed) when nothing was ``drawn``; when
    kept and a warm-up end was ``marked``, ``ax`` gets the warm-up lines' legend entry."""
    if not drawn:
        plt.close(fig)
        return False
    if marked:
        _warmup_legend_entry(ax)
    return True


def _global_and_local(ax, run, label: str, x: str, key: str, local_key: str, scale=None):
    """``run``'s evaluations of ``W`` (``key``: solid, circles) and of rank 0's ``L`` (``local_key``:
    dashed, crosses, the same color) on axis ``x``, each value mapped by ``scale`` (default: as
    logged); the W line, or None (nothing drawn) when the run logged no ``key``."""
    xs, ys = run.series(run.evals, x, key)
    if not xs:
        return None
    scale = scale or (lambda y: y)
    (line,) = ax.plot(xs, [scale(y) for y in ys], marker="o", markersize=3, label=f"{label}: W")
    lx, ly = run.series(run.evals, x, local_key)
    if lx:
        ax.plot(lx, [scale(y) for y in ly], color=line.get_color(), linestyle="--", marker="x", markersize=3,
                linewidth=1, label=f"{label}: rank 0's L")
    return line


def _accuracy_figure(plt, runs, x: str, xlabel: str, title: str):
    """Test accuracy of ``W`` (solid) and of rank 0's local model ``L`` (dashed, the same color;
    in the delay stage) on axis ``x``; a dash-dotted line where each run's warm-up ends."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = marked = 0
    for run, label in zip(runs, legend_labels(runs)):
        line = _global_and_local(ax, run, label, x, "test_acc", "local_acc", lambda y: 100 * as_fraction(y))
        if line is None:
            continue
        marked += _mark_warmup_end(ax, run, x, line.get_color())
        drawn += 1
    if not _keep(plt, fig, drawn, marked, ax):
        return None
    target = next((run.final_accuracy() for run in runs if run.baseline and run.final_accuracy()), None)
    if target is not None:
        ax.axhline(100 * target - 0.5, color="gray", linestyle=":", linewidth=1,
                   label="target: ssgd's final - 0.5 point")
    _finish(ax, xlabel, "test accuracy (%): global model W, rank 0's local model L", title)
    return fig


def _finish(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Axis labels, title, a light grid, and the legend to the right of the axes, top-aligned: it
    never covers a curve (the saved figure grows to hold it)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small")


def _val_loss_figure(plt, runs, x: str, xlabel: str, title: str):
    """A language model's validation loss of ``W`` (solid) and of rank 0's ``L`` (dashed, the same
    color; in the delay stage) on axis ``x`` (``train_time`` or ``tokens``); a dash-dotted line where
    each run's warm-up ends (on the time axis); None when no run logged a validation loss."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = marked = 0
    for run, label in zip(runs, legend_labels(runs)):
        line = _global_and_local(ax, run, label, x, "val_loss", "val_loss_local")
        if line is None:
            continue
        if x != "tokens":
            marked += _mark_warmup_end(ax, run, x, line.get_color())
        drawn += 1
    if not _keep(plt, fig, drawn, marked, ax):
        return None
    _finish(ax, xlabel, "validation loss (nats per token): global model W, rank 0's local model L", title)
    return fig


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
        if not xs:      # a language model: its validation loss
            xs, ys = run.series(run.evals, "epoch", "val_loss")
        if xs:
            right.plot(xs, ys, marker="o", markersize=3, label=label)
            drawn_right += 1
    if not _keep(plt, fig, drawn_left or drawn_right, marked, left):
        return None
    left.set_xlabel("step")
    left.set_ylabel("training loss (mean over ranks and log interval)")
    left.set_title(prefix + "Training loss")
    right.set_xlabel("epoch")
    right.set_ylabel("test loss of global model W (a language model's: validation loss)")
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
    ax.set_xticks(sorted(ks))
    ax.set_ylim(bottom=0)
    _finish(ax, "delay / period k (steps)", "training throughput (samples/s, all ranks)",
            prefix + "Throughput vs k (after the warm-up)")
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
        "val_loss_vs_time.png": _val_loss_figure(plt, runs, "train_time",
                                                 "training time (s, wall clock, evaluations excluded)",
                                                 prefix + "Validation loss vs training time"),
        "val_loss_vs_tokens.png": _val_loss_figure(plt, runs, "tokens", "tokens trained on",
                                                   prefix + "Validation loss vs tokens"),
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
        raise UserError("no figure could be drawn: the runs log no test accuracy, validation loss, loss or samples/s")
    for path in written:
        print(path)
    return 0
