"""A run's life as a user sees it from the shell: default run directories that never collide,
the line printed after a preemption that continues the run when pasted as written, and
``--resume auto`` on a run that is already complete."""

import json
import re
import subprocess
import sys

import pytest

from ssdmpi.relaunch import launcher, resume_command
from ssdmpi.run.directory import claim_run_dir
from tests.conftest import mpiexec, run_cli
from tests.unit.test_train_cli import SMALL


def test_a_taken_default_name_gets_the_next_free_suffix(tmp_path):
    base = str(tmp_path / "new" / "runs" / "20260101-000000-ssd")
    made = [claim_run_dir(base) for _ in range(3)]
    assert [path for path, _ in made] == [base, f"{base}-2", f"{base}-3"]
    assert made[0][1] == [base, str(tmp_path / "new" / "runs"), str(tmp_path / "new")]   # for remove_created
    assert made[1][1] == [f"{base}-2"]


MPIEXEC = "mpiexec"
LAUNCHERS = [
    ({}, 1, []),                                                                     # one process by hand
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, 2, [MPIEXEC, "-n", "2"]),   # MPICH's Hydra
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}, 4, [MPIEXEC, "-n", "4"]),   # Open MPI
    ({"PMI_RANK": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "1"}, 4,
     ["srun", "-n", "4"]),                                                           # srun, one task per rank
    ({"PMI_RANK": "0", "MPI_LOCALNRANKS": "4", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}, 4,
     [MPIEXEC, "-n", "4"]),                                                          # Hydra inside an allocation
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "batch", "SLURM_STEP_NUM_TASKS": "1"}, 1, []),   # a batch script
]


@pytest.mark.parametrize("environ,size,expected", LAUNCHERS)
def test_the_launcher_is_read_from_the_environment(environ, size, expected):
    got = launcher(size, environ)
    assert [("mpiexec" if word.endswith("/mpiexec") else word) for word in got] == expected


def test_a_script_calling_the_python_api_is_told_what_to_pass(tmp_path):
    line = resume_command("runs/mine", 2, {"epochs": 20}, command=False,
                          environ={"PMI_RANK": "0", "MPI_LOCALNRANKS": "2"}, argv0="train_mine.py")
    assert re.fullmatch(r"\S*mpiexec -n 2 \S*python\S* train_mine.py, with \{'run_dir': 'runs/mine', "
                        r"'resume': 'auto', 'epochs': 20\} in the config it gives ssdmpi.train", line), line


@pytest.mark.timeout(400)
def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path):
    """``for s in 0 1 2; do mpiexec -n 2 ssdmpi train --seed $s & done; wait``: three runs."""
    procs = [subprocess.Popen([mpiexec(), "-n", "2", sys.executable, "-m", "ssdmpi", "train", "--seed", str(seed),
                               "--steps", "12"] + SMALL, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in (0, 1, 2)]
    results = [proc.communicate(timeout=360) + (proc.returncode,) for proc in procs]
    assert [code for _, _, code in results] == [0, 0, 0], results
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 3, runs
    assert all(re.fullmatch(r"\d{8}-\d{6}-ssd(-\d+)?", run.name) for run in runs), runs
    seeds = sorted(json.loads((run / "summary.json").read_text())["config"]["seed"] for run in runs)
    assert seeds == [0, 1, 2]
    for run in runs:
        assert [json.loads(line)["kind"] for line in (run / "metrics.jsonl").read_text().splitlines()].count(
            "start") == 1, run


@pytest.mark.timeout(400)
def test_the_line_printed_after_a_preemption_continues_the_run_as_written(tmp_path):
    run = tmp_path / "run"
    stopped = run_cli(["train", "--run-dir", "run", "--steps", "30", "--stop-at-step", "12"] + SMALL, ranks=2,
                      cwd=tmp_path, timeout=240)
    assert stopped.returncode == 85, stopped.stderr
    (hint,) = re.findall(r"Continue with: (.*) \(exit code 85\)", stopped.stdout)
    assert re.match(r"\S*mpiexec -n 2 ", hint) and hint.endswith(" train --run-dir run --resume auto"), hint
    resumed = subprocess.run(hint, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 30 and summary["world_size"] == 2


@pytest.mark.timeout(400)
def test_resume_auto_on_a_complete_run_says_so_adds_nothing_and_tells_how_to_train_longer(tmp_path):
    run = tmp_path / "run"
    first = run_cli(["train", "--run-dir", "run", "--epochs", "1"] + SMALL, ranks=2, cwd=tmp_path, timeout=240)
    assert first.returncode == 0, first.stderr
    before = {path.relative_to(run): (path.stat().st_mtime_ns, path.read_bytes())
              for path in run.rglob("*") if path.is_file()}
    again = run_cli(["train", "--run-dir", "run", "--resume", "auto"], ranks=2, cwd=tmp_path, timeout=240)
    assert again.returncode == 0, again.stderr
    lines = [line for line in again.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ssdmpi train: run run is complete (step "), again.stdout
    assert "samples/s" not in again.stdout and again.stderr.strip() == ""
    after = {path.relative_to(run): (path.stat().st_mtime_ns, path.read_bytes())
             for path in run.rglob("*") if path.is_file()}
    assert after == before              # no record appended, no checkpoint, no config.yaml rewritten
    # "To train longer, give a larger --epochs: <command>": that command, as written, trains epoch 2.
    (longer,) = re.findall(r"give a larger --epochs: (.*)$", lines[0])
    assert longer.endswith(" train --run-dir run --resume auto --epochs 2"), longer
    trained = subprocess.run(longer, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epoch"] == 2.0 and summary["config"]["epochs"] == 2


@pytest.mark.timeout(400)
def test_a_run_stopped_at_its_last_step_is_finished_by_resume_auto(tmp_path):
    """Checkpointed by a signal (here --stop-at-step) at the very last step, the run has not
    finished: no final evaluation, no summary. ``--resume auto`` does those; it is not "complete"."""
    run = tmp_path / "run"
    stopped = run_cli(["train", "--run-dir", "run", "--steps", "12", "--stop-at-step", "12"] + SMALL, ranks=2,
                      cwd=tmp_path, timeout=240)
    assert stopped.returncode == 85 and not (run / "summary.json").exists(), stopped.stderr
    resumed = run_cli(["train", "--run-dir", "run", "--resume", "auto"], ranks=2, cwd=tmp_path, timeout=240)
    assert resumed.returncode == 0 and "is complete" not in resumed.stdout, resumed.stdout + resumed.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 12 and summary["test_acc"] is not None
