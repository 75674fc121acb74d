"""MPICH's ``mpiexec`` (hydra) across a namespaced cluster's nodes.

``mpiexec`` itself runs on node 0, like on a login node: its proxies must reach it over
the cluster's network, which the host's namespace is not on. It starts node 0's proxy
itself and the other nodes' through its ``ssh`` launcher, with ``-launcher-exec`` set to
the cluster's ``launch`` script (``Cluster.launcher``, written by ``ssdmpi.cluster.nodes``):
it takes hydra's ``ssh``-style arguments (options, host, command), and runs the command with
``sh -c`` inside the named node's namespaces, as sshd would. Each node's proxy is a separate
hydra host, so MPICH maps ranks to nodes by proxy: ranks on one node share memory, ranks on
different nodes talk TCP (libfabric's ``tcp`` provider, pinned to the NIC ``eth0``) through
the veths and their rate limits.
"""

from __future__ import annotations

import os
import shlex
import shutil

from ssdmpi.cluster.nodes import NIC, Cluster, ClusterError

# ch4:ofi with libfabric's TCP provider, bound to the node's NIC (lo would be advertised too).
TCP_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": NIC}

def mpiexec_argv(cluster: Cluster, ranks_per_node: int, cmd: list[str], nodes: int | None = None,
                 cwd: str | None = None) -> list[str]:
    """The argv that starts ``cmd`` as ``ranks_per_node`` ranks on each of the first ``nodes``
    nodes (default: all), block-wise (ranks 0..R-1 on node 0, ...), in ``cwd`` (default: ours);
    run it with :func:`mpi_env`."""
    nodes = len(cluster.nodes) if nodes is None else nodes
    if not 1 <= nodes <= len(cluster.nodes):
        raise ClusterError(f"--nodes must be between 1 and {len(cluster.nodes)} (the cluster's size), not {nodes}")
    if ranks_per_node < 1:
        raise ClusterError(f"--ranks-per-node must be at least 1, not {ranks_per_node}")
    if not cmd:
        raise ClusterError("no command given: ssdmpi-cluster ... -- COMMAND [ARGS...]")
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        raise ClusterError("mpiexec not found on PATH: put MPICH's (hydra) first, "
                           "e.g. export PATH=/work/venv/bin:$PATH")
    hosts = ",".join(f"{n.host}:{ranks_per_node}" for n in cluster.nodes[:nodes])
    inner = [mpiexec, "-launcher", "ssh", "-launcher-exec", str(cluster.launcher), "-hosts", hosts,
             "-n", str(nodes * ranks_per_node), *cmd]
    return cluster.enter(cluster.nodes[0], inner, cwd)


def mpi_env(base: dict | None = None) -> dict:
    """``base`` (default: this environment) with MPI forced onto TCP between nodes."""
    env = dict(os.environ if base is None else base)
    env.update(TCP_ENV)
    return env


def describe(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
