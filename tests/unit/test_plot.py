"""``ssdmpi plot``: PNG figures from synthetic run directories, and one-line errors for bad ones."""

import json
import struct

import pytest

from tests.conftest import run_cli

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir, algo="ssgd", k=None, comm=None, sps=1000.0, epochs=3, steps_per_epoch=20,
              step_time=0.01, final_acc=0.85, warmup_steps=5):
    """A small, plausible run directory as ``ssdmpi train`` writes it (metrics.jsonl + summary.json)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    records, step = [], 0
    for epoch in range(1, epochs + 1):
        for _ in range(steps_per_epoch):
            step += 1
            records.append({"kind": "step", "step": step, "epoch": step / steps_per_epoch, "time": step * step_time,
                            "stage": "warmup" if step <= warmup_steps else "delay",
                            "loss": 2.3 / (1 + 0.05 * step), "lr": 0.05, "samples_per_s": sps,
                            "compute_s": 0.004, "inflight_s": 0.003, "wait_s": 0.001, "bytes_sent": 4096})
        acc = final_acc * (1 - 0.3 / epoch)   # rises towards final_acc, reached at the last epoch
        if epoch == epochs:
            acc = final_acc
        records.append({"kind": "eval", "step": step, "epoch": float(epoch), "time": step * step_time,
                        "test_acc": acc, "test_loss": 1.0 / epoch})
    config = {"algo": algo, "delay": k if k is not None else 5, "comm": comm or "step", "epochs": epochs}
    records.insert(0, {"kind": "start", "world_size": 2, "config": config})
    records.append({"kind": "checkpoint", "step": step, "path": "ckpt.h5", "reason": "end"})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "summary.json").write_text(json.dumps({"algo": algo, "test_acc": final_acc, "step": step,
                                                      "samples_per_s": sps, "time": step * step_time}))
    return run_dir


def png_size(path):
    """(width, height) from a PNG's IHDR chunk; asserts the file is a PNG."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_reader_classifies_steps_and_evaluations(tmp_path):
    from ssdmpi.rundir import load_run

    run = load_run(write_run(tmp_path / "r", algo="ssd", k=5, comm="period", epochs=2, steps_per_epoch=10))
    assert len(run.steps) == 20 and len(run.evals) == 2
    assert run.label == "ssd period k=5"
    assert run.final_accuracy() == pytest.approx(0.85)
    # the first evaluation at or above the target: epoch 2, at step 20 * 0.01 s
    assert run.time_to_accuracy(0.80) == pytest.approx(0.20)
    assert run.time_to_accuracy(0.99) is None


def test_plot_writes_readable_pngs_for_every_figure(tmp_path):
    runs = [write_run(tmp_path / "ssgd", algo="ssgd", sps=500),
            write_run(tmp_path / "ssd2", algo="ssd", k=2, comm="period", sps=800),
            write_run(tmp_path / "ssd5", algo="ssd", k=5, comm="period", sps=1100),
            write_run(tmp_path / "local5", algo="localsgd", k=5, sps=1000)]
    out = tmp_path / "figs"
    result = run_cli(["plot", *map(str, runs), "--out", str(out), "--title", "synthetic"])
    assert result.returncode == 0, result.stderr
    names = {"accuracy_vs_time.png", "accuracy_vs_epoch.png", "loss.png", "throughput_vs_k.png"}
    assert {p.name for p in out.iterdir()} == names
    assert set(result.stdout.split()) == {str(out / n) for n in names}
    for name in names:
        width, height = png_size(out / name)
        assert 400 <= width <= 2000 and 300 <= height <= 1200, (name, width, height)
        assert (out / name).stat().st_size > 10_000   # axes, labels and lines, not a blank canvas


def test_throughput_figure_needs_runs_that_differ_in_k(tmp_path):
    runs = [write_run(tmp_path / "a", algo="ssgd"), write_run(tmp_path / "b", algo="ssd", k=5, comm="period")]
    out = tmp_path / "figs"
    assert run_cli(["plot", *map(str, runs), "--out", str(out)]).returncode == 0
    assert not (out / "throughput_vs_k.png").exists()
    assert (out / "accuracy_vs_time.png").exists()


