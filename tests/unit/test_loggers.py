"""``ssdmpi train --csv`` and ``--tensorboard`` (ssdmpi/loggers.py): the CSV tables hold exactly
the step and eval records of ``metrics.jsonl``, also across a resume; the event files are read
back by TensorBoard's own reader; a missing tensorboardX is a one-line error before anything
is written. Real runs under ``mpiexec``, as a user starts them."""

import csv
import json
import math
import os
import sys
import time

import pytest

from ssdmpi import loggers
from ssdmpi.errors import UserError
from tests.conftest import run_cli

SMALL = ["--dataset", "digits", "--model", "mlp", "--widths", "32", "--batch-size", "8", "--lr", "0.05",
         "--algo", "ssd", "--delay", "3", "--warmup-steps", "10", "--log-every", "5", "--steps", "60",
         "--checkpoint-every", "30", "--no-progress-bar"]


def jsonl(run_dir, kind):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def read_csv(path):
    text = path.read_text()
    rows = list(csv.reader(text.splitlines()))
    return rows[0], rows[1:]


def assert_csv_matches_jsonl(run_dir):
    """steps.csv and evals.csv hold the step and eval records of metrics.jsonl, cell for cell."""
    for kind, name in (("step", "steps.csv"), ("eval", "evals.csv")):
        records = jsonl(run_dir, kind)
        header, rows = read_csv(run_dir / name)
        assert header[:4] == ["step", "epoch", "stage", "time"] and "kind" not in header, header
        assert set(header) == {k for r in records for k in r} - {"kind"}, header
        assert header.count("step") == 1 and "step" not in [row[0] for row in rows], "a second header"
        assert len(rows) == len(records), (name, len(rows), len(records))
        for row, record in zip(rows, records):
            assert len(row) == len(header)
            for key, text in zip(header, row):
                want = record.get(key)
                if want is None:
                    assert text == "", (key, text)
                elif isinstance(want, str):
                    assert text == want
                else:
                    assert float(text) == want, (name, key, text, want)     # exact: floats round-trip


