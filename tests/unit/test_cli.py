"""The command line: help, bad input, info, and the abort path."""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, mpiexec, run_cli

SUBCOMMANDS = ("train", "eval", "bench", "plot", "info", "ckpt", "data", "export")


def test_help_lists_every_subcommand():
    result = run_cli(["--help"])
    assert result.returncode == 0
    for name in SUBCOMMANDS:
        assert name in result.stdout


@pytest.mark.parametrize("args,prog", [(["frobnicate"], "ssdmpi"), (["info", "--no-such-flag"], "ssdmpi info"),
                                       ([], "ssdmpi")])
def test_bad_command_line_is_one_line_error_pointing_at_help(args, prog):
    result = run_cli(args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and lines[0].endswith(f"; see {prog} --help")


def test_info_json_reports_mpi_library_and_thread_level():
    result = run_cli(["info", "--json"], ranks=2)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)   # rank 0 alone prints
    assert "MPICH" in report["mpi"]["library"] or "Open MPI" in report["mpi"]["library"]
    assert report["mpi"]["thread_level"] in {"single", "funneled", "serialized", "multiple"}
    assert report["mpi"]["world_size"] == 2
    assert report["backend"]["active"] in {"numpy", "cupy"}
    assert report["cuda_aware"]


def test_info_text_names_backend_and_reason():
    result = run_cli(["info", "--device", "cpu"])
    assert result.returncode == 0, result.stderr
    assert "array backend: numpy" in result.stdout
    assert "MPI thread level granted:" in result.stdout


def test_device_gpu_without_gpu_is_a_user_error():
    from ssdmpi import backend
    if backend.probe_cupy()[0] is not None:
        pytest.skip("a GPU is present")
    result = run_cli(["info", "--device", "gpu"])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--device gpu" in result.stderr


def test_exception_on_one_rank_aborts_the_whole_job_naming_it(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(
        "import sys, time\n"
        "from ssdmpi.comm.abort import install_abort_hook\n"
        "from mpi4py import MPI\n"
        "install_abort_hook()\n"
        "comm = MPI.COMM_WORLD\n"
        "if comm.Get_rank() == 1:\n"
        "    raise RuntimeError('deliberate failure')\n"
        "comm.Barrier()   # rank 0 would wait here forever without the abort\n"
        "time.sleep(60)\n")
    start = time.monotonic()
    result = subprocess.run([mpiexec(), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                            timeout=60, cwd=str(tmp_path.parent),
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < 20
    assert "rank 1/2" in result.stderr
    assert "deliberate failure" in result.stderr


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """``ssdmpi data list | head -0``: the pipe's reader is gone before ssdmpi writes; one
    process ends as a SIGPIPE'd shell command would (141), with no traceback and no abort."""
    proc = subprocess.Popen([sys.executable, "-m", "ssdmpi", "data", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()             # before the child has imported anything, let alone printed
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, stderr
    assert stderr == ""
