"""The job templates in jobs/ on a real (private, single-node) Slurm cluster.

- ``jobs/train.sbatch`` with 2 tasks completes and leaves a run directory with metrics,
  a summary and a final checkpoint;
- preemption: the same job, signalled mid-training with ``scancel --signal=USR1 --batch``
  (what ``--signal=B:USR1@LEAD`` does at the time limit), checkpoints, exits 85, requeues
  itself, resumes and finishes with final weights bitwise identical to the
  uninterrupted job's;
- the real time-limit path: Slurm's own ``--signal=B:USR1@45`` on a 1-minute job
  requeues and resumes it; a plain ``scancel`` (SIGTERM) checkpoints but does not requeue;
- ``jobs/sweep.sbatch`` runs a 2-task array with different delays k into separate run
  directories, through the templates' other launcher (MPICH's ``mpiexec``), with one of
  the tasks preempted and requeued on its own;
- the jobs' own arguments (``sbatch jobs/train.sbatch --epochs 3``) reach ``ssdmpi train``;
  ``MAX_RESTARTS`` ends a job that would requeue once more; a sweep array whose size does not
  match its values fails every task with the reason;
- ``jobs/bench.sbatch`` leaves ``bench train``'s tables in its run directory.

Every job runs with small settings passed through the templates' own variables
(``SSDMPI_ARGS``), exactly as a user would.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.slurm.conftest import JOBS, ROOT

h5py = pytest.importorskip("h5py")
from tests.checkpoints import fields  # noqa: E402 (needs h5py)

# Small settings for every job. The signal, sent once step 20 is logged, reaches the ranks
# 0.1-0.3 s later (the poll, scancel, slurmstepd, the batch shell's trap, the launcher): the
# 768-wide hidden layers make a step take ~2.5 ms on an idle machine, so that 1000 steps keep
# it well inside the run. (With the default 128-wide layer a step took 0.1 ms and the run could
# end first: the signal then hit a finished run.) Batch 4 makes epochs long (180 steps), so few
# of the always-written epoch checkpoints.
STEPS = 1000
TRAIN_ARGS = (f"--dataset digits --model mlp --widths 768,768 --steps {STEPS} --batch-size 4 --algo ssd --delay 3 "
              "--comm period "
              "--warmup-steps 20 --checkpoint-every 200 --keep-checkpoints 0 --eval-every 0 --log-every 5 "
              "--seed 3 --no-progress-bar")
JOB_TIMEOUT = 420


def _trainer_missing() -> str | None:
    """Why ``ssdmpi train`` cannot run these jobs (None: it is the real trainer).

    Only the placeholder trainer (no ``--run-dir``) skips; a real trainer that lacks a flag
    these jobs use makes them fail, loudly, like any user's job would."""
    r = subprocess.run([sys.executable, "-m", "ssdmpi", "train", "--help"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    if r.returncode != 0:
        return None        # let the jobs fail and show why
    if "--run-dir" not in r.stdout:
        return "ssdmpi train is still the placeholder (no --run-dir/--resume): the trainer has not landed"
    return None


@pytest.fixture(scope="module")
def trainer():
    reason = _trainer_missing()
    if reason:
        pytest.skip(reason)


def records(run_dir: Path, kind: str) -> list[dict]:
    """The ``kind`` records of a run's metrics.jsonl (``[]`` while it does not exist)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:   # a line being written right now
            continue
        if rec.get("kind") == kind:
            out.append(rec)
    return out


def checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints of a run (complete: their manifest is there), oldest step first."""
    return sorted(p.parent for p in (run_dir / "checkpoints").glob("ckpt-*/manifest.json"))


def final_state(run_dir: Path) -> dict:
    """The newest checkpoint's step, global model W (finalized, in a final checkpoint) and every rank's
    local model L."""
    saved = fields(str(checkpoints(run_dir)[-1]))
    state = {"step": saved["meta/step"], "world_size": saved["meta/world_size"],   # W: the model evaluated
             "W": saved.get("shared/model/global_weights", saved["shared/algo/W"])}
    for r in range(state["world_size"]):
        state[f"rank{r}"] = saved[f"rank_{r:04d}/algo/L"]
    return state


def submit_train(cluster, cwd: Path, **env) -> tuple[int, Path, Path]:
    """Submit jobs/train.sbatch from ``cwd``; return (job id, its run directory, its output file)."""
    job = cluster.sbatch(JOBS / "train.sbatch", cwd=cwd, env={"SSDMPI_ARGS": TRAIN_ARGS, **env})
    return job, cwd / "runs" / f"ssdmpi-train-{job}", cwd / f"ssdmpi-train-{job}.out"


def signal_mid_training(cluster, job, run_dir: Path, out: Path, after_step: int = 20) -> None:
    """Once the job's run has logged ``after_step``, send SIGUSR1 to its batch shell, as
    ``--signal=B:USR1@LEAD`` does at the time limit (``job``: an id or ``ARRAYID_TASK``)."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while not [r for r in records(run_dir, "step") if r["step"] >= after_step]:
        if time.monotonic() > deadline or cluster.finished(job):
            pytest.fail(f"job {job} never logged step {after_step}\n{cluster.explain(job, [out])}")
        time.sleep(0.05)
    cluster.run(["scancel", "--signal=USR1", "--batch", str(job)])


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster, trainer, tmp_path_factory):
    """One train.sbatch job that runs to the end: (job record, run directory, output file)."""
    cwd = tmp_path_factory.mktemp("train")
    job, run_dir, out = submit_train(slurm_cluster, cwd)
    (record,) = slurm_cluster.wait_done(job, JOB_TIMEOUT, [out])
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", slurm_cluster.explain(job, [out])
    return record, run_dir, out


def test_train_job_completes_with_metrics_and_final_checkpoint(uninterrupted):
    record, run_dir, out = uninterrupted
    assert record["NumTasks"] == "2" and record["Restarts"] == "0"
    steps = records(run_dir, "step")
    assert steps and steps[-1]["step"] == STEPS, f"metrics.jsonl ends at {steps[-1:]} not step {STEPS}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["step"] == STEPS
    state = final_state(run_dir)
    assert state["step"] == STEPS and state["world_size"] == 2
    assert np.isfinite(state["W"]).all()
    assert "ssdmpi train exited with 0" in out.read_text()


def test_train_job_runs_with_its_defaults(slurm_cluster, trainer, tmp_path):
    """``sbatch jobs/train.sbatch`` with nothing set: the template's own defaults work."""
    job = slurm_cluster.sbatch(JOBS / "train.sbatch", cwd=tmp_path)
    run_dir, out = tmp_path / "runs" / f"ssdmpi-train-{job}", tmp_path / f"ssdmpi-train-{job}.out"
    (record,) = slurm_cluster.wait_done(job, JOB_TIMEOUT, [out])
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", slurm_cluster.explain(job, [out])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "done" and summary["world_size"] == 2
    assert final_state(run_dir)["step"] == summary["step"]


def test_train_job_passes_its_arguments_to_ssdmpi_train(slurm_cluster, trainer, tmp_path):
    """``sbatch jobs/train.sbatch --epochs 3 --seed 5``: the template's defaults, and the job's
    own arguments on top (issue 13.10: they used to be dropped); it trains exactly 3 epochs."""
    job = slurm_cluster.sbatch(JOBS / "train.sbatch", cwd=tmp_path,
                               script_args=("--epochs", "3", "--seed", "5", "--no-progress-bar"))
    run_dir, out = tmp_path / "runs" / f"ssdmpi-train-{job}", tmp_path / f"ssdmpi-train-{job}.out"
    (record,) = slurm_cluster.wait_done(job, JOB_TIMEOUT, [out])
    why = slurm_cluster.explain(job, [out])
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", why
    (start,) = records(run_dir, "start")
    assert start["config"]["epochs"] == 3 and start["config"]["seed"] == 5, start["config"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epoch"] == 3.0 and summary["step"] == 3 * start["steps_per_epoch"], summary
    assert final_state(run_dir)["step"] == summary["step"]


def test_restart_cap_ends_the_job_instead_of_requeueing(slurm_cluster, trainer, tmp_path):
    """MAX_RESTARTS=1: the first signal requeues the job, the second (SLURM_RESTART_COUNT=1)
    checkpoints and ends it with 85 and a line saying why."""
    args = (TRAIN_ARGS.replace(f"--steps {STEPS}", "--steps 1000000").replace("--log-every 5", "--log-every 20")
            .replace("--keep-checkpoints 0", "--keep-checkpoints 2"))
    job, run_dir, out = submit_train(slurm_cluster, tmp_path, SSDMPI_ARGS=args, MAX_RESTARTS="1")
    signal_mid_training(slurm_cluster, job, run_dir, out)
    deadline = time.monotonic() + JOB_TIMEOUT
    while not (len(starts := records(run_dir, "start")) == 2 and
               [r for r in records(run_dir, "step") if r["step"] > starts[1]["step"]]):
        if time.monotonic() > deadline or slurm_cluster.finished(job):
            pytest.fail(f"job {job} was not requeued and resumed\n{slurm_cluster.explain(job, [out])}")
        time.sleep(0.5)
    slurm_cluster.run(["scancel", "--signal=USR1", "--batch", str(job)])
    (record,) = slurm_cluster.wait_done(job, JOB_TIMEOUT, [out])
    text, why = out.read_text(), slurm_cluster.explain(job, [out])
    assert record["JobState"] == "FAILED" and record["ExitCode"] == "85:0" and record["Restarts"] == "1", why
    assert text.count("ssdmpi train exited with 85") == 2 and text.count("checkpointed: requeueing job") == 1, why
    assert f"not requeueing job {job}: it has been restarted 1 times (MAX_RESTARTS=1)" in text, why
    assert [s["exit_code"] for s in records(run_dir, "stop")] == [85, 85], why


@pytest.mark.parametrize("array, why", [("0-2", "too many array tasks"), ("0", "too few array tasks")])
def test_sweep_array_of_the_wrong_size_fails_every_task_saying_why(slurm_cluster, tmp_path, array, why):
    job = slurm_cluster.sbatch(JOBS / "sweep.sbatch", f"--array={array}", cwd=tmp_path,
                               env={"SWEEP_VALUES": "1 3"})
    tasks = slurm_cluster.wait_done(job, JOB_TIMEOUT, sorted(tmp_path.glob("*.out")))
    outs = sorted(tmp_path.glob(f"ssdmpi-sweep-{job}_*.out"))
    explain = slurm_cluster.explain(job, outs)
    assert len(tasks) == len(outs) == (3 if array == "0-2" else 1), explain
    assert all(t["JobState"] == "FAILED" and t["ExitCode"] == "2:0" for t in tasks), explain
    for out in outs:
        assert f"error: {why}" in out.read_text() and "submit with --array=0-1" in out.read_text(), explain
    assert not (tmp_path / "runs").exists(), explain


def test_preempted_job_checkpoints_requeues_and_matches_uninterrupted_run(slurm_cluster, uninterrupted,
                                                                         tmp_path):
    cwd = tmp_path
    job, run_dir, out = submit_train(slurm_cluster, cwd)
    signal_mid_training(slurm_cluster, job, run_dir, out)
    (record,) = slurm_cluster.wait_done(job, JOB_TIMEOUT, [out])
    text = out.read_text()
    why = slurm_cluster.explain(job, [out])

    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", why
    assert record["Restarts"] == "1", f"the signal did not lead to exactly one requeue\n{why}"
    # The story in the job's output (appended across both runs: --open-mode=append).
    for line in ("got SIGUSR1", "ssdmpi train exited with 85", f"requeueing job {job}",
                 f"job {job} (restart 1)", "ssdmpi train exited with 0"):
        assert line in text, f"{line!r} missing from the job output\n{why}"
    # The first run stopped mid-training at a checkpoint; the second started from it.
    starts = records(run_dir, "start")
    assert len(starts) == 2, why
    stopped = [c for c in records(run_dir, "checkpoint") if c["step"] < STEPS and "signal" in str(c.get("reason"))]
    assert stopped, f"no checkpoint taken on the signal before step {STEPS}\n{why}"
    assert any(re.search(rf"ckpt-0*{stopped[0]['step']}$", str(p)) for p in checkpoints(run_dir))

    # Bitwise the same final state as the run that was never interrupted.
    got, want = final_state(run_dir), final_state(uninterrupted[1])
    assert got["step"] == want["step"] == STEPS
    for key in ("W", "rank0", "rank1"):
        assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), \
            f"{key} differs after preemption + resume (max |diff| {np.abs(got[key] - want[key]).max()})"


def test_time_limit_signal_requeues_and_a_cancel_stays_cancelled(slurm_cluster, trainer, tmp_path):
    """The real lead-time path: a run far longer than its 1-minute limit gets Slurm's own
    ``--signal=B:USR1@45``, checkpoints, requeues and resumes; a plain ``scancel`` (SIGTERM)
    then still checkpoints, but ends the job for good instead of requeueing it."""
    args = (TRAIN_ARGS.replace(f"--steps {STEPS}", "--steps 1000000").replace("--log-every 5", "--log-every 20")
            .replace("--keep-checkpoints 0", "--keep-checkpoints 2"))
    job = slurm_cluster.sbatch(JOBS / "train.sbatch", "--time=1", "--signal=B:USR1@45", cwd=tmp_path,
                               env={"SSDMPI_ARGS": args})
    run_dir, out = tmp_path / "runs" / f"ssdmpi-train-{job}", tmp_path / f"ssdmpi-train-{job}.out"
    # Slurm checks time limits about every 30 s: the signal comes 15-45 s into the job.
    deadline = time.monotonic() + 240
    while not (len(starts := records(run_dir, "start")) == 2 and
               [r for r in records(run_dir, "step") if r["step"] > starts[1]["step"]]):
        if time.monotonic() > deadline or slurm_cluster.finished(job):
            pytest.fail(f"job {job} was not requeued and resumed\n{slurm_cluster.explain(job, [out])}")
        time.sleep(0.5)
    slurm_cluster.run(["scancel", str(job)])
    (record,) = slurm_cluster.wait_done(job, 120, [out])
    text, why = out.read_text(), slurm_cluster.explain(job, [out])

    assert record["JobState"] == "CANCELLED" and record["Restarts"] == "1", why
    assert "got SIGUSR1" in text and "got SIGTERM" in text, why
    assert text.count("ssdmpi train exited with 85") == 2, why     # checkpointed both times ...
    assert text.count("requeueing job") == 1, why                   # ... but requeued only on USR1
    first, second = records(run_dir, "start")
    assert first["resumed_from"] is None and second["resumed_from"], why
    stops = records(run_dir, "stop")
    assert [s["exit_code"] for s in stops] == [85, 85], why
    assert second["step"] == stops[0]["step"] < stops[1]["step"], why   # resumed where it stopped
    saved = {Path(c["path"]).name for c in records(run_dir, "checkpoint") if c["reason"] == "signal"}
    assert {f"ckpt-{s['step']:08d}" for s in stops} <= saved, why


def test_sweep_array_runs_each_delay_in_its_own_run_directory(slurm_cluster, trainer, tmp_path):
    """Two array tasks, k = 1 and k = 3, through LAUNCHER=mpiexec; task 0 is also preempted
    (hydra's mpiexec must forward SIGUSR1 to the ranks, and an array task requeues alone)."""
    args = TRAIN_ARGS.replace("--delay 3 ", "")
    job = slurm_cluster.sbatch(JOBS / "sweep.sbatch", "--array=0-1", cwd=tmp_path,
                               env={"SSDMPI_ARGS": args, "SWEEP_VALUES": "1 3", "LAUNCHER": "mpiexec"},
                               script_args=("--seed", "4"))    # after SSDMPI_ARGS' --seed 3: wins
    root = tmp_path / "runs" / f"ssdmpi-sweep-{job}"
    outs = [tmp_path / f"ssdmpi-sweep-{job}_{i}.out" for i in (0, 1)]
    signal_mid_training(slurm_cluster, f"{job}_0", root / "delay1", outs[0])
    tasks = {t["ArrayTaskId"]: t for t in slurm_cluster.wait_done(job, 2 * JOB_TIMEOUT, outs)}
    why = slurm_cluster.explain(job, outs)
    assert sorted(tasks) == ["0", "1"], why
    assert all(t["JobState"] == "COMPLETED" and t["ExitCode"] == "0:0" for t in tasks.values()), why
    assert (tasks["0"]["Restarts"], tasks["1"]["Restarts"]) == ("1", "0"), why
    assert "ssdmpi train exited with 85" in outs[0].read_text(), why

    assert sorted(p.name for p in root.iterdir()) == ["delay1", "delay3"]
    finals = {}
    for k in (1, 3):
        run_dir = root / f"delay{k}"
        starts = records(run_dir, "start")
        assert len(starts) == (2 if k == 1 else 1), why        # task 0 resumed once
        assert all(s["config"]["delay"] == k for s in starts), f"{run_dir} ran with another delay"
        assert all(s["config"]["seed"] == 4 for s in starts), f"{run_dir}: the job's arguments were lost"
        state = final_state(run_dir)
        assert state["step"] == STEPS and state["world_size"] == 2
        finals[k] = state["W"]
    # Past the 20-step warm-up the delay changes the trajectory: the two runs really differ.
    assert not np.array_equal(finals[1], finals[3])


def test_bench_job_leaves_tables_in_its_run_directory(slurm_cluster, trainer, tmp_path):
    """engine (if PyTorch, its peer, is installed), comm, model and train, each with tiny settings."""
    env = {"BENCHES": "comm model train",
           "BENCH_COMM_ARGS": "--sizes 1K,64K --repeats 3 --overlap-size 64K",
           "BENCH_MODEL_ARGS": "--net none --model mlp --batch-size 16 --fit-sizes 0.1,0.4 --check-sizes 0.2 "
                               "--patterns ssgd,step",
           "BENCH_TRAIN_ARGS": "--net none --variants ssgd,ssd:step:2 --dataset digits --model mlp --steps 40 "
                               "--batch-size 16 --warmup-steps 10"}
    engine = importlib.util.find_spec("torch") is not None
    if engine:
        env.update(BENCHES="engine comm model train", BENCH_ENGINE_ARGS="--repeats 3 --no-memory")
    job = slurm_cluster.sbatch(JOBS / "bench.sbatch", cwd=tmp_path, env=env)
    out = tmp_path / f"ssdmpi-bench-{job}.out"
    run_dir = tmp_path / "runs" / f"ssdmpi-bench-{job}"
    (record,) = slurm_cluster.wait_done(job, JOB_TIMEOUT, [out])
    why = slurm_cluster.explain(job, [out] + sorted(run_dir.glob("*.log")))
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", why

    if engine:
        assert "ratio ssdmpi/torch" in (run_dir / "engine.txt").read_text(), why
    comm = (run_dir / "comm.txt").read_text()
    assert "2 ranks" in comm and "64K" in comm, comm             # ran on both tasks, all sizes
    model = json.loads((run_dir / "model.json").read_text())
    assert model, "bench model wrote an empty JSON file"
    assert "|" in (run_dir / "model.txt").read_text()             # its tables
    table = (run_dir / "train" / "results.md").read_text()
    rows = (run_dir / "train" / "results.csv").read_text().splitlines()
    assert "ssgd" in table and "ssd-step-k2" in table, table
    assert len(rows) == 3, rows                                   # header + one row per variant
    assert "2 ranks" in table                                     # --ranks came from the allocation
    assert sorted(p.name for p in (run_dir / "train" / "runs").iterdir()) == ["ssd-step-k2", "ssgd"]
