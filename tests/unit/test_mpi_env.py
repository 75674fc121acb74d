"""ssdmpi/comm/mpi_env.py: the MPI settings ssdmpi makes for itself, and that a user's value wins."""

import os
import subprocess
import sys

from ssdmpi.comm import mpi_env


def test_defaults_fill_in_only_what_is_unset():
    environ = {"MPIR_CVAR_CH4_NUM_VCIS": "1", "OTHER": "x"}
    mpi_env.apply(environ)
    assert environ == {"MPIR_CVAR_CH4_NUM_VCIS": "1", "OTHER": "x"}      # the user's value stays
    empty = {}
    mpi_env.apply(empty)
    assert empty == mpi_env.DEFAULTS


def test_importing_ssdmpi_sets_them_before_mpi_starts():
    """A fresh interpreter: after ``import ssdmpi`` the variables are in the environment MPI reads."""
    env = {k: v for k, v in os.environ.items() if k not in mpi_env.DEFAULTS}
    code = "import os, ssdmpi; print(os.environ.get('MPIR_CVAR_CH4_NUM_VCIS'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == mpi_env.DEFAULTS["MPIR_CVAR_CH4_NUM_VCIS"]