def test_throughput_by_k_takes_the_steady_state_throughput(tmp_path):
    from ssdmpi.plot import throughput_by_k
    from ssdmpi.rundir import load_run

    runs = [load_run(write_run(tmp_path / f"k{k}", algo="ssd", k=k, comm="period", sps=100.0 * k)) for k in (5, 1, 2)]
    runs.append(load_run(write_run(tmp_path / "s", algo="ssgd", sps=50.0)))
    lines, baseline = throughput_by_k(runs)
    assert lines == {"ssd period": [(1, pytest.approx(100.0)), (2, pytest.approx(200.0)), (5, pytest.approx(500.0))]}
    assert baseline == pytest.approx(50.0)


def one_line_error(result):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ssdmpi: error:")
    return lines[0]


def test_missing_run_directory_is_a_one_line_error(tmp_path):
    line = one_line_error(run_cli(["plot", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]))
    assert "no such run directory" in line


def test_missing_metrics_file_is_a_one_line_error(tmp_path):
    (tmp_path / "run").mkdir()
    line = one_line_error(run_cli(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "o")]))
    assert "metrics.jsonl" in line and "missing" in line


def test_empty_metrics_file_is_a_one_line_error(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("\n")
    line = one_line_error(run_cli(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "o")]))
    assert "empty" in line


def test_corrupt_metrics_line_is_a_one_line_error_naming_the_line(tmp_path):
    run = write_run(tmp_path / "run")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[3] = lines[3][:10]   # a damaged line in the middle
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    line = one_line_error(run_cli(["plot", str(run), "--out", str(tmp_path / "o")]))
    assert "metrics.jsonl:4: corrupt" in line
    assert not (tmp_path / "o").exists()


def test_truncated_last_line_of_a_killed_run_is_skipped(tmp_path):
    from ssdmpi.rundir import load_run

    run = write_run(tmp_path / "run", epochs=1, steps_per_epoch=4)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')
    assert len(load_run(run).steps) == 4


# ---- legends that tell runs apart ------------------------------------------------------------

def configured_run(name, **config):
    from pathlib import Path

    from ssdmpi.rundir import Run

    return Run(path=Path("runs") / name, config=config)


def test_legend_labels_add_the_seed_and_lr_where_runs_differ_in_them():
    from ssdmpi.plot import legend_labels

    ssd = {"algo": "ssd", "comm": "period", "delay": 5, "lr": 0.05}
    runs = [configured_run("a", algo="ssgd", seed=0, lr=0.05), configured_run("b", **ssd, seed=0),
            configured_run("c", **ssd, seed=1)]
    assert legend_labels(runs) == ["ssgd seed=0", "ssd period k=5 seed=0", "ssd period k=5 seed=1"]
    runs = [configured_run("a", **ssd, seed=0), configured_run("b", **dict(ssd, lr=0.1), seed=0)]
    assert legend_labels(runs) == ["ssd period k=5 lr=0.05", "ssd period k=5 lr=0.1"]
    runs = [configured_run("a", **ssd, seed=2), configured_run("b", **dict(ssd, lr=0.2), seed=3)]
    assert legend_labels(runs) == ["ssd period k=5 seed=2 lr=0.05", "ssd period k=5 seed=3 lr=0.2"]


def test_legend_labels_stay_short_when_runs_share_their_settings():
    from ssdmpi.plot import legend_labels

    runs = [configured_run("a", algo="ssgd", seed=0, lr=0.05),
            configured_run("b", algo="ssd", comm="period", delay=5, seed=0, lr=0.05)]
    assert legend_labels(runs) == ["ssgd", "ssd period k=5"]
    # the same settings twice (repeats): the directory names tell them apart
    runs = [configured_run("rep0", algo="ssgd", seed=0), configured_run("rep1", algo="ssgd", seed=0)]
    assert legend_labels(runs) == ["ssgd (rep0)", "ssgd (rep1)"]


