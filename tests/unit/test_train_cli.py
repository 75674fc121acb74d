"""``ssdmpi train``, ``eval`` and ``ckpt`` as a user runs them: real processes under mpiexec.

The in-process MPI tests (tests/mpi/test_resume.py, test_train.py) pin down exact
resume; these check what only a real command line shows: the README's first command,
the progress display, exit codes of every rank, one-line errors. A signal from outside (to one
rank, to the launcher) is tests/unit/test_launch_signals.py's, under MPICH and Open MPI alike.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from ssdmpi import checkpoint
from ssdmpi.checkpoint import format as format1
from ssdmpi.checkpoint import sharded
from tests.checkpoints import differences as field_differences
from tests.checkpoints import fields
from tests.conftest import assert_one_line_error, error_lines, mpiexec, run_cli

SMALL = ["--dataset", "digits", "--model", "mlp", "--widths", "32", "--batch-size", "8", "--lr", "0.05",
         "--algo", "ssd", "--delay", "3", "--warmup-steps", "10", "--eval-every", "0", "--no-progress-bar"]


@pytest.mark.timeout(400)
@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux 'script' to give mpiexec a terminal")
def test_readme_first_command_trains_the_default_dataset_to_96_percent(tmp_path):
    """``mpiexec -n 4 ssdmpi train``, no arguments, the launcher on a terminal (a pty): the ranks write to
    pipes, so no progress bar (a bar of unknown width wraps and scrolls); one line per evaluation, the
    summary, no line over 160 characters."""
    command = f"{shlex.quote(mpiexec())} -n 4 {shlex.quote(sys.executable)} -m ssdmpi train"
    env = dict(os.environ, COLUMNS="120")
    result = subprocess.run(["script", "-qec", command, "/dev/null"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=360)
    out = result.stdout
    assert result.returncode == 0, out[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()             # runs/<timestamp>-ssd under the current directory
    assert re.fullmatch(r"\d{8}-\d{6}-ssd", run_dir.name)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["dataset"] == "digits"
    assert summary["test_acc"] >= 0.96, summary
    # (How long it takes is BENCHMARKS.md's business: a wall-clock bound here flakes under load.)
    lines = out.replace("\r\n", "\n").splitlines()         # the terminal ends each line with \r\n
    assert "\r" not in "\n".join(lines) and not re.search(r"\d+%\|", out), "a progress bar on a pipe"
    assert not [line for line in lines if line.startswith("step ")], lines
    assert len([line for line in lines if line.startswith("eval ")]) == 20, lines      # one per epoch
    assert max(map(len, lines)) <= 160, max(lines, key=len)
    assert "test accuracy (global model W): final" in out and str(run_dir.name) in out
    assert {"config.yaml", "metrics.jsonl", "summary.txt", "summary.json", "checkpoints"} <= set(os.listdir(run_dir))


@pytest.mark.timeout(400)
def test_the_default_demo_with_ssgd_reaches_96_percent(tmp_path):
    """``mpiexec -n 4 ssdmpi train --algo ssgd``: the baseline of the default demo, on the digits split."""
    result = run_cli(["train", "--algo", "ssgd", "--run-dir", str(tmp_path / "run"), "--no-progress-bar"], ranks=4,
                     timeout=360)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["algo"] == "ssgd" and summary["world_size"] == 4 and summary["epoch"] == 20
    assert summary["test_acc"] >= 0.96, summary


def test_without_a_terminal_progress_is_plain_lines(tmp_path):
    result = run_cli(["train", "--run-dir", str(tmp_path / "run"), "--steps", "20", "--log-every", "10"] + SMALL,
                     ranks=2)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines() + result.stderr.splitlines()
    assert any(re.match(r"step +10/20  epoch 0\.\d+  stage ", line) for line in lines), lines
    assert "\r" not in result.stdout + result.stderr
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kinds = [m["kind"] for m in metrics]
    # the end: the final evaluation, then the final checkpoint, which records that evaluation
    assert kinds[0] == "start" and "step" in kinds and kinds[-2:] == ["eval", "checkpoint"]
    final_eval, final_ckpt = metrics[-2], metrics[-1]
    assert checkpoint.read_meta(final_ckpt["path"])["test_acc"] == final_eval["test_acc"]
    step = [m for m in metrics if m["kind"] == "step"][-1]
    for key in ("step", "epoch", "stage", "loss", "lr", "lr_local", "samples_per_s", "compute_s", "inflight_s",
                "wait_s", "bytes_sent", "time"):
        assert key in step, key
    assert step["bytes_sent"] > 0 and step["stage"] == "delay"


@pytest.mark.parametrize("args, needle", [
    (["--algo", "sgd"], "--algo 'sgd' is not one of"),
    (["--lr=-1"], "--lr must be > 0"),
    (["--config", "/nonexistent.yaml"], "cannot read config file /nonexistent.yaml"),
    (["--dataset", "imagenet"], "imagenet"),
    (["--model", "transformer"], "unknown model 'transformer'"),
    (["--algo", "ssgd", "--delay", "3"], "--delay does not apply to --algo ssgd"),
    (["--batch-size", "5000"], "fewer than one global batch"),
    (["--resume", "auto"], "--resume auto needs --run-dir"),
    (["--resume", "/nonexistent/ckpt.h5"], "does not exist"),
    (["--run-dir", "/etc/hostname/run"], "cannot use run directory /etc/hostname/run"),
    (["--run-dir", "/proc/ssdmpi-run"], "cannot use run directory /proc/ssdmpi-run"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    assert_one_line_error(run_cli(["train"] + args, ranks=2, timeout=120), needle)


def test_unknown_yaml_key_is_one_line_error(tmp_path):
    (tmp_path / "c.yaml").write_text("epochs: 3\nlearning-rate: 0.1\n")
    assert_one_line_error(run_cli(["train", "--config", str(tmp_path / "c.yaml")]), "unknown setting 'learning-rate'")


def test_a_fresh_run_refuses_an_existing_run_directory(tmp_path):
    run = str(tmp_path / "run")
    assert run_cli(["train", "--run-dir", run, "--steps", "5"] + SMALL).returncode == 0
    assert_one_line_error(run_cli(["train", "--run-dir", run, "--steps", "5"] + SMALL),
                          "already holds a run; continue it with --resume auto")


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """A 2-rank run of 40 steps with checkpoints at 10, 20, 30, 40 (kept)."""
    run = tmp_path_factory.mktemp("two") / "run"
    result = run_cli(["train", "--run-dir", str(run), "--steps", "40", "--checkpoint-every", "10",
                      "--keep-checkpoints", "0"] + SMALL, ranks=2)
    assert result.returncode == 0, result.stderr
    return run


def test_checkpoint_of_another_model_or_an_unsplittable_global_batch_is_refused(two_rank_run, tmp_path):
    ckpt = str(two_rank_run / "checkpoints" / "ckpt-00000020")
    assert_one_line_error(run_cli(["train", "--resume", ckpt, "--run-dir", str(tmp_path / "a")], ranks=3),
                          "global batch of 16 samples (2 x 8) cannot be split evenly over 3 ranks")
    assert_one_line_error(run_cli(["train", "--resume", ckpt, "--run-dir", str(tmp_path / "d"), "--batch-size",
                                   "4"], ranks=1), "the batch size per rank is 16; drop --batch-size 4")
    assert_one_line_error(run_cli(["train", "--resume", ckpt, "--run-dir", str(tmp_path / "b"), "--model",
                                   "wide-mlp"], ranks=2), "trained with model='mlp'")
    assert_one_line_error(run_cli(["train", "--resume", ckpt, "--run-dir", str(tmp_path / "c"), "--widths",
                                   "64"], ranks=2), "trained with widths=[32]")


def test_resume_refuses_a_moved_warmup_and_creates_nothing(two_rank_run, tmp_path):
    """Resumed at step 20 (delay stage since step 10) with the switch moved to step 30 the
    run would count local steps from m = -10; resumed at step 10 with it moved to 5, stay SSGD."""
    for name, flags, old, now in (("a", ["--warmup-steps", "30"], "--warmup-steps 10", "--warmup-steps 30"),
                                  ("b", ["--warmup-steps", "5"], "--warmup-steps 10", "--warmup-steps 5"),
                                  ("c", ["--warmup-epochs", "1"], "--warmup-steps 10", "--warmup-epochs 1.0")):
        ckpt = str(two_rank_run / "checkpoints" / f"ckpt-000000{'10' if name == 'b' else '20'}")
        run_dir = tmp_path / name
        assert_one_line_error(run_cli(["train", "--resume", ckpt, "--run-dir", str(run_dir)] + flags, ranks=2),
                              f"trained with {old} but this run asks for {now}: a resumed run cannot move the switch")
        assert not run_dir.exists()


def test_train_longer_under_a_cosine_schedule_is_refused(tmp_path):
    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run)] + SMALL + ["--lr-schedule", "cosine"]
    assert run_cli(args + ["--steps", "20"]).returncode == 0
    before = sorted(os.listdir(run / "checkpoints"))
    assert_one_line_error(run_cli(args + ["--resume", "auto", "--steps", "40"]),
                          "--lr-schedule cosine spreads its decay over the whole run: the checkpoint was trained for "
                          "--steps 20, and resuming it for --steps 40")
    assert sorted(os.listdir(run / "checkpoints")) == before


def flip_byte_in(path: Path, dataset: str, at: int = 11):
    """Flip one bit of ``dataset``'s data in the HDF5 file ``path``."""
    with h5py.File(path, "r") as f:
        offset = f[dataset].id.get_offset()
    with open(path, "r+b") as f:
        f.seek(offset + at)
        b = f.read(1)
        f.seek(offset + at)
        f.write(bytes([b[0] ^ 0x80]))


