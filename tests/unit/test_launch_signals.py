"""Preemption as the launcher delivers it, under MPICH's mpiexec and Open MPI's mpirun alike:
SIGUSR1 to one rank, and a signal to the launcher itself (what jobs/*.sbatch do: the launcher
forwards it to the ranks). Every rank checkpoints and exits 85. Open MPI's mpirun answers a
SIGTERM by killing the ranks, so the templates forward SIGUSR1 (README.md, "Open MPI")."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ssdmpi import checkpoint
from tests.conftest import ROOT, mpiexec
from tests.unit.test_train_cli import SMALL

RANK_VARIABLES = (b"PMI_RANK", b"OMPI_COMM_WORLD_RANK")


def launcher_is_open_mpi() -> bool:
    out = subprocess.run([mpiexec(), "--version"], capture_output=True, text=True, timeout=60)
    return "Open MPI" in out.stdout + out.stderr or "prterun" in out.stdout + out.stderr


def rank_pids(tag: str, timeout: float = 60) -> dict:
    """``{rank: pid}`` of the python processes of the job tagged ``tag`` (through /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                with open(f"/proc/{entry}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue
            rank = next((env[v] for v in RANK_VARIABLES if v in env), None)
            if name.startswith("python") and env.get(b"SSDMPI_TEST_TAG") == tag.encode() and rank is not None:
                found[int(rank)] = int(entry)
        if len(found) == 2:
            return found
        time.sleep(0.1)
    raise AssertionError("could not find the ranks' processes")


# ``python -m ssdmpi ARGS`` that appends "RANK CODE" to the file argv[1] as it returns CODE. The
# rank writes it itself, before MPI_Finalize (mpi4py's, at exit): Open MPI's launcher kills the
# other ranks as soon as one has exited non-zero, so a wrapper shell that wrote the code after
# its rank exited could be killed first; MPI_Finalize waits for every rank to reach it.
RECORD_EXIT_CODE = ("import os, sys; from ssdmpi.cli import main; rc = main(sys.argv[2:]); "
                    "rank = os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK')); "
                    "open(sys.argv[1], 'a').write(f'{rank} {rc}\\n'); sys.exit(rc)")


def start_job(run, tag: str, per_rank_codes=None) -> subprocess.Popen:
    """``mpiexec -n 2 ssdmpi train`` (long enough to be interrupted), in its own session.
    ``per_rank_codes``: a file each rank appends ``"RANK CODE"`` to (``RECORD_EXIT_CODE``)."""
    args = ["train", "--run-dir", str(run), "--steps", "3000", "--log-every", "2"] + SMALL
    if per_rank_codes is None:
        args = [sys.executable, "-m", "ssdmpi"] + args
    else:
        args = [sys.executable, "-c", RECORD_EXIT_CODE, str(per_rank_codes)] + args
    return subprocess.Popen([mpiexec(), "-n", "2"] + args, cwd=ROOT, env=dict(os.environ, SSDMPI_TEST_TAG=tag),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_delay_stage(run, proc) -> None:
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and '"stage": "delay"' in metrics.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "never reached the delay stage"
        time.sleep(0.05)


def assert_checkpointed_and_stopped(run, proc, out, err) -> None:
    assert proc.returncode == 85, (proc.returncode, out, err)
    assert "stopped at step" in out and "SIGUSR1/SIGTERM" in out and "--resume auto" in out
    (stop,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
               if '"kind": "stop"' in line]
    assert stop["step"] < 3000 and stop["exit_code"] == 85
    meta = checkpoint.read_meta(str(run / "checkpoints" / f"ckpt-{stop['step']:08d}"))
    assert meta["stage"] == "delay" and meta["reason"] == "signal"


def finish(proc) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(300)
def test_sigusr1_to_one_rank_exits_85_on_every_rank(tmp_path):
    run, codes, tag = tmp_path / "run", tmp_path / "codes", f"{os.getpid()}-one"
    proc = start_job(run, tag, per_rank_codes=codes)
    try:
        pids = rank_pids(tag)
        wait_for_delay_stage(run, proc)
        os.kill(pids[1], signal.SIGUSR1)
    finally:
        out, err = finish(proc)
    assert_checkpointed_and_stopped(run, proc, out, err)
    assert sorted(codes.read_text().split("\n")[:-1]) == ["0 85", "1 85"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_a_signal_to_the_launcher_reaches_every_rank(tmp_path, sig):
    if sig == signal.SIGTERM and launcher_is_open_mpi():
        pytest.skip("Open MPI's mpirun kills the ranks on SIGTERM (jobs/*.sbatch forward SIGUSR1 to it)")
    run, tag = tmp_path / "run", f"{os.getpid()}-{sig.name}"
    proc = start_job(run, tag)
    try:
        rank_pids(tag)
        wait_for_delay_stage(run, proc)
        proc.send_signal(sig)        # to mpiexec/mpirun itself, as a batch script's trap does
    finally:
        out, err = finish(proc)
    assert_checkpointed_and_stopped(run, proc, out, err)


# ``python -c LATE_SIGNAL ARGS``: ``ssdmpi ARGS``, then a SIGUSR1 to itself after the run has
# returned, in the shutdown window a lead-time signal can still hit (MPI_Finalize follows).
LATE_SIGNAL = ("import os, signal, sys; from ssdmpi.cli import main; rc = main(sys.argv[1:]); "
               "os.kill(os.getpid(), signal.SIGUSR1); sys.exit(rc)")


@pytest.mark.timeout(300)
def test_a_signal_after_the_last_step_does_not_fail_a_finished_run(tmp_path):
    """The Slurm job of a run that had finished failed with 138 when the lead-time signal came
    as its ranks shut down: the handlers had been restored to SIGUSR1's default (terminate)."""
    run = tmp_path / "run"
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-c", LATE_SIGNAL, "train", "--run-dir", str(run),
                           "--steps", "20"] + SMALL, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "ssdmpi train: done" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and summary["step"] == 20