def test_figures_and_throughput_lines_use_the_labels(tmp_path):
    from ssdmpi.plot import _accuracy_figure, _pyplot, throughput_by_k
    from ssdmpi.rundir import load_run

    dirs = [write_run(tmp_path / f"s{seed}k{k}", algo="ssd", k=k, comm="period", sps=100.0 * k + seed)
            for seed in (0, 1) for k in (2, 5)]
    for seed_dir in dirs:    # the seed in the start record's config, as ssdmpi train writes it
        lines = (seed_dir / "metrics.jsonl").read_text().splitlines()
        start = json.loads(lines[0])
        start["config"]["seed"] = int(seed_dir.name[1])
        (seed_dir / "metrics.jsonl").write_text("\n".join([json.dumps(start)] + lines[1:]) + "\n")
    runs = [load_run(d) for d in dirs]
    plt = _pyplot()
    fig = _accuracy_figure(plt, runs, "epoch", "epoch", "t")
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    plt.close(fig)
    assert texts == ["ssd period k=2 seed=0: W", "ssd period k=5 seed=0: W", "ssd period k=2 seed=1: W",
                     "ssd period k=5 seed=1: W"]
    lines, _ = throughput_by_k(runs)
    assert lines == {"ssd period seed=0": [(2, pytest.approx(200.0)), (5, pytest.approx(500.0))],
                     "ssd period seed=1": [(2, pytest.approx(201.0)), (5, pytest.approx(501.0))]}


