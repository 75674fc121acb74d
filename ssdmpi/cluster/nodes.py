"""Bring a namespaced cluster up, find it again, enter its nodes, take it down.

Cluster NAME with N nodes (every name carries the prefix, so clusters coexist):

- network namespace ``NAME-sw``, the switch: a bridge ``br0`` whose ports ``n0``..``n{N-1}``
  are the switch ends of the nodes' veth pairs; no address, no route, no host interface;
- network namespace ``NAME-nI`` per node: ``lo`` and ``eth0`` (the NIC, 10.77.0.(I+1)/24, no
  default route), with a ``tc tbf`` rate limit on ``eth0`` (the node's egress) and another on
  the switch port ``nI`` (the node's ingress), so the node's NIC is its bottleneck;
- a holder process per node, ``sleep infinity`` inside ``NAME-nI`` with its own UTS namespace
  (host name ``NAME-nI``) and mount namespace (the cluster's hosts file bind-mounted on
  ``/etc/hosts``; every other mount is the host's, so files are shared like on NFS).
  Entering a node means ``nsenter`` into the holder's net, UTS and mount namespaces
  (``/sys`` stays the host's, cgroups included);
- state under ``/run/ssdmpi-cluster/NAME/`` (``SSDMPI_CLUSTER_STATE`` overrides the root):
  ``state.json``, ``hosts``, and ``launch``: ``launch [options] HOST COMMAND...`` runs COMMAND on
  node HOST, with ssh's arguments, so that MPICH's hydra can use it as its ``ssh`` launcher
  (:mod:`ssdmpi.cluster.mpi`).

:meth:`Cluster.down` kills every process in the cluster's namespaces, deletes the namespaces
(which deletes the veths and the bridge with them) and the state directory; it also finds
namespaces named like the cluster's when the state is gone, so it is always safe to repeat.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_ROOT = Path(os.environ.get("SSDMPI_CLUSTER_STATE", "/run/ssdmpi-cluster"))
SUBNET = "10.77.0"          # a private /24 that exists only inside the cluster's namespaces
NIC = "eth0"                # every node's NIC has this name inside its own namespace
MAX_NODES = 200
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
RATE_UNIT = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
             "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
TOOLS = ("ip", "tc", "nsenter", "unshare", "mount")
HOLDER = 'hostname "$1" && mount --bind "$2" /etc/hosts && : > "$3" && exec sleep infinity'
LAUNCH = """#!/bin/sh
# hydra's "ssh" for cluster {name}: launch [-x|-q|...] HOST COMMAND... runs COMMAND on HOST
# (written by ssdmpi-cluster up; node -> holder pid, see ssdmpi/cluster/nodes.py)
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
[ $# -ge 2 ] || {{ echo "launch: usage: launch [options] HOST COMMAND" >&2; exit 255; }}
host=$1; shift
case "$host" in
{cases}
    *) echo "launch: $host is not a node of cluster {name}" >&2; exit 255 ;;
