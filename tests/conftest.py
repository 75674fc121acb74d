"""Shared test helpers."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def mpiexec() -> str:
    """The launcher of this Python's environment (the venv's own), falling back to PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


def ssdmpi_cmd() -> list:
    """How to run the ``ssdmpi`` command with this Python."""
    return [sys.executable, "-m", "ssdmpi"]


def run_cli(args, ranks: int | None = None, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run ``ssdmpi ARGS`` (under ``mpiexec -n ranks`` if given) with a timeout; capture output."""
    cmd = ssdmpi_cmd() + list(args)
    if ranks is not None:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.update(kwargs.pop("env", {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=kwargs.pop("cwd", ROOT),
                          env=env, **kwargs)


@pytest.fixture
def cli():
    return run_cli
