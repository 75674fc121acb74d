"""Rank 0's outputs: metrics.jsonl records, the display (step lines, the bar on a terminal and not on a
pipe), the summary files and the best evaluation."""

import io
import json
import os

from ssdmpi import metrics


def test_metrics_log_writes_one_flushed_json_object_per_line_with_nan_as_null(tmp_path):
    import numpy as np

    path = tmp_path / "metrics.jsonl"
    log = metrics.MetricsLog(str(path))
    log.write({"kind": "step", "step": 10, "loss": float("nan"), "lr": np.float32(0.5), "n": np.int64(3)})
    # flushed at once: readable before close (a crashed run keeps what it logged)
    (line,) = path.read_text().splitlines()
    assert json.loads(line) == {"kind": "step", "step": 10, "loss": None, "lr": 0.5, "n": 3}
    log.write({"kind": "eval", "test_acc": 0.9})
    log.close()
    assert [json.loads(x)["kind"] for x in path.read_text().splitlines()] == ["step", "eval"]


def test_resumed_run_appends_to_the_same_file(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        log = metrics.MetricsLog(path)
        log.write({"kind": "start", "step": step})
        log.close()
    assert len(open(path).read().splitlines()) == 2


def test_step_lines_without_a_terminal_only_when_asked_for():
    out = io.StringIO()
    progress = metrics.Progress(total=200, enabled=True, bar=True, stream=out, step_lines=True)
    progress.advance(5)                                  # no line per step
    progress.update(10, {"epoch": "0.50", "loss": 0.123456, "acc": 0.91, "skip": None})
    progress.message("eval  step 10")
    progress.close()
    assert out.getvalue().splitlines() == ["step  10/200  epoch 0.50  loss 0.1235  acc 91.00%", "eval  step 10"]
    quiet = io.StringIO()
    progress = metrics.Progress(total=200, enabled=True, bar=True, stream=quiet)
    progress.update(10, {"epoch": "0.50", "loss": 0.123456})
    progress.message("eval  step 10")
    progress.close()
    assert quiet.getvalue() == "eval  step 10\n"      # the default: evaluation lines and messages only


def test_disabled_progress_is_silent():
    out = io.StringIO()
    progress = metrics.Progress(total=10, enabled=False, bar=True, stream=out, step_lines=True)
    progress.update(1, {"loss": 1.0})
    progress.message("x")
    progress.close()
    assert out.getvalue() == ""


def run_display(stream, total=50) -> bool:
    """Drive a display as the trainer does (a step line's figures every 10 steps, an evaluation's line);
    whether it drew a bar."""
    progress = metrics.Progress(total=total, enabled=True, bar=True, stream=stream)
    for step in range(1, total + 1):
        progress.advance(step)
        if step % 10 == 0:
            progress.update(step, {"epoch": f"{step / 10:.2f}", "stage": "delay", "loss": 0.5, "lr": 0.05,
                                   "samples/s": 123456, "wide": "x" * 200})
        if step == 25:
            progress.message("eval  step 25/50  test acc 90.00%")
    had_bar = progress.has_bar
    progress.close()
    stream.flush()
    return had_bar


def test_no_bar_and_no_carriage_return_on_a_pipe(tmp_path):
    """Under mpiexec a rank's stdout is a pipe (whatever the launcher writes to): no bar, as in a file."""
    read, write = os.pipe()
    with os.fdopen(write, "w") as stream:
        assert metrics.terminal_width(stream) is None
        assert not run_display(stream)
    with os.fdopen(read) as f:
        assert f.read() == "eval  step 25/50  test acc 90.00%\n"


def pty_with_size(columns: int):
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return master, os.fdopen(slave, "w")


def read_all(fd: int) -> str:
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):   # drained (or the other end closed)
            break
        if not chunk:
            break
        data += chunk
    return data.decode()


