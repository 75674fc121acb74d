"""ssdmpi/comm/mpi_env.py: the MPI settings ssdmpi makes for itself, and that a user's value wins."""

import json
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


def test_importing_ssdmpi_leaves_the_environment_alone():
    """A fresh interpreter: ``import ssdmpi`` (and the comm layer) edits no variable and starts no MPI."""
    env = {k: v for k, v in os.environ.items() if k not in mpi_env.DEFAULTS}
    code = ("import os, sys; before = dict(os.environ); import ssdmpi, ssdmpi.comm.communicator; "
            "print(dict(os.environ) == before, 'mpi4py.MPI' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


# Runs MODULE as ``python -m MODULE ARGS`` after installing an import hook that records, at the
# moment ``mpi4py.MPI`` is imported (which initialises MPI), what the environment holds then.
SPY = """import json, os, runpy, sys
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "mpi4py.MPI":
            with open({out!r}, "w") as f:
                json.dump({{k: os.environ.get(k) for k in {names!r}}}, f)
        return None
sys.meta_path.insert(0, Spy())
sys.argv = [{module!r}] + {args!r}
runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
"""

WAYS_INTO_MPI = {   # (module, arguments): every kind of entry point that starts MPI
    "ssdmpi info": ("ssdmpi", ["info", "--json"]),
    "ssdmpi train": ("ssdmpi", ["train", "--model", "mlp", "--steps", "2", "--warmup-steps", "1", "--eval-every",
                                "0", "--no-progress-bar", "--run-dir", "{tmp}/run"]),
    "ssdmpi bench comm": ("ssdmpi", ["bench", "comm", "--parts", "bandwidth", "--sizes", "1K", "--repeats", "1"]),
    "gpucheck ranks": ("ssdmpi.gpucheck.ranks", ["overlap", "{tmp}/part.json", "--numpy"]),
}


@pytest.mark.parametrize("way", sorted(WAYS_INTO_MPI))
def test_every_way_into_mpi_has_the_settings_when_mpi_starts(tmp_path, way):
    module, args = WAYS_INTO_MPI[way]
    names = sorted(mpi_env.DEFAULTS)
    out = tmp_path / "seen.json"
    code = SPY.format(out=str(out), names=names, module=module, args=[a.format(tmp=tmp_path) for a in args])
    env = {k: v for k, v in os.environ.items() if k not in mpi_env.DEFAULTS}
    env["MPIR_CVAR_CH4_NUM_VCIS"] = "1"          # a value the user set: it stays
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(out.read_text()) == dict(mpi_env.DEFAULTS, MPIR_CVAR_CH4_NUM_VCIS="1")


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
