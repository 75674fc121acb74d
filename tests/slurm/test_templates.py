"""Static checks of the job templates (no cluster needed): they parse, carry the
#SBATCH settings preemption depends on, and the copies of the launch block agree."""

import re
import subprocess

import pytest

from tests.slurm.conftest import JOBS

TEMPLATES = ("train.sbatch", "sweep.sbatch", "bench.sbatch")


def sbatch_options(name: str) -> list[str]:
    return re.findall(r"^#SBATCH\s+(\S+)", (JOBS / name).read_text(), flags=re.M)


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_is_valid_bash(name):
    r = subprocess.run(["bash", "-n", str(JOBS / name)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", ("train.sbatch", "sweep.sbatch"))
def test_resumable_templates_ask_for_signal_requeue_and_appended_output(name):
    opts = sbatch_options(name)
    assert "--requeue" in opts
    assert "--open-mode=append" in opts        # the requeued run must not truncate the first run's log
    assert any(re.fullmatch(r"--signal=B:USR1@\d+", o) for o in opts)   # B: the batch shell, which forwards it
    assert any(o.startswith("--output=") and re.search(r"%[jAa]", o) for o in opts)


def test_train_and_sweep_share_one_launch_block():
    """The launch/trap/wait/requeue code is copied (templates must stand alone): keep the copies equal."""
    def block(name):
        text = (JOBS / name).read_text()
        return text[text.index('case "$LAUNCHER" in'):]
    assert block("train.sbatch") == block("sweep.sbatch")


def test_cluster_fixture_says_why_it_cannot_start(monkeypatch):
    """Without root or without the packages the Slurm tests skip, naming the reason."""
    from tests.slurm import conftest

    monkeypatch.setattr(conftest.os, "geteuid", lambda: 1000)
    assert "needs root" in conftest._missing()
    monkeypatch.setattr(conftest.os, "geteuid", lambda: 0)
    monkeypatch.setattr(conftest.shutil, "which", lambda name, path=None: None if name == "slurmd" else "/x")
    reason = conftest._missing()
    assert "missing slurmd" in reason and "apt-get install slurm-wlm munge" in reason


# ---- the templates' shell logic, run by bash with stand-ins for srun, ssdmpi and scontrol -----
# (no cluster needed: what each template passes to `ssdmpi train`, when it requeues, and
# which array sizes the sweep accepts)

STUBS = {
    # srun [--options] CMD ...: run CMD
    "srun": '#!/bin/bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n',
    # record the arguments, one per line, and exit with $STUB_RC
    "ssdmpi": '#!/bin/bash\nprintf "%s\\n" "$@" > "$STUB_DIR/ssdmpi.args"\nexit "${STUB_RC:-0}"\n',
    "scontrol": '#!/bin/bash\necho "$*" >> "$STUB_DIR/scontrol.calls"\n',
    "python": "#!/bin/sh\nexit 0\n",       # the shared-memory cleanup after a failed launch
}


def run_template(tmp_path, name: str, args=(), **env) -> tuple[subprocess.CompletedProcess, list | None, str]:
    """Run jobs/NAME as the batch shell of job 123 would; return (the result, the arguments
    `ssdmpi` got (None: not started), the scontrol calls)."""
    import os

    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for stub, text in STUBS.items():
        (stubs / stub).write_text(text)
        (stubs / stub).chmod(0o755)
    job_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SSDMPI", "SWEEP_"))}
    job_env.update(PATH=f"{stubs}:{job_env.get('PATH', '/usr/bin:/bin')}", STUB_DIR=str(stubs),
                   SLURM_JOB_ID="123", SLURM_JOB_NAME="ssdmpi-" + name.split(".")[0],
                   SLURM_NTASKS="2", SLURM_JOB_NODELIST="node1", LAUNCHER="srun")
    job_env.update(env)
    r = subprocess.run(["bash", str(JOBS / name), *args], cwd=tmp_path, env=job_env, capture_output=True,
                       text=True, timeout=60)
    got = stubs / "ssdmpi.args"
    calls = stubs / "scontrol.calls"
    return (r, got.read_text().splitlines() if got.exists() else None,
            calls.read_text() if calls.exists() else "")


def test_train_template_passes_its_arguments_to_ssdmpi_train(tmp_path):
    """``sbatch jobs/train.sbatch --epochs 3 ...``: the arguments reach ``ssdmpi train`` as
    given (spaces kept), after SSDMPI_ARGS so that they win; none given: as before."""
    r, got, _ = run_template(tmp_path, "train.sbatch", ["--epochs", "3", "--config", "/a dir/my run.yaml"],
                             SSDMPI_ARGS="--preset default --epochs 20")
    assert r.returncode == 0, r.stderr
    assert got == ["train", "--run-dir", "runs/ssdmpi-train-123", "--resume", "auto", "--preset", "default",
                   "--epochs", "20", "--epochs", "3", "--config", "/a dir/my run.yaml"]
    r, got, _ = run_template(tmp_path, "train.sbatch")
    assert r.returncode == 0 and got == ["train", "--run-dir", "runs/ssdmpi-train-123", "--resume", "auto",
                                         "--preset", "default"], r.stderr


def test_sweep_template_passes_its_arguments_and_its_flag_last(tmp_path):
    r, got, _ = run_template(tmp_path, "sweep.sbatch", ["--epochs", "3", "--delay", "7"], SWEEP_VALUES="2 4",
                             SLURM_ARRAY_JOB_ID="120", SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_TASK_COUNT="2",
                             SLURM_ARRAY_TASK_MIN="0", SLURM_ARRAY_TASK_MAX="1", SLURM_JOB_NAME="ssdmpi-sweep")
    assert r.returncode == 0, r.stderr
    assert got == ["train", "--run-dir", "runs/ssdmpi-sweep-120/delay4", "--resume", "auto", "--preset", "default",
                   "--epochs", "3", "--delay", "7", "--delay", "4"]


@pytest.mark.parametrize("name", ("train.sbatch", "sweep.sbatch"))
@pytest.mark.parametrize("restarts, cap, requeued", [(None, None, True), ("4", "5", True), ("5", "5", False),
                                                     ("9", None, False), ("0", "0", False), ("2", "3", True)])
def test_requeue_stops_at_max_restarts(tmp_path, name, restarts, cap, requeued):
    """Exit 85 requeues the job while SLURM_RESTART_COUNT < MAX_RESTARTS (default 5); past the
    cap the job ends with 85 and one line saying why and how to go on."""
    env = {"STUB_RC": "85"}
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = restarts
    if cap is not None:
        env["MAX_RESTARTS"] = cap
    if name == "sweep.sbatch":
        env.update(SWEEP_VALUES="1", SLURM_ARRAY_TASK_ID="0", SLURM_ARRAY_TASK_COUNT="1")
    r, got, calls = run_template(tmp_path, name, **env)
    assert got is not None, r.stderr
    if requeued:
        assert r.returncode == 0 and calls == "requeue 123\n", (r.stdout, r.stderr)
        assert "requeueing job 123" in r.stdout
    else:
        assert r.returncode == 85 and calls == "", (r.stdout, r.stderr)
        (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert f"restarted {restarts} times (MAX_RESTARTS={cap or 5})" in line and "RUN_DIR=" in line


@pytest.mark.parametrize("count, lo, hi, why", [
    ("2", "0", "1", "too few array tasks: the array has 2 tasks (ids 0-1) but SWEEP_VALUES has 3 values"),
    ("4", "0", "3", "too many array tasks: the array has 4 tasks (ids 0-3) but SWEEP_VALUES has 3 values"),
    ("3", "1", "3", "array task ids must run from 0"),
    ("3", "0", "4", "array task ids must run from 0"),       # --array=0,2,4
    (None, None, None, "too few array tasks: the array has 1 tasks"),   # not an array at all
    ("3", "0", "2", None),
])
def test_sweep_checks_the_array_size_against_its_values(tmp_path, count, lo, hi, why):
    env = {"SWEEP_VALUES": "1 2 5", "SLURM_ARRAY_TASK_ID": "0"}
    for key, value in (("COUNT", count), ("MIN", lo), ("MAX", hi)):
        if value is not None:
            env[f"SLURM_ARRAY_TASK_{key}"] = value
    r, got, _ = run_template(tmp_path, "sweep.sbatch", **env)
    if why is None:
        assert r.returncode == 0 and got[-2:] == ["--delay", "1"], r.stderr
        return
    assert r.returncode == 2 and got is None, (r.stdout, r.stderr)
    assert why in r.stderr and "submit with --array=0-2" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("name", TEMPLATES)
def test_templates_name_output_after_the_job_and_offer_site_settings(name):
    text = (JOBS / name).read_text()
    (output,) = [o for o in sbatch_options(name) if o.startswith("--output=")]
    assert output.startswith("--output=%x-"), output
    for option in ("--partition=", "--account=", "--mem=", "--cpus-per-task=", "--gpus-per-task="):
        assert re.search(rf"^##SBATCH {option}", text, flags=re.M), f"{name}: no commented {option} line"


def test_templates_leave_threads_to_ssdmpi():
    """The same thread rule in every template: ssdmpi chooses. No template exports a thread
    variable; bench.sbatch passes the launches it makes itself what ``ssdmpi bench`` gives its
    own (one per rank), with the user's setting winning."""
    rule = "# BLAS threads: ssdmpi chooses them itself; set OMP_NUM_THREADS to choose yourself."
    for name in TEMPLATES:
        text = (JOBS / name).read_text()
        assert rule in text, name
        assert not re.search(r"^\s*export\s+\w*_NUM_THREADS", text, flags=re.M), name
        assignments = re.findall(r"(\w+_NUM_THREADS)=(\S+?)[\"\s)]", text)
        assert all(value == f"${{{var}:-1}}" for var, value in assignments), (name, assignments)
        assert bool(assignments) == (name == "bench.sbatch"), name
