"""Rank 0's outputs: metrics.jsonl records, the plain progress lines, the summary files."""

import io
import json

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


def test_plain_progress_lines_without_a_terminal():
    out = io.StringIO()
    progress = metrics.Progress(total=200, enabled=True, bar=False, stream=out)
    progress.advance(5)                                  # no line per step
    progress.update(10, {"epoch": "0.50", "loss": 0.123456, "acc": 0.91, "skip": None})
    progress.message("eval  step 10")
    progress.close()
    assert out.getvalue().splitlines() == ["step  10/200  epoch 0.50  loss 0.1235  acc 91.00%", "eval  step 10"]


def test_disabled_progress_is_silent():
    out = io.StringIO()
    progress = metrics.Progress(total=10, enabled=False, bar=True, stream=out)
    progress.update(1, {"loss": 1.0})
    progress.message("x")
    progress.close()
    assert out.getvalue() == ""


def test_no_progress_bar_when_the_launcher_is_not_on_a_terminal():
    # pytest's parent is not an MPI launcher (or its stderr is not a terminal)
    assert metrics.launcher_on_terminal() is False


def test_summary_files_and_text(tmp_path):
    summary = {"status": "done", "algo": "ssd", "world_size": 4, "model": "mlp", "num_params": 9610,
               "dataset": "digits", "step": 440, "epoch": 20.0, "time": 12.5, "samples_per_s": 3000.0,
               "test_acc": 0.9167, "test_loss": 0.37, "test_acc_local": 0.92, "compute_s": 0.002,
               "inflight_s": 0.003, "wait_s": 0.001, "bytes_sent": 38440.0, "checkpoint": "c.h5",
               "run_dir": str(tmp_path)}
    text, path = metrics.write_summary(str(tmp_path), summary)
    assert open(path).read() == text + "\n"
    assert json.loads((tmp_path / "summary.json").read_text())["test_acc"] == 0.9167
    assert "test accuracy (global model W): 91.67%" in text
    assert "rank 0's local model L): 92.00%" in text
    assert "ssd on 4 ranks" in text and "12.5 s" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "summary.txt"]   # no temporaries


def test_format_duration():
    assert metrics.format_duration(3.25) == "3.2 s"
    assert metrics.format_duration(125) == "2m05s"
    assert metrics.format_duration(3 * 3600 + 61) == "3h01m01s"