def test_csv_round_trips_metrics_jsonl_at_2_ranks(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(["train", "--run-dir", str(run_dir), "--csv", "--eval-every", "1", *SMALL], ranks=2, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(jsonl(run_dir, "step")) == 12 and jsonl(run_dir, "eval")
    assert_csv_matches_jsonl(run_dir)
    # the delay-stage eval fields appear in the header (test_acc_local only after the warm-up)
    assert "test_acc_local" in read_csv(run_dir / "evals.csv")[0]
    assert not (run_dir / "tensorboard").exists()


def test_csv_after_resume_has_one_header_no_duplicate_and_no_lost_row(tmp_path):
    """The first part runs without --csv and stops at step 30; a crashed attempt leaves records
    past the checkpoint; the resumed part (--csv) has every step once, from step 5 to 60."""
    run_dir = tmp_path / "run"
    r = run_cli(["train", "--run-dir", str(run_dir), "--stop-at-step", "30", *SMALL], ranks=2, timeout=300)
    assert r.returncode == 85, r.stderr[-3000:]
    assert not (run_dir / "steps.csv").exists()
    with open(run_dir / "metrics.jsonl", "a") as f:     # what a crash after the checkpoint leaves
        f.write(json.dumps({"kind": "step", "step": 35, "epoch": 0.1, "stage": "delay", "loss": 9.0}) + "\n")
    (run_dir / "steps.csv").write_text("step,loss\n35,9.0\n")
    r = run_cli(["train", "--run-dir", str(run_dir), "--resume", "auto", "--csv", *SMALL], ranks=2, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_csv_matches_jsonl(run_dir)
    header, rows = read_csv(run_dir / "steps.csv")
    assert [int(row[0]) for row in rows] == list(range(5, 61, 5))
    assert "9.0" not in [row[header.index("loss")] for row in rows]
    # and once more, resuming a finished run to train longer: appended, still one header
    r = run_cli(["train", "--run-dir", str(run_dir), "--resume", "auto", *SMALL[:-5], "--steps", "70",
                 "--checkpoint-every", "30", "--no-progress-bar"], ranks=2, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_csv_matches_jsonl(run_dir)
    assert [int(row[0]) for row in read_csv(run_dir / "steps.csv")[1]] == list(range(5, 71, 5))


def test_csv_header_widens_once_when_a_field_appears_later(tmp_path):
    log = loggers.CsvLog(str(tmp_path))
    log.write({"kind": "eval", "step": 10, "epoch": 0.5, "stage": "warmup", "test_acc": 0.5})
    log.write({"kind": "start", "step": 10})                 # not a table row
    log.write({"kind": "eval", "step": 20, "epoch": 1.0, "stage": "delay", "test_acc": 0.75,
               "test_acc_local": 0.7})
    log.write({"kind": "eval", "step": 30, "epoch": 1.5, "stage": "delay", "test_acc": 0.8,
               "test_acc_local": float("nan")})
    log.close()
    header, rows = read_csv(tmp_path / "evals.csv")
    assert header == ["step", "epoch", "stage", "test_acc", "test_acc_local"]
    assert rows == [["10", "0.5", "warmup", "0.5", ""], ["20", "1.0", "delay", "0.75", "0.7"],
                    ["30", "1.5", "delay", "0.8", ""]]
    assert not (tmp_path / "steps.csv").exists()


def test_csv_cells():
    x = 0.1 + 0.2
    assert float(loggers.cell(x)) == x and loggers.cell(None) == "" and loggers.cell(float("inf")) == ""
    assert loggers.cell(3) == "3" and loggers.cell("delay") == "delay" and loggers.cell(True) == "true"
    import numpy as np

    assert loggers.cell(np.float32(0.5)) == "0.5" and loggers.cell(np.float64("nan")) == ""


# ------------------------------------------------------------------------------ TensorBoard

def _event_accumulator():
    pytest.importorskip("tensorboardX", reason="tensorboardX not installed: pip install 'ssdmpi[tensorboard]'")
    module = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                 reason="tensorboard (its event reader) not installed: pip install tensorboard")
    return module.EventAccumulator


def test_tensorboard_event_files_are_read_back_by_tensorboard(tmp_path):
    """Written at 2 ranks (rank 0 alone writes), read by TensorBoard's own EventAccumulator: the
    scalars are metrics.jsonl's numbers at its steps. Then a crashed attempt's events past the
    checkpoint are hidden after the resume (the restart marker), and every step shows once."""
    import numpy as np

    EventAccumulator = _event_accumulator()
    run_dir = tmp_path / "run"
    r = run_cli(["train", "--run-dir", str(run_dir), "--tensorboard", "--eval-every", "1", "--stop-at-step", "30",
                 *SMALL], ranks=2, timeout=300)
    assert r.returncode == 85, r.stderr[-3000:]
    assert len(list((run_dir / "tensorboard").iterdir())) == 1 and not (run_dir / "steps.csv").exists()

    from tensorboardX import SummaryWriter

    time.sleep(1.1)     # event files are named by the second they were opened in
    crashed = SummaryWriter(logdir=str(run_dir / "tensorboard"), filename_suffix=".crashed")
    for step in (35, 40):
        crashed.add_scalar("train/loss", 999.0, global_step=step)
    crashed.close()
    time.sleep(1.1)
    r = run_cli(["train", "--run-dir", str(run_dir), "--resume", "auto", "--tensorboard", "--eval-every", "1",
                 *SMALL], ranks=2, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/samples_per_s", "eval/test_acc", "eval/test_loss"} <= set(tags), tags
    assert "config" in str(acc.Tags())          # the resolved configuration as text
    for tag, kind, key in (("train/loss", "step", "loss"), ("train/lr", "step", "lr"),
                           ("eval/test_acc", "eval", "test_acc")):
        records = [rec for rec in jsonl(run_dir, kind) if rec.get(key) is not None]
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [rec["step"] for rec in records], tag
        assert [e.value for e in events] == [float(np.float32(rec[key])) for rec in records], tag
    assert 999.0 not in [e.value for e in acc.Scalars("train/loss")]


def test_tensorboard_without_tensorboardX_is_a_one_line_error_before_anything_is_written(tmp_path):
    hidden = tmp_path / "hidden"
    (hidden / "tensorboardX").mkdir(parents=True)
    (hidden / "tensorboardX" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")])}
    run_dir = tmp_path / "run"
    r = run_cli(["train", "--run-dir", str(run_dir), "--tensorboard", *SMALL], ranks=2, timeout=120, env=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ssdmpi: error: --tensorboard needs tensorboardX"), lines
    assert "pip install 'ssdmpi[tensorboard]'" in lines[0] and "Traceback" not in r.stdout + r.stderr
    assert not run_dir.exists()


def test_check_available_names_the_pip_command(monkeypatch):
    class Cfg:
        tensorboard = True

    monkeypatch.setitem(sys.modules, "tensorboardX", None)      # import fails
    with pytest.raises(UserError, match=r"pip install 'ssdmpi\[tensorboard\]'"):
        loggers.check_available(Cfg())
    Cfg.tensorboard = False
    loggers.check_available(Cfg())


def test_scalars_take_the_finite_numbers_of_step_and_eval_records():
    assert loggers.scalars({"kind": "step", "step": 5, "stage": "delay", "loss": 0.5, "lr": 1, "x": math.nan,
                            "ok": True}) == {"train/loss": 0.5, "train/lr": 1.0}
    assert loggers.scalars({"kind": "eval", "step": 5, "test_acc": 0.9}) == {"eval/test_acc": 0.9}
    assert loggers.scalars({"kind": "checkpoint", "step": 5, "path": "x"}) == {}
