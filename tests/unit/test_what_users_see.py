"""Small things a user reads: "on 1 rank" (not "1 ranks"); a default run's quiet display (the
opening lines, one line per evaluation, the summary; no line over 160 characters); step lines
only with ``--log-every``, naming no accuracy; the summary's best evaluation across a resume and
its time split into training and evaluation; ssgd's stage called ``sync``; and ``ssdmpi info`` not
calling the tests' oracle (PyTorch) a missing dependency."""

import json
import re
import subprocess
import sys

from ssdmpi.metrics import counted
from tests.conftest import run_cli
from tests.unit.test_train_cli import SMALL

# SMALL without its --no-progress-bar (which asks for step lines), --eval-every 0 and batch size.
QUIET = [a for a in SMALL if a not in ("--no-progress-bar", "--eval-every", "0", "--batch-size", "8")]
LINE_LIMIT = 160


def records(run_dir, kind: str) -> list:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_counts_are_singular_for_one():
    assert [counted(n, "rank") for n in (0, 1, 2)] == ["0 ranks", "1 rank", "2 ranks"]


def test_a_default_run_prints_one_line_per_evaluation_and_no_long_line(tmp_path):
    """No --log-every: the opening lines, an evaluation line per epoch, the summary; stdout is a pipe,
    so no bar and no carriage return."""
    result = run_cli(["train", "--run-dir", "run", "--epochs", "3", "--batch-size", "32"] + QUIET,
                     cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "1 ranks" not in result.stdout, result.stdout
    assert re.search(r"^ssdmpi train: ssd \(.*\) on 1 rank, model mlp", result.stdout, re.M), result.stdout
    assert re.search(r"^ssdmpi train: done - ssd on 1 rank, model mlp", result.stdout, re.M), result.stdout
    assert not [line for line in lines if line.startswith("step ")], lines
    evals = [line for line in lines if line.startswith("eval ")]
    assert len(evals) == 3 and all(re.search(r"test acc \d+\.\d\d%", line) for line in evals), evals
    assert "\r" not in result.stdout + result.stderr
    assert max(map(len, lines)) <= LINE_LIMIT, max(lines, key=len)
    assert len(lines) <= 20, lines


def test_step_lines_come_with_log_every_and_name_no_accuracy(tmp_path):
    result = run_cli(["train", "--run-dir", "run", "--epochs", "2", "--batch-size", "8", "--log-every", "30"] + QUIET,
                     cwd=tmp_path,
                     timeout=240)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) >= 4 and all(re.match(r"step +\d+/\d+  epoch ", line) for line in steps), steps
    assert not any("acc" in line for line in steps), steps             # the evaluation lines carry it
    assert [line for line in lines if line.startswith("eval ")]


def test_the_summary_names_the_best_evaluation_across_a_resume_and_splits_the_time(tmp_path):
    """Four epochs (44 steps each), stopped in the third and resumed: the best of both parts'
    evaluations (the highest test accuracy, the later on a tie), read here from metrics.jsonl."""
    args = ["train", "--run-dir", "run", "--epochs", "4", "--batch-size", "32"] + QUIET
    first = run_cli(args + ["--stop-at-step", "100"], cwd=tmp_path, timeout=240)
    assert first.returncode == 85, first.stderr
    second = run_cli(["train", "--run-dir", "run", "--resume", "auto"], cwd=tmp_path, timeout=240)
    assert second.returncode == 0, second.stderr
    run = tmp_path / "run"
    evals = records(run, "eval")
    assert [r["step"] for r in evals] == [44, 88, 132, 176]
    top = max(r["test_acc"] for r in evals)
    best_step = max(r["step"] for r in evals if r["test_acc"] == top)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best"] == {"metric": "test_acc", "value": top, "step": best_step}, summary["best"]
    assert f"best {100 * top:.2f}% at step {best_step}" in second.stdout
    assert summary["eval_s"] == sum(r["eval_s"] for r in evals) and summary["eval_s"] > 0
    assert 0 < summary["train_s"] < summary["wall_s"] and summary["train_s"] + summary["eval_s"] <= summary["wall_s"]
    assert re.search(r"in \d+\.\d s: training \d+\.\d s, evaluation \d+\.\d s, checkpoints and other", second.stdout)
    assert re.search(r"samples/s \(training only, all ranks\): \d+", second.stdout)


def test_ssgd_is_in_the_sync_stage_not_a_warm_up(tmp_path):
    result = run_cli(["train", "--run-dir", "run", "--steps", "20", "--log-every", "10", "--algo", "ssgd",
                      "--dataset", "digits", "--model", "mlp", "--widths", "32", "--batch-size", "8"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "run"
    stages = {r["stage"] for kind in ("step", "eval") for r in records(run, kind)}
    assert stages == {"sync"}, stages
    assert json.loads((run / "summary.json").read_text())["stage"] == "sync"
    assert all("stage sync" in line for line in result.stdout.splitlines() if line.startswith("step "))


def test_info_does_not_call_the_test_oracle_missing():
    """With PyTorch absent (its version made unknown), it is not among the missing dependencies."""
    code = ("import sys; import ssdmpi.info as info; real = info.version\n"
            "info.version = lambda names, module=None: None if 'torch' in names else real(names, module)\n"
            "from ssdmpi.cli import main; sys.exit(main(['info', '--device', 'cpu']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    (missing,) = [line for line in lines if line.startswith("missing: ")]
    (oracle,) = [line for line in lines if line.startswith("test oracle")]
    assert "torch" not in missing and missing == "missing: none", missing
    assert oracle == "test oracle (tests and ssdmpi bench engine only): torch not installed", oracle
