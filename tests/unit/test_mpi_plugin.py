"""A test that fails on one rank of ``mpiexec -n 2 pytest`` fails the run on every rank, and never hangs it.

A small planted test file in a temporary directory, whose conftest imports the real hook
(``tests/mpi_plugin.py``, as ``tests/mpi/conftest.py`` does), runs under ``mpiexec -n 2 python -m
pytest``, directly and through ``tests/mpi_pytest.py`` (what ``tests/run.py`` runs). Its tests fail
on rank 1 only: once after their collectives (the ranks agree, rank 0 reports it failed and the run
goes on together), once before one (rank 0 waits in it forever: without the hook the run hangs).
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, mpiexec
from tests.mpi_plugin import AGREE_TIMEOUT_S, CONSOLE_FD

PLANTED = '''
from mpi4py import MPI

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def test_fails_on_rank_1_after_its_collectives():
    MPI.COMM_WORLD.allreduce(1)
    assert RANK != 1, "planted failure on rank 1, after the collectives"


def test_passes_with_collectives():
    assert MPI.COMM_WORLD.allreduce(RANK) == SIZE * (SIZE - 1) // 2


def test_fails_on_rank_1_before_a_collective():
    assert RANK != 1, "planted failure on rank 1, before the allreduce"
    MPI.COMM_WORLD.allreduce(1)


def test_never_reached():
    MPI.COMM_WORLD.Barrier()
'''
AFTER, BEFORE = "test_fails_on_rank_1_after_its_collectives", "test_fails_on_rank_1_before_a_collective"


@pytest.fixture
def planted(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.mpi_plugin import pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_planted.py").write_text(PLANTED)
    (tmp_path / "logs").mkdir()
    return tmp_path


def run_planted(directory: Path, via_run_py: bool, *args, **env) -> tuple:
    """``mpiexec -n 2`` pytest on the planted file (through tests/mpi_pytest.py, whose rank 1 writes
    to ``logs/rank1.log``, if ``via_run_py``): (exit code, console output, seconds)."""
    python = [sys.executable, str(ROOT / "tests" / "mpi_pytest.py"), str(directory / "logs")] if via_run_py \
        else [sys.executable, "-m", "pytest"]
    cmd = [mpiexec(), "-n", "2"] + python + ["-q", "--color=no", "-p", "no:cacheprovider", "test_planted.py", *args]
    environ = {k: v for k, v in os.environ.items() if k not in (CONSOLE_FD, "SSDMPI_TEST_AGREE_S")}
    environ.update(PYTHONPATH=str(ROOT), **env)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=directory, env=environ, capture_output=True, text=True, timeout=150)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


@pytest.mark.timeout(200)
def test_a_failure_on_rank_1_before_a_collective_ends_the_run_within_60_s_naming_the_test(planted):
    code, out, seconds = run_planted(planted, via_run_py=False)
    assert code != 0 and seconds < 60, (code, seconds, out)
    assert AGREE_TIMEOUT_S <= seconds
    assert f"FAILED test_planted.py::{BEFORE} (call) on rank 1 of 2; the other ranks did not finish" in out, out
    assert "planted failure on rank 1, before the allreduce" in out           # its report, printed first
    assert f"FAILED test_planted.py::{AFTER} (call) (earlier in this run)" in out, out
    assert "test_never_reached" not in out


@pytest.mark.timeout(120)
def test_through_the_per_rank_logs_the_report_is_on_the_console_and_in_the_failing_ranks_log(planted):
    code, out, seconds = run_planted(planted, True, SSDMPI_TEST_AGREE_S="3")
    assert code != 0 and 3 <= seconds < 60, (code, seconds, out)
    log = (planted / "logs" / "rank1.log").read_text()
    for text in (out, log):
        assert "planted failure on rank 1, before the allreduce" in text
        assert f"FAILED test_planted.py::{BEFORE} (call) on rank 1 of 2; the other ranks did not finish the test " \
               "within 3 s" in text, text
    assert out.index("planted failure on rank 1, before") < out.index(f"FAILED test_planted.py::{BEFORE}")


@pytest.mark.timeout(120)
def test_a_failure_on_rank_1_after_the_collectives_is_reported_by_rank_0_and_the_run_goes_on(planted):
    code, out, seconds = run_planted(planted, True, "-k", "after or passes")
    assert code == 1, (code, out)
    assert "failed on rank 1 of 2 (call):" in out and "planted failure on rank 1, after the collectives" in out
    assert "call failed on rank(s) 1 of 2" in out and f"FAILED test_planted.py::{AFTER}" in out
    assert "1 failed, 1 passed, 2 deselected" in out, out          # rank 0's own summary (rank 1's: its log)
    assert "1 failed, 1 passed, 2 deselected" in (planted / "logs" / "rank1.log").read_text()
