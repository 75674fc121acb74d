"""Launching as users launch: each rank chooses its threads and GPU itself (comm/node.py),
says so (run header, summary, config.yaml, ``ssdmpi info`` per rank), and bad launch
settings are one-line errors."""

import json
import os

import pytest

from ssdmpi import backend
from ssdmpi.comm.node import THREAD_VARIABLES
from tests.conftest import assert_one_line_error, launcher_world_size, run_cli
from tests.unit.test_train_cli import SMALL


def expected_threads(local_size: int) -> int:
    cpus = len(os.sched_getaffinity(0))
    return max(1, cpus // local_size)


def test_info_lists_every_rank_with_threads_and_device():
    result = run_cli(["info", "--json"], ranks=2, unset=THREAD_VARIABLES, timeout=180)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert sorted(r["local_rank"] for r in ranks) == [0, 1] and {r["local_size"] for r in ranks} == {2}
    for r in ranks:
        assert r["threads"] == expected_threads(2), r
        assert r["threads_reason"].endswith("/ 2 local ranks")
        assert r["device"] in ("cpu", "gpu") and r["thread_level"] in ("single", "funneled", "serialized", "multiple")
        assert r["mpi_library"] == report["mpi"]["library"]
    assert report["blas"] and all(b["num_threads"] == expected_threads(2) for b in report["blas"])


def test_info_text_has_one_line_per_rank_and_keeps_user_variables():
    result = run_cli(["info", "--device", "cpu"], ranks=2, unset=THREAD_VARIABLES, env={"OMP_NUM_THREADS": "1"},
                     timeout=180)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("rank ")]
    assert len(lines) == 2 and lines[0].startswith("rank 0: ") and lines[1].startswith("rank 1: ")
    assert all("threads 1 (OMP_NUM_THREADS=1 set by the user)" in line and ", CPU, " in line for line in lines)


def test_info_finds_distributions_by_any_name():
    from ssdmpi.info import version

    assert version(("no-such-dist-xyz", "numpy"), None).endswith("(numpy)")
    assert version(("no-such-dist-xyz",), "json") is not None       # a module without metadata
    assert version(("no-such-dist-xyz",), "no_such_module_xyz") is None


def test_train_reports_the_threads_it_chose(tmp_path):
    run = tmp_path / "run"
    result = run_cli(["train", "--run-dir", str(run), "--steps", "20"] + SMALL, ranks=2, unset=THREAD_VARIABLES,
                     timeout=240)
    assert result.returncode == 0, result.stderr
    n = expected_threads(2)
    said = f"threads {n} per rank ("
    header = [line for line in result.stdout.splitlines() if line.startswith("rank 0: threads")]
    assert header and said in header[0] and "/ 2 local ranks" in header[0], result.stdout
    assert said in (run / "summary.txt").read_text()
    assert said in (run / "config.yaml").read_text()
    start = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert start["placement"]["threads"] == n and start["placement"]["local_size"] == 2


@pytest.mark.parametrize("args,needle", [
    (["--threads", "0"], "--threads must be a positive integer, got 0"),
    (["--gpu-id", "-1"], "--gpu-id must be an integer >= 0"),
    (["--gpu-id", "64"], "--gpu-id 64 is not a GPU this rank can see"),
    (["--device", "cpu", "--gpu-id", "0"], "--gpu-id needs a GPU but --device is cpu"),
])
def test_bad_launch_settings_are_one_line_errors(args, needle):
    assert_one_line_error(run_cli(["train"] + args, ranks=2, timeout=180), needle)


def test_device_gpu_without_a_gpu_is_one_line_error():
    if backend.gpu_count():
        pytest.skip("a GPU is present")
    assert_one_line_error(run_cli(["train", "--device", "gpu"], ranks=2, timeout=180), "--device gpu requested")


@pytest.mark.parametrize("args,needle", [(["--threads", "0"], "--threads must be a positive integer"),
                                         (["--gpu-id", "64"], "--gpu-id 64 is not a GPU")])
def test_info_checks_the_same_settings(args, needle):
    assert_one_line_error(run_cli(["info"] + args, timeout=120), needle)


@pytest.mark.parametrize("environ,size", [
    ({}, 1), ({"PMI_SIZE": "4", "PMI_RANK": "1"}, 4), ({"OMPI_COMM_WORLD_SIZE": "2"}, 2),
    ({"SLURM_NTASKS": "8"}, 1),   # a Slurm allocation is not an MPI world by itself
    ({"PMIX_RANK": "0", "SLURM_STEP_NUM_TASKS": "3"}, 3),
])
def test_launcher_world_size(environ, size):
    assert launcher_world_size(environ) == size
