"""The command line that continues a run as this process was launched: the launcher with the
rank count, then the program, then the arguments (``mpiexec -n 2 ssdmpi train --run-dir R
--resume auto``), for the hints a run prints (continue after a preemption, train longer).

The launcher is read from the environment, without initialising MPI: ``srun -n N`` for a rank
srun started (a numeric ``SLURM_STEP_ID`` and one Slurm task per rank, not MPICH's Hydra, which
sets ``MPI_LOCALNRANKS``); ``mpiexec -n N`` for any other launcher or more than one rank; nothing
for one process started by hand. ``mpiexec`` and the program are written as the user can type
them: the short name when ``PATH`` finds that same file, else the path (the virtual
environment's ``mpiexec`` when it has one, as the README launches).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def _typed(path: str, name: str) -> str:
    """``name`` if ``PATH`` finds the file ``path``, else ``path`` itself."""
    found = shutil.which(name)
    try:
        return name if found and os.path.samefile(found, path) else path
    except OSError:
        return path


def launcher(size: int, environ=None) -> list:
    """``["srun", "-n", "N"]``, ``["mpiexec", "-n", "N"]`` or ``[]`` (see the module docstring)."""
    environ = os.environ if environ is None else environ
    started_by_mpi = any(name in environ for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))
    if environ.get("SLURM_STEP_ID", "").isdigit() and environ.get("SLURM_STEP_NUM_TASKS") == str(size) \
            and "MPI_LOCALNRANKS" not in environ and "OMPI_COMM_WORLD_SIZE" not in environ:
        return ["srun", "-n", str(size)]
    if size > 1 or started_by_mpi:
        local = Path(sys.executable).parent / "mpiexec"
        return [_typed(str(local), "mpiexec") if local.exists() else "mpiexec", "-n", str(size)]
    return []


def ssdmpi_program(argv0: str) -> list:
    """How this ``ssdmpi`` command was started: ``["ssdmpi"]`` (or its path) or ``[python, "-m",
    "ssdmpi"]`` (also for a wrapper that calls ``ssdmpi.cli.main``)."""
    if os.path.basename(argv0) == "ssdmpi":
        return [_typed(argv0, "ssdmpi")]
    return [_typed(sys.executable, "python"), "-m", "ssdmpi"]


def resume_command(run_dir: str, size: int, settings: dict | None = None, command: bool = True, environ=None,
                   argv0: str | None = None) -> str:
    """What continues the run in ``run_dir`` on ``size`` ranks, with ``settings`` changed
    (``{"epochs": 40}``). ``command``: the run is the ``ssdmpi train`` command's: ``mpiexec -n 2
    ssdmpi train --run-dir R --resume auto --epochs 40``; else a script calling ``ssdmpi.train``
    (``argv0``, default ``sys.argv[0]``): the script's command line and the settings to give it."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    settings = settings or {}
    if command:
        flags = [word for key, value in settings.items() for word in (f"--{key.replace('_', '-')}", str(value))]
        return shlex.join(launcher(size, environ) + ssdmpi_program(argv0)
                          + ["train", "--run-dir", run_dir, "--resume", "auto", *flags])
    script = shlex.join(launcher(size, environ) + [_typed(sys.executable, "python"), argv0])
    given = {"run_dir": run_dir, "resume": "auto", **settings}
    config = ", ".join(f"{key!r}: {value!r}" for key, value in given.items())
    return f"{script}, with {{{config}}} in the config it gives ssdmpi.train"
