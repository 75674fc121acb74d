"""Starting benchmarks under MPI: the launcher, the throttled-network wrapper, relaunching.

Shared by every ``ssdmpi bench`` module that runs ranks: ``mpiexec()`` finds the launcher,
``check_network(net)`` checks that ``bin/ssdmpi-netns`` can throttle a private network,
``under_launcher()`` tells whether this process is already an MPI rank, and
``relaunch(...)`` runs the same command line again under ``[ssdmpi-netns --] mpiexec``.

Across nodes (``--nodes N``, ``add_node_arguments``): the ranks run on a namespaced cluster
(``bin/ssdmpi-cluster``, docs/CLUSTER.md) of N nodes with R ranks each, every node's NIC
limited to ``--net`` in each direction, instead of in one namespace:
``cluster_command(...)`` is ``ssdmpi-cluster --name ssdmpi-bench run --nodes N
--ranks-per-node R --nic RATE -- CMD`` (up, run, down: the cluster is gone when it returns).
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
CLUSTER = ROOT / "bin" / "ssdmpi-cluster"
CLUSTER_NAME = "ssdmpi-bench"      # the benchmarks' cluster: never one a test or a user brought up


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
    """This environment with one BLAS/OpenMP thread per rank unless the caller chose otherwise: for
    the namespaced cluster only, whose "nodes" all run on this machine's cores (each rank would see
    every core as its node's). In one namespace the ranks launch as users launch them, and
    ``comm/node.py`` gives each its share of the host's cores."""
    return dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))


def relaunch_command(argv: list, ranks: int, net: str) -> list:
    """``[ssdmpi-netns --rate NET --] mpiexec -n RANKS python -m ssdmpi ARGV`` (no wrapper for ``none``)."""
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "ssdmpi"] + list(argv)
    return cmd if net == "none" else [str(NETNS), "--rate", net, "--"] + cmd


def relaunch(label: str, ranks: int, net: str, timeout: float, argv: list | None = None,
             nodes: int | None = None) -> int:
    """Run this same command again (``argv``, default ``sys.argv[1:]``) under the launcher; its exit code.

    With ``nodes``: on a namespaced cluster of that many nodes, ``ranks / nodes`` ranks each.
    The relaunched ranks see the launcher's environment (``under_launcher()`` is true), so
    they measure instead of relaunching again.
    """
    argv = sys.argv[1:] if argv is None else argv
    if nodes is None:
        check_network(net)
        cmd, env = relaunch_command(argv, ranks, net), dict(os.environ)
    else:
        check_cluster()
        cmd = cluster_command([sys.executable, "-m", "ssdmpi"] + list(argv), nodes, ranks // nodes, net)
        env = cluster_env()
    print(f"[{label}] {shlex.join(cmd)}", file=sys.stderr, flush=True)
    rc = run_bounded(cmd, env, timeout, cluster=nodes is not None)
    if rc == "timeout":
        raise UserError(f"{label} did not finish within --timeout {timeout:g} s")
    return rc


def run_bounded(cmd: list, env: dict, timeout: float, stdout=None, cluster: bool = False):
    """Run ``cmd`` from the repository root; its exit status, or ``"timeout"`` after ``timeout`` s.

    On a timeout the command gets SIGTERM (``ssdmpi-cluster run`` then takes its cluster
    down itself), SIGKILL 30 s later, and with ``cluster`` the benchmarks' cluster is taken
    down once more (idempotent), so no namespace outlives the run.
    """
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=stdout, stderr=subprocess.STDOUT if stdout else None)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return "timeout"
    finally:
        if cluster:
            subprocess.run([sys.executable, str(CLUSTER), "--name", CLUSTER_NAME, "down"], capture_output=True,
                           timeout=120, check=False)


# ----------------------------------------------------------------------------- across nodes

def add_node_arguments(parser) -> None:
    """``--nodes N`` and ``--ranks-per-node R`` (the NIC rate is the command's ``--net``)."""
    parser.add_argument("--nodes", type=int, default=None, metavar="N",
                        help="run the ranks on a namespaced cluster of N nodes (bin/ssdmpi-cluster, "
                             "docs/CLUSTER.md), each node's NIC limited to --net each way, instead of in "
                             "one namespace (default: one namespace)")
    parser.add_argument("--ranks-per-node", type=int, default=None, metavar="R",
                        help="with --nodes: ranks per node (default 1); the ranks are N x R")


def node_ranks(args, default_ranks: int) -> int:
    """Check ``--nodes`` / ``--ranks-per-node`` / ``--ranks`` together; the number of ranks.

    ``args.ranks`` None means not given. ``UserError`` (one line) on a bad combination.
    """
    if args.nodes is None:
        if args.ranks_per_node is not None:
            raise UserError("--ranks-per-node needs --nodes N (ranks on a namespaced cluster)")
        return default_ranks if args.ranks is None else args.ranks
    if args.nodes < 1:
        raise UserError(f"--nodes must be a positive number of nodes, got {args.nodes}")
    per_node = 1 if args.ranks_per_node is None else args.ranks_per_node
    if per_node < 1:
        raise UserError(f"--ranks-per-node must be >= 1, got {per_node}")
    if args.ranks is not None and args.ranks != args.nodes * per_node:
        raise UserError(f"--ranks {args.ranks} contradicts --nodes {args.nodes} x --ranks-per-node {per_node}; "
                        "give --nodes and --ranks-per-node only")
    return args.nodes * per_node


def nic_rate(net: str) -> str:
    """The cluster's ``--nic`` for a command's ``--net`` (``none``: unlimited NICs)."""
    return "unlimited" if net == "none" else net


def check_cluster() -> None:
    """Raise ``UserError`` unless a namespaced cluster can be made (root, iproute2, util-linux, the tool)."""
    from ssdmpi.cluster.nodes import ClusterError, check_host

    if not CLUSTER.exists():
        raise UserError(f"--nodes needs {CLUSTER} (the namespaced cluster); leave --nodes out for one namespace")
    try:
        check_host()
    except ClusterError as exc:
        raise UserError(f"--nodes: {CLUSTER.name} {exc}; or leave --nodes out") from None


def cluster_command(cmd: list, nodes: int, ranks_per_node: int, net: str) -> list:
    """``ssdmpi-cluster run ... -- CMD``: ``cmd`` (no ``mpiexec``: the tool launches it) as
    ``ranks_per_node`` ranks on each of ``nodes`` nodes, NICs at ``net``."""
    return [sys.executable, str(CLUSTER), "--name", CLUSTER_NAME, "run", "--nodes", str(nodes),
            "--ranks-per-node", str(ranks_per_node), "--nic", nic_rate(net), "--"] + list(cmd)


def cluster_env(base: dict | None = None) -> dict:
    """``base`` (default: ``single_threaded_env()``) with this Python's directory first on PATH:
    the cluster starts the ``mpiexec`` it finds there (the virtualenv's MPICH)."""
    env = dict(single_threaded_env() if base is None else base)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env