def test_a_bar_on_a_terminal_redraws_in_place_within_its_width():
    master, stream = pty_with_size(70)
    with stream:
        assert metrics.terminal_width(stream) == 70
        assert run_display(stream)
        text = read_all(master)
    os.close(master)
    # the terminal turns "\n" into "\r\n": a redraw is a "\r" that is not part of a line end
    redraws = text.replace("\r\n", "\n").split("\r")
    assert len(redraws) > 5, text
    assert "50/50" in text and "eval  step 25/50  test acc 90.00%\n" in text.replace("\r\n", "\n")
    for piece in redraws:
        for line in piece.split("\n"):
            assert len(line) <= 70, line            # never wider than the terminal: nothing wraps
    assert text.replace("\r\n", "\n").count("\n") == 2    # the evaluation's line and the bar's last one


def test_a_terminal_that_gives_no_size_is_of_unknown_width_unless_columns_says(monkeypatch):
    master, stream = pty_with_size(0)
    with stream:
        monkeypatch.delenv("COLUMNS", raising=False)
        assert metrics.terminal_width(stream) is None       # not shutil's 80-column guess
        assert not run_display(stream)
        monkeypatch.setenv("COLUMNS", "90")
        assert metrics.terminal_width(stream) == 90
    os.close(master)


def test_summary_files_and_text(tmp_path):
    summary = {"status": "done", "algo": "ssd", "world_size": 4, "model": "mlp", "num_params": 9610,
               "dataset": "digits", "step": 440, "epoch": 20.0, "time": 11.0, "wall_s": 12.5, "train_s": 9.25,
               "eval_s": 2.0, "samples_per_s": 3000.0, "test_acc": 0.9167, "test_loss": 0.37, "test_acc_local": 0.92,
               "best": {"metric": "test_acc", "value": 0.925, "step": 286}, "compute_s": 0.002,
               "inflight_s": 0.003, "wait_s": 0.001, "bytes_sent": 38440.0, "checkpoint": "c.h5",
               "run_dir": str(tmp_path)}
    text, path = metrics.write_summary(str(tmp_path), summary)
    assert open(path).read() == text + "\n"
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["test_acc"] == 0.9167 and saved["best"] == {"metric": "test_acc", "value": 0.925, "step": 286}
    assert "test accuracy (global model W): final 91.67% (loss 0.3700), best 92.50% at step 286" in text
    assert "rank 0's local model L): final 92.00%" in text
    assert "ssd on 4 ranks" in text
    # the wall time and its parts (1.25 s left for checkpoints and the rest), and what samples/s counts
    assert "steps 440 (20.00 epochs) in 12.5 s: training 9.2 s, evaluation 2.0 s, checkpoints and other 1.2 s" in text
    assert "samples/s (training only, all ranks): 3000" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "summary.txt"]   # no temporaries


def test_the_best_evaluation_is_the_highest_accuracy_the_later_on_a_tie():
    evals = [{"kind": "eval", "step": 22, "test_acc": 0.84}, {"kind": "eval", "step": 44, "test_acc": 0.925},
             {"kind": "eval", "step": 66, "test_acc": 0.91}, {"kind": "eval", "step": 88, "test_acc": 0.925},
             {"kind": "eval", "step": 110, "test_acc": 0.9222}]
    assert metrics.best_eval(evals) == {"metric": "test_acc", "value": 0.925, "step": 88}
    # folded in parts (a resumed run: the records before the resume, then the new ones)
    assert metrics.best_eval(evals[3:], metrics.best_eval(evals[:3])) == metrics.best_eval(evals)
    assert metrics.best_eval([{"kind": "eval", "step": 5}]) is None
    assert metrics.best_text(metrics.best_eval(evals)) == "92.50% at step 88"


def test_a_metric_where_lower_is_better_can_name_the_best(monkeypatch):
    monkeypatch.setitem(metrics.BEST_METRICS, "val_loss", False)
    evals = [{"step": 1, "val_loss": 2.5}, {"step": 2, "val_loss": 1.75}, {"step": 3, "val_loss": 2.0}]
    best = metrics.best_eval(evals)
    assert best == {"metric": "val_loss", "value": 1.75, "step": 2}
    assert metrics.best_text(best) == "val_loss 1.75 at step 2"


def test_format_duration():
    assert metrics.format_duration(3.25) == "3.2 s"
    assert metrics.format_duration(125) == "2m05s"
    assert metrics.format_duration(3 * 3600 + 61) == "3h01m01s"
