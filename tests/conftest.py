"""Shared test helpers, and which tests run under ``mpiexec -n N pytest``.

``pytest`` from the repository root runs every test in one process (the MPI tests in a
world of one rank). ``mpiexec -n N pytest`` (N > 1) runs the MPI tests (``tests/mpi``) on
every rank and skips all the others on every rank, saying why and what runs them: they
are serial tests, many start their own ``mpiexec`` or Slurm cluster (which cannot run
inside a rank's launcher environment), and running them on rank 0 while the other ranks
wait would make the MPI run several times slower. ``python tests/run.py`` runs both kinds.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPI_TESTS = ROOT / "tests" / "mpi"
# What runs the tests skipped in a multi-rank world, by directory.
SERIAL_COMMANDS = {"unit": "python tests/run.py --stage unit (or: python -m pytest tests/unit)",
                   "slurm": "python tests/run.py --stage slurm (as root)",
                   "cluster": "python tests/run.py --stage cluster"}


def launcher_world_size(environ=None) -> int:
    """The size of the MPI job this process was launched in, from the launcher's variables
    (MPICH/Hydra and srun's PMI, Open MPI, MVAPICH); 1 outside one. Initialises nothing."""
    environ = os.environ if environ is None else environ
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        if environ.get(name, "").isdigit():
            return int(environ[name])
    if ("PMIX_RANK" in environ or "PMI_RANK" in environ) and environ.get("SLURM_STEP_NUM_TASKS", "").isdigit():
        return int(environ["SLURM_STEP_NUM_TASKS"])
    return 1


def pytest_collection_modifyitems(config, items):
    """In a multi-rank world, skip every test outside tests/mpi (see the module docstring)."""
    size = launcher_world_size()
    if size <= 1:
        return
    for item in items:
        path = Path(str(item.path)).resolve()
        if MPI_TESTS in path.parents:
            continue
        part = path.relative_to(ROOT / "tests").parts[0] if ROOT / "tests" in path.parents else ""
        command = SERIAL_COMMANDS.get(part, f"python -m pytest {path.relative_to(ROOT)}")
        item.add_marker(pytest.mark.skip(reason=f"serial test, not run under mpiexec -n {size} (it runs in a "
                                                f"one-process world, or starts its own launcher): {command}"))


def mpiexec() -> str:
    """The launcher of this Python's environment (the venv's own), falling back to PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


def ssdmpi_cmd() -> list:
    """How to run the ``ssdmpi`` command with this Python."""
    return [sys.executable, "-m", "ssdmpi"]


def run_cli(args, ranks: int | None = None, timeout: float = 120, unset=(), **kwargs) -> subprocess.CompletedProcess:
    """Run ``ssdmpi ARGS`` (under ``mpiexec -n ranks`` if given) with a timeout; capture output.

    The command gets this process's environment without the variables named in ``unset``, then
    with ``env`` (a mapping) added: a test of what the tool chooses by itself passes
    ``unset=THREAD_VARIABLES``, so that a caller's exported ``OMP_NUM_THREADS`` cannot leak in.
    """
    cmd = ssdmpi_cmd() + list(args)
    if ranks is not None:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
    env = {k: v for k, v in os.environ.items() if k not in set(unset)}
    env.update(kwargs.pop("env", {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=kwargs.pop("cwd", ROOT),
                          env=env, **kwargs)


# Open MPI's own lines about a job whose ranks exit non-zero (MPICH adds none): its boxed
# report between lines of dashes, PMIx's complaint when ranks leave while it still talks, and
# its event library's warning when a rank's socket closes under it ("[warn] Epoll MOD(4) ...").
OPEN_MPI_NOISE = re.compile(r"^(\[[^\]]+:\d+\] PMIX ERROR: |\[warn\] Epoll )")


def error_lines(result) -> list:
    """The non-blank lines of ``result.stderr`` that ssdmpi wrote: the launcher's noise left out."""
    lines, boxed = [], False
    for line in result.stderr.splitlines():
        if line.strip() and set(line.strip()) == {"-"}:
            boxed = not boxed
        elif line.strip() and not boxed and not OPEN_MPI_NOISE.match(line):
            lines.append(line)
    return lines


def assert_one_line_error(result, needle):
    """Exit 2, one ``ssdmpi: error:`` line containing ``needle``, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("ssdmpi: error: ") and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.fixture
def cli():
    return run_cli
