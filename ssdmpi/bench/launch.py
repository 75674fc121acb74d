"""Starting benchmarks under MPI: the launcher, the throttled-network wrapper, relaunching.

Shared by every ``ssdmpi bench`` module that runs ranks: ``mpiexec()`` finds the launcher,
``check_network(net)`` checks that ``bin/ssdmpi-netns`` can throttle a private network,
``under_launcher()`` tells whether this process is already an MPI rank, and
``relaunch(...)`` runs the same command line again under ``[ssdmpi-netns --] mpiexec``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from ssdmpi.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
NETNS = ROOT / "bin" / "ssdmpi-netns"


def mpiexec() -> str:
    """The ``mpiexec`` beside this Python (a virtualenv's MPI wheel), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


def check_network(net: str) -> None:
    """Raise ``UserError`` unless a throttled namespace can be made (root, iproute2, the launcher)."""
    if net == "none":
        return
    if not NETNS.exists():
        raise UserError(f"--net {net} needs {NETNS} (the throttled-network launcher); use --net none for shared memory")
    if os.geteuid() != 0:
        raise UserError(f"--net {net} needs root (a private network namespace and tc); run as root or use --net none")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise UserError(f"--net {net} needs iproute2 ({' and '.join(missing)} not found: apt-get install iproute2); "
                        "or use --net none")


def parse_rate(net: str):
    """Bits per second of a tc rate like ``1gbit``, ``100mbit``, ``500kbit`` (None for ``none``)."""
    if net == "none":
        return None
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, scale in units.items():
        if net.lower().endswith(unit):
            try:
                value = float(net[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * scale
            break
    raise UserError(f"--net {net!r}: give a tc rate such as 1gbit or 100mbit, or 'none'")


def under_launcher() -> bool:
    """Started by an MPI launcher or by srun (a Slurm batch script's own shell has SLURM_PROCID too,
    but no numeric SLURM_STEP_ID)."""
    if any(name in os.environ for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")):
        return True
    return "SLURM_PROCID" in os.environ and os.environ.get("SLURM_STEP_ID", "").isdigit()


def single_threaded_env() -> dict:
    """This environment with one BLAS/OpenMP thread per rank unless the caller chose otherwise."""
    return dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))


def relaunch_command(argv: list, ranks: int, net: str) -> list:
    """``[ssdmpi-netns --rate NET --] mpiexec -n RANKS python -m ssdmpi ARGV`` (no wrapper for ``none``)."""
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "ssdmpi"] + list(argv)
    return cmd if net == "none" else [str(NETNS), "--rate", net, "--"] + cmd


def relaunch(label: str, ranks: int, net: str, timeout: float, argv: list | None = None) -> int:
    """Run this same command again (``argv``, default ``sys.argv[1:]``) under the launcher; its exit code.

    The relaunched ranks see the launcher's environment (``under_launcher()`` is true), so
    they measure instead of relaunching again.
    """
    check_network(net)
    cmd = relaunch_command(sys.argv[1:] if argv is None else argv, ranks, net)
    print(f"[{label}] {shlex.join(cmd)}", file=sys.stderr, flush=True)
    try:
        return subprocess.run(cmd, env=single_threaded_env(), cwd=ROOT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        raise UserError(f"{label} did not finish within --timeout {timeout:g} s") from None