esac
exec nsenter -t "$pid" -n -u -m --wd="$PWD" -- sh -c "$*"
"""


class ClusterError(Exception):
    """Something the user can fix (bad input, missing root or tools): one line, exit 2."""


def rate_bits(rate: str) -> float | None:
    """Bits per second of a tc rate such as ``1gbit`` or ``100mbit``; None for ``unlimited``."""
    if rate == "unlimited":
        return None
    m = RATE_RE.match(rate.lower())
    if not m or float(m.group(1)) <= 0:
        raise ClusterError(f"bad NIC rate {rate!r}: write a tc rate such as 100mbit, 1gbit, 10gbit, or unlimited")
    return float(m.group(1)) * RATE_UNIT[m.group(2)]


def check_host() -> None:
    """Raise unless we are root and have iproute2 and util-linux's namespace tools."""
    if os.geteuid() != 0:
        raise ClusterError("needs root to create namespaces and links (run it as root, e.g. with sudo)")
    missing = [t for t in TOOLS if shutil.which(t, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    if missing:
        raise ClusterError(f"needs iproute2 and util-linux (missing {', '.join(missing)}): "
                           "apt-get install iproute2 util-linux")


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one ip/tc command; raise :class:`ClusterError` with its last error line if it fails."""
    r = subprocess.run(list(cmd), check=False, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        raise ClusterError(f"{' '.join(cmd)}: {why}")
    return r


def netns_inode(netns: str) -> int | None:
    """The inode of a named network namespace (``ip netns``), or None if it does not exist."""
    try:
        return os.stat(f"/run/netns/{netns}").st_ino
    except OSError:
        return None


def pids_in(inodes: set[int]) -> list[int]:
    """Processes whose network namespace is one of ``inodes`` (zombies have none: skipped)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.stat(proc / "ns" / "net").st_ino in inodes:
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


@dataclass
class Node:
    """One node: its index, host name (= Slurm node name), address, namespace, holder pid."""

    index: int
    host: str
    addr: str
    netns: str
    pid: int = 0


class Cluster:
    """A cluster's plan and, once up, its live state (see the module docstring)."""

    def __init__(self, name: str, n: int, nic: str = "unlimited", latency_ms: float = 10.0):
        if not NAME_RE.match(name) or name.endswith("-"):
            raise ClusterError(f"bad cluster name {name!r}: lower-case letters, digits and '-', "
                               "starting with a letter, at most 24 characters")
        if not 1 <= n <= MAX_NODES:
            raise ClusterError(f"--nodes must be between 1 and {MAX_NODES}, not {n}")
        rate_bits(nic)
        if not latency_ms > 0:
            raise ClusterError(f"--latency must be a positive number of milliseconds, not {latency_ms}")
        self.name, self.nic, self.latency_ms = name, nic, latency_ms
        self.dir = STATE_ROOT / name
        self.launcher = self.dir / "launch"   # ``launch HOST COMMAND...`` runs COMMAND on node HOST
        self.switch = f"{name}-sw"
        self.nodes = [Node(i, f"{name}-n{i}", f"{SUBNET}.{i + 1}", f"{name}-n{i}") for i in range(n)]

    # ---- finding a cluster ---------------------------------------------------------

    @classmethod
    def load(cls, name: str) -> Cluster:
        """The cluster ``name`` as recorded by :meth:`up`; ClusterError if it is not up."""
        path = STATE_ROOT / name / "state.json"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            raise ClusterError(f"cluster {name!r} is not up (no {path}): start it with "
                               f"`ssdmpi-cluster --name {name} up --nodes N`") from None
        self = cls(name, len(state["nodes"]), state["nic"], state["latency_ms"])
        self.nodes = [Node(**n) for n in state["nodes"]]
        return self

    def node(self, ref: str) -> Node:
        """A node by index (``1``), short name (``n1``), host name or address."""
        for node in self.nodes:
            if ref in (str(node.index), f"n{node.index}", node.host, node.addr):
                return node
        raise ClusterError(f"unknown node {ref!r}: cluster {self.name} has nodes 0-{len(self.nodes) - 1} "
                           f"({self.nodes[0].host} .. {self.nodes[-1].host})")

    # ---- up --------------------------------------------------------------------------

    def up(self) -> None:
        """Create switch, nodes, links, rate limits and holders; record the state. On any
        failure, take down what was made and re-raise."""
        self.check_free()
        try:
            self.dir.mkdir(parents=True)
            (self.dir / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
                f"{n.addr} {n.host} n{n.index}\n" for n in self.nodes))
            sh("ip", "netns", "add", self.switch)
            sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for node in self.nodes:
                self._make_node(node)
            for node in self.nodes:
                node.pid = self._start_holder(node)
            self._write_launcher()     # it needs the holders' pids
            self._save()
        except BaseException:
            self.down()
            raise

    def check_free(self) -> None:
        """Raise unless we may create this cluster (root, tools, and the name not in use)."""
        check_host()
        if self.dir.exists() or netns_inode(self.switch) is not None:
            raise ClusterError(f"cluster {self.name!r} is already up: `ssdmpi-cluster --name {self.name} down` "
                               "it first, or pick another --name")

    def _make_node(self, node: Node) -> None:
        port = f"n{node.index}"
        sh("ip", "netns", "add", node.netns)
        # created straight into the two namespaces: no veth end ever sits in the host's
        sh("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", NIC, "netns", node.netns)
        sh("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
        sh("ip", "-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", NIC)
        sh("ip", "-n", node.netns, "link", "set", NIC, "up")
        sh("ip", "-n", node.netns, "link", "set", "lo", "up")
        self._limit(node.netns, NIC)       # what the node sends
        self._limit(self.switch, port)     # what the switch sends to the node

    def _limit(self, netns: str, dev: str) -> None:
        bits = rate_bits(self.nic)
        if bits is None:
            return
        burst = max(256 * 1024, int(bits / 8 / 100))      # >= 10 ms of traffic: tbf needs rate/HZ
        sh("tc", "-n", netns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.nic,
           "burst", str(burst), "latency", f"{self.latency_ms}ms")

    def _start_holder(self, node: Node) -> int:
        ready = self.dir / f"ready-{node.index}"
        # nsenter, not `ip netns exec`: that remounts /sys, which hides the host's cgroup
        # mounts from the node (slurmd needs them); /sys/class/net shows the host's links.
        with open(self.dir / f"holder-{node.index}.log", "wb") as log:
            proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--uts", "--mount",
                                     "--propagation", "private", "sh", "-c", HOLDER, "holder", node.host,
                                     str(self.dir / "hosts"), str(ready)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 15
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                text = (self.dir / f"holder-{node.index}.log").read_text(errors="replace").strip()
                raise ClusterError(f"node {node.host} did not start: {text or 'timed out'}")
            time.sleep(0.02)
        return proc.pid

    def _write_launcher(self) -> None:
        """Write ``launcher`` (the holders must be up: it enters a node through its holder)."""
        cases = "\n".join(f"    {n.host}|n{n.index}|{n.addr}) pid={n.pid} ;;" for n in self.nodes)
        self.launcher.write_text(LAUNCH.format(name=self.name, cases=cases))
        self.launcher.chmod(0o755)

    def _save(self) -> None:
        state = {"name": self.name, "nic": self.nic, "latency_ms": self.latency_ms,
                 "switch": self.switch, "nodes": [asdict(n) for n in self.nodes]}
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.dir / "state.json")

    # ---- using it ----------------------------------------------------------------------

    def enter(self, node: Node, cmd: list[str], cwd: str | None = None) -> list[str]:
        """The argv that runs ``cmd`` on ``node`` (its network, host name and /etc/hosts)."""
        return ["nsenter", "-t", str(node.pid), "-n", "-u", "-m", f"--wd={cwd or os.getcwd()}", "--", *cmd]

    def pids(self, node: Node) -> list[int]:
        """Every process on ``node`` (in its network namespace), the holder included."""
        ino = netns_inode(node.netns)
        return pids_in({ino}) if ino is not None else []

    def nic_bytes(self, node: Node) -> tuple[int, int]:
        """Bytes through the node's NIC queues so far: (sent by the node, sent to the node),
        from ``tc -s`` on ``eth0`` and on its switch port (0 without a rate limit)."""
        def sent(netns, dev):
            out = sh("tc", "-s", "-n", netns, "qdisc", "show", "dev", dev).stdout
            m = re.search(r"Sent (\d+) bytes", out)
            return int(m.group(1)) if m else 0
        return sent(node.netns, NIC), sent(self.switch, f"n{node.index}")

    def status(self) -> str:
        lines = [(f"cluster {self.name}: {len(self.nodes)} node(s), NIC {self.nic} each way "
                  f"(tbf latency {self.latency_ms:g} ms), switch netns {self.switch}, state {self.dir}")]
        for n in self.nodes:
            alive = "up" if self._holder_alive(n) else "HOLDER GONE"
            tx, rx = self.nic_bytes(n)
            lines.append(f"  {n.host}  {n.addr}  netns {n.netns}  holder {n.pid} ({alive})  "
                         f"sent {tx} B  received {rx} B")
        return "\n".join(lines)

    def check_alive(self) -> None:
        """Raise unless every node's holder is still there (entering a node goes through it)."""
        for node in self.nodes:
            if not self._holder_alive(node):
                raise ClusterError(f"node {node.host} of cluster {self.name} is gone (its holder process "
                                   f"{node.pid} ended): `ssdmpi-cluster --name {self.name} down`, then up again")

    def _holder_alive(self, node: Node) -> bool:
        """The recorded holder still exists and still sits in the node's namespace (no pid reuse)."""
        try:
            return os.stat(f"/proc/{node.pid}/ns/net").st_ino == netns_inode(node.netns)
        except OSError:
            return False

    # ---- down ----------------------------------------------------------------------------

    def namespaces(self) -> list[str]:
        """This cluster's namespaces that exist now: recorded ones and any named like them."""
        names = {self.switch, *(n.netns for n in self.nodes)}
        listed = sh("ip", "netns", "list", check=False).stdout.split("\n")
        pattern = re.compile(rf"^{re.escape(self.name)}-(sw|n\d+)$")
        names.update(line.split()[0] for line in listed if line.split() and pattern.match(line.split()[0]))
        return sorted(n for n in names if netns_inode(n) is not None)

    def down(self) -> bool:
        """Kill every process in the cluster's namespaces, delete them and the state.
        Returns whether there was anything to remove."""
        namespaces = self.namespaces()
        found = bool(namespaces) or self.dir.exists()
        inodes = {netns_inode(ns) for ns in namespaces} - {None}
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            pids = pids_in(inodes)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while pids and time.monotonic() < deadline:
                time.sleep(0.05)
                pids = pids_in(inodes)
            if not pids:
                break
        for ns in namespaces:     # a node's namespace takes its veth pair along, the switch its bridge
            sh("ip", "netns", "delete", ns, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        return found