def test_resume_auto_skips_truncated_and_flipped_checkpoints(two_rank_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_rank_run, run)
    with open(run / "checkpoints" / "ckpt-00000040" / "rank-0000.h5", "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 3)
    flip_byte_in(run / "checkpoints" / "ckpt-00000030" / "rank-0001.h5", "state/algo/L")
    verify = run_cli(["ckpt", "verify", str(run)])
    assert verify.returncode == 2
    assert verify.stdout.count(": ok") == 2 and verify.stdout.count("CORRUPT") == 2
    assert "ckpt-00000030: CORRUPT: rank-0001.h5: dataset /state/algo/L checksum mismatch" in verify.stdout

    result = run_cli(["train", "--run-dir", str(run), "--resume", "auto", "--steps", "50"] + SMALL, ranks=2)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: skipping corrupt")]
    assert len(warnings) == 2 and "ckpt-00000040" in warnings[0] and "ckpt-00000030" in warnings[1]
    assert "checksum mismatch" in warnings[1]
    assert "resumed from" in result.stdout and "ckpt-00000020 at step 20" in result.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 50


def test_ckpt_inspect_and_eval(two_rank_run):
    ckpt = str(two_rank_run / "checkpoints" / "ckpt-00000040")
    inspect = run_cli(["ckpt", "inspect", ckpt])
    assert inspect.returncode == 0
    lines = inspect.stdout.splitlines()
    assert lines[0] == f"checkpoint {ckpt}  (best, last)" and lines[-1] == "  checksums: ok", lines
    assert "step 40, epoch 0.45, stage delay" in inspect.stdout and ", 2 ranks, batch 8 per rank" in inspect.stdout
    assert re.search(r"test accuracy of its global model W: \d+\.\d\d%", inspect.stdout), inspect.stdout
    assert "algo/L" not in inspect.stdout and len(lines) <= 10          # a summary, not every array
    arrays = run_cli(["ckpt", "inspect", "--arrays", ckpt]).stdout
    assert "  rank 1 (rank-0001.h5):" in arrays and "    algo/L  float32 (2410,)" in arrays
    assert "    algo/W  <f4 (2410,)" in arrays                               # shared, listed once
    meta = json.loads(run_cli(["ckpt", "inspect", "--json", str(two_rank_run)]).stdout)
    assert meta["step"] == 40 and meta["config"]["widths"] == [32] and meta["problems"] == []
    listing = run_cli(["ckpt", "list", str(two_rank_run)]).stdout.splitlines()
    assert listing[0].split() == ["step", "checkpoint", "size", "status"]
    assert [line.split()[0] for line in listing[1:]] == ["10", "20", "30", "40"]
    assert listing[-1].endswith("(best, last)")

    serial = json.loads(run_cli(["eval", "--checkpoint", ckpt, "--json"]).stdout)
    sharded = run_cli(["eval", "--checkpoint", ckpt, "--json"], ranks=2)
    assert sharded.returncode == 0, sharded.stderr
    sharded = json.loads(sharded.stdout)      # rank 0 alone prints
    assert serial["samples"] == sharded["samples"] == 360
    assert serial["test_acc"] == sharded["test_acc"]
    assert sharded["test_loss"] == pytest.approx(serial["test_loss"], rel=1e-6)
    # the same number the trainer logged for its final evaluation
    final = json.loads((two_rank_run / "summary.json").read_text())
    assert final["test_acc"] == serial["test_acc"]
    assert_one_line_error(run_cli(["eval", "--checkpoint", "/nonexistent.h5"]), "does not exist")


def test_divergence_is_one_line_with_exit_3(two_rank_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_rank_run, run)
    result = run_cli(["train", "--run-dir", str(run), "--resume", "auto", "--lr", "1e30", "--steps", "80"], ranks=2)
    assert result.returncode == 3
    lines = error_lines(result)
    assert len(lines) == 1 and "training diverged" in lines[0] and "ckpt-00000040" in lines[0], lines


def test_config_yaml_of_a_run_reproduces_it_bitwise(two_rank_run, tmp_path):
    again = tmp_path / "again"
    result = run_cli(["train", "--config", str(two_rank_run / "config.yaml"), "--run-dir", str(again)], ranks=2)
    assert result.returncode == 0, result.stderr
    name = "checkpoints/ckpt-00000040"
    assert field_differences(fields(str(two_rank_run / name)), fields(str(again / name))) == []


def as_format_1(ckpt: Path, dest: Path) -> Path:
    """``ckpt`` (a directory) written as a format-1 file, as ssdmpi wrote them before: every rank's
    whole tree (the shared arrays in it), the global model and rank 0's buffers at the top."""
    meta = checkpoint.read_meta(str(ckpt))
    shared = {name: sharded.read_shared(str(ckpt), meta, name) for name in meta["shared"]}
    states = []
    for rank in range(meta["world_size"]):
        state = sharded.read_rank_state(str(ckpt), rank)
        state["algo"].update({name.split("/", 1)[1]: a for name, a in shared.items() if name.startswith("algo/")})
        states.append((rank, state))
    top = {"model": {"global_weights": sharded.read_shared(str(ckpt), meta, "model/global_weights"),
                     "buffers": states[0][1]["model"]["buffers"]}}
    fields_ = {k: v for k, v in meta.items() if k not in ("files", "shared", "aliases", "write", "eval", "format",
                                                       "format_version")}
    path = dest / f"ckpt-{meta['step']:08d}.h5"
    format1.write_checkpoint(str(path), fields_, states, top)
    return path


def test_format_1_checkpoints_resume_and_convert(two_rank_run, tmp_path):
    old = as_format_1(two_rank_run / "checkpoints" / "ckpt-00000020", tmp_path)
    assert checkpoint.verify(str(old)) == [] and checkpoint.read_meta(str(old))["format_version"] == 1
    runs = {}
    for name, source in (("from-directory", two_rank_run / "checkpoints" / "ckpt-00000020"), ("from-file", old)):
        result = run_cli(["train", "--resume", str(source), "--run-dir", str(tmp_path / name), "--steps", "40"]
                         + SMALL, ranks=2)
        assert result.returncode == 0, result.stderr
        runs[name] = fields(str(tmp_path / name / "checkpoints" / "ckpt-00000040"))
    assert field_differences(runs["from-directory"], runs["from-file"]) == []      # bit for bit

    assert_one_line_error(run_cli(["train", "--resume", str(old), "--run-dir", str(tmp_path / "one")], ranks=1),
                          "written by 2 ranks in format 1, which resumes only on as many; resume with mpiexec -n 2")
    converted = run_cli(["ckpt", "convert", str(old)])
    assert converted.returncode == 0 and converted.stdout.strip() == f"{old} -> {tmp_path / 'ckpt-00000020'}"
    assert checkpoint.verify(str(tmp_path / "ckpt-00000020")) == []
    assert field_differences(fields(str(tmp_path / "ckpt-00000020")),
                             fields(str(two_rank_run / "checkpoints" / "ckpt-00000020"))) == []
    assert_one_line_error(run_cli(["ckpt", "convert", str(old)]), "exists already")
    resumed = run_cli(["train", "--resume", str(tmp_path / "ckpt-00000020"), "--run-dir", str(tmp_path / "one"),
                       "--steps", "30"] + SMALL, ranks=1)
    assert resumed.returncode == 0 and "resumed on another number of ranks (2 -> 1)" in resumed.stdout, resumed.stderr