def test_accuracy_and_loss_mark_the_end_of_the_warm_up_and_show_the_local_model(tmp_path):
    """A run whose warm-up is 5 steps (20 steps per epoch, 0.01 s per step) and whose evaluations
    carry rank 0's local model: a dash-dotted line at step 5 / epoch 0.25 / 0.05 s in the run's color,
    L dashed beside W; an ssgd run (no warm-up) gets no line."""
    from ssdmpi.plot import WARMUP_END, _accuracy_figure, _loss_figure, _pyplot
    from ssdmpi.rundir import load_run

    ssd = write_run(tmp_path / "ssd", algo="ssd", k=5, comm="period", warmup_steps=5)
    lines = (ssd / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    records[0]["config"]["warmup_steps"] = 5
    for r in records:
        if r["kind"] == "step":
            r["train_s"] = r["time"]
        if r["kind"] == "eval":
            r["train_s"], r["test_acc_local"] = r["time"], r["test_acc"] - 0.02
    (ssd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    runs = [load_run(ssd), load_run(write_run(tmp_path / "ssgd", algo="ssgd"))]
    plt = _pyplot()
    for x, at in (("epoch", 0.25), ("train_time", 0.05)):
        fig = _accuracy_figure(plt, runs, x, x, "t")
        ax = fig.axes[0]
        w = next(line for line in ax.lines if line.get_label() == "ssd period k=5: W")
        local = next(line for line in ax.lines if line.get_label() == "ssd period k=5: rank 0's L")
        assert local.get_linestyle() == "--" and local.get_color() == w.get_color()
        assert list(local.get_ydata()) == pytest.approx([100 * (y / 100 - 0.02) for y in w.get_ydata()])
        vertical = [line for line in ax.lines if line.get_label() == "_" + WARMUP_END]
        assert len(vertical) == 1 and list(vertical[0].get_xdata()) == pytest.approx([at, at])
        assert vertical[0].get_color() == w.get_color() and vertical[0].get_linestyle() == "-."
        assert WARMUP_END in [t.get_text() for t in ax.get_legend().get_texts()]
        plt.close(fig)
    fig = _loss_figure(plt, runs)
    vertical = [line for line in fig.axes[0].lines if line.get_label() == "_" + WARMUP_END]
    assert len(vertical) == 1 and list(vertical[0].get_xdata()) == [5, 5]
    plt.close(fig)


# ---- labels from a run's history, the breakdown's rows, legends off the curves ----------------

BREAKDOWN_MS = {"fb_s": 2.0, "update_s": 0.5, "data_s": 0.1, "blocked_s": 1.0, "progress_s": 0.1, "sync_s": 0.2,
                "other_s": 0.1}


def write_parts(run_dir, parts, global_batch_recorded=True):
    """A run directory in parts, as a run and its resumes write it: each part a start record (its
    config and world size), 10 step records (with a step breakdown) and an evaluation.
    ``parts``: ``[(world_size, config), ...]``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    records, step = [], 0
    for world_size, config in parts:
        start = {"kind": "start", "step": step, "world_size": world_size, "config": config}
        if global_batch_recorded:
            start.update(workers=world_size, global_batch=config["batch_size"] * world_size)
        records.append(start)
        for _ in range(10):
            step += 1
            records.append({"kind": "step", "step": step, "epoch": step / 10, "stage": "delay", "loss": 1.0 / step,
                            "samples_per_s": 1000.0, "step_s": sum(BREAKDOWN_MS.values()) / 1e3,
                            **{k: v / 1e3 * config["lr"] * 20 for k, v in BREAKDOWN_MS.items()}})
        records.append({"kind": "eval", "step": step, "epoch": step / 10, "test_acc": 0.8, "test_loss": 0.5})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


SSD5 = {"algo": "ssd", "comm": "period", "delay": 5, "seed": 0, "model": "mlp", "dataset": "digits"}


def test_a_resumed_run_is_labelled_by_its_history_and_the_global_batch(tmp_path):
    from ssdmpi.plot import legend_labels
    from ssdmpi.rundir import load_run

    # lr 0.05, resumed at 0.01 on half the ranks (the global batch of 64 kept: 16 per rank, then 32)
    resumed = load_run(write_parts(tmp_path / "resumed", [(4, dict(SSD5, lr=0.05, batch_size=16)),
                                                         (2, dict(SSD5, lr=0.01, batch_size=32))]))
    straight = load_run(write_parts(tmp_path / "straight", [(4, dict(SSD5, lr=0.05, batch_size=16))]))
    assert resumed.history("lr") == [0.05, 0.01] and resumed.history("global_batch") == [64]
    assert legend_labels([resumed, straight]) == ["ssd period k=5 lr=0.05→0.01 ranks=4→2",
                                                  "ssd period k=5 lr=0.05 ranks=4"]
    # alone, a run still shows what changed in it
    assert legend_labels([resumed]) == ["ssd period k=5 lr=0.05→0.01 ranks=4→2"]
    # start records that do not say the global batch: per-rank batch x ranks
    parts = [(4, dict(SSD5, lr=0.05, batch_size=16)), (4, dict(SSD5, lr=0.05, batch_size=32))]
    old = load_run(write_parts(tmp_path / "old", parts, global_batch_recorded=False))
    assert legend_labels([old, straight]) == ["ssd period k=5 batch=64→128", "ssd period k=5 batch=64"]


def test_the_step_breakdown_tells_runs_of_one_algorithm_apart(tmp_path):
    """Three ssd runs at three learning rates (their breakdowns scaled by lr, so they differ): three
    bars, each labelled with its lr, and each bar as long as its run's step."""
    from ssdmpi.plot import _breakdown_figure, _pyplot
    from ssdmpi.rundir import load_run

    runs = [load_run(write_parts(tmp_path / f"lr{lr}", [(2, dict(SSD5, lr=lr, batch_size=16))]))
            for lr in (0.05, 0.1, 0.2)]
    plt = _pyplot()
    fig = _breakdown_figure(plt, runs)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["ssd period k=5 lr=0.05", "ssd period k=5 lr=0.1",
                                                            "ssd period k=5 lr=0.2"]
    ends = {}
    for patch in ax.patches:
        row = round(patch.get_y() + patch.get_height() / 2)
        ends[row] = max(ends.get(row, 0.0), patch.get_x() + patch.get_width())
    plt.close(fig)
    total = sum(BREAKDOWN_MS.values())
    assert [ends[row] for row in sorted(ends)] == pytest.approx([total * lr * 20 for lr in (0.05, 0.1, 0.2)])


def test_the_accuracy_legend_is_beside_the_curves_not_over_them(tmp_path):
    from ssdmpi.plot import _accuracy_figure, _pyplot
    from ssdmpi.rundir import load_run

    runs = [load_run(write_run(tmp_path / "ssgd", algo="ssgd")),
            load_run(write_run(tmp_path / "ssd", algo="ssd", k=5, comm="period"))]
    plt = _pyplot()
    for x in ("epoch", "train_time"):
        fig = _accuracy_figure(plt, runs, x, x, "t")
        fig.canvas.draw()
        ax = fig.axes[0]
        legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
        assert legend.x0 >= axes.x1, (legend, axes)       # wholly to the right of the plotting area
        plt.close(fig)
