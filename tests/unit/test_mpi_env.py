"""ssdmpi/comm/mpi_env.py: the MPI settings ssdmpi makes for itself, and that a user's value wins."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ssdmpi.comm import mpi_env


def test_defaults_fill_in_only_what_is_unset():
    environ = {"MPIR_CVAR_CH4_NUM_VCIS": "1", "OTHER": "x"}
    mpi_env.apply(environ)
    assert environ == dict(mpi_env.DEFAULTS, MPIR_CVAR_CH4_NUM_VCIS="1", OTHER="x")   # the user's value stays
    empty = {}
    mpi_env.apply(empty)
    assert empty == mpi_env.DEFAULTS


def test_importing_ssdmpi_sets_them_before_mpi_starts():
    """A fresh interpreter: after ``import ssdmpi`` the variables are in the environment MPI reads."""
    env = {k: v for k, v in os.environ.items() if k not in mpi_env.DEFAULTS}
    code = f"import os, ssdmpi; print([os.environ.get(k) for k in {sorted(mpi_env.DEFAULTS)!r}])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([mpi_env.DEFAULTS[k] for k in sorted(mpi_env.DEFAULTS)])


def ompi_tcp_params(env: dict) -> dict:
    """``{name: (value, source)}`` of the TCP transport's parameters, as this environment's Open MPI
    (``ompi_info``, beside this Python) reads them with ``env``."""
    out = subprocess.run([str(Path(sys.executable).parent / "ompi_info"), "--param", "btl", "tcp", "--level", "9",
                          "--parsable"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    params = {}
    for line in out.stdout.splitlines():
        parts = line.split(":", 6)
        if len(parts) == 7 and parts[3] == "param" and parts[5] in ("value", "source"):
            value, source = params.get(parts[4], (None, None))
            params[parts[4]] = (parts[6], source) if parts[5] == "value" else (value, parts[6])
    return params


@pytest.mark.skipif(not (Path(sys.executable).parent / "ompi_info").exists(),
                    reason="Open MPI is not this environment's MPI (no ompi_info beside python)")
def test_open_mpi_takes_the_tcp_settings_and_they_are_its_default_flags_less_put():
    """``put`` is what queues a whole large message ahead of a control message (mpi_env's
    docstring); nothing else of the library's own default flags is dropped, and Open MPI parses
    both values as given."""
    bare = {k: v for k, v in os.environ.items() if k not in mpi_env.DEFAULTS}
    default = ompi_tcp_params(bare)["btl_tcp_flags"][0].split(",")
    ours = mpi_env.DEFAULTS["OMPI_MCA_btl_tcp_flags"].split(",")
    assert "put" in default and sorted(ours) == sorted(set(default) - {"put"})
    seen = ompi_tcp_params(dict(bare, **mpi_env.DEFAULTS))
    assert seen["btl_tcp_flags"] == (mpi_env.DEFAULTS["OMPI_MCA_btl_tcp_flags"], "environment"), seen["btl_tcp_flags"]
    assert seen["btl_tcp_max_send_size"] == ("524288", "environment"), seen["btl_tcp_max_send_size"]
