"""``bin/ssdmpi-cluster`` itself: bad input, isolation, ``run`` and ``down`` leave nothing behind.

The bad-input and missing-root checks run anywhere; the rest need root and iproute2.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ssdmpi.cluster import Cluster, cli, nodes
from tests.cluster.conftest import TOOL, host_links, leftovers, skip_reason, unique_name, wait_until

ENV = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")


def tool(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(TOOL), *args], check=False, capture_output=True, text=True, timeout=timeout, env=ENV)


@pytest.mark.parametrize("args", [
    ["up", "--nodes", "0"],
    ["up", "--nodes", "two"],
    ["up", "--nodes", "2", "--nic", "fast"],
    ["up", "--nodes", "2", "--latency", "-1"],
    ["--name", "Bad_Name", "up", "--nodes", "2"],
    ["up"],
    ["launch"],
    ["up", "--nodes", "2", "--", "true"],
    ["--name", "tnotup", "exec", "n0", "--", "true"],
    ["--name", "tnotup", "mpirun", "--ranks-per-node", "1", "--", "true"],
])
def test_bad_input_is_one_line_and_exit_2(args):
    r = tool(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("ssdmpi-cluster: "), r.stderr
    assert "Traceback" not in r.stderr


def test_without_root_or_iproute2_it_says_so(monkeypatch, capsys):
    monkeypatch.setattr(nodes.os, "geteuid", lambda: 1000)
    assert cli.main(["--name", "tx", "up", "--nodes", "1"]) == 2
    assert "needs root" in capsys.readouterr().err
    monkeypatch.setattr(nodes.os, "geteuid", lambda: 0)
    monkeypatch.setattr(nodes.shutil, "which", lambda name, path=None: None if name == "tc" else "/x")
    assert cli.main(["--name", "tx", "status"]) == 2
    err = capsys.readouterr().err
    assert "needs iproute2" in err and "missing tc" in err and len(err.strip().splitlines()) == 1


needs_root = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@needs_root
def test_nodes_are_isolated_from_the_host(ns_cluster):
    node = ns_cluster.nodes[1]
    assert host_links() == ns_cluster.host_links_before, "a cluster link appeared in the host's namespace"

    def on(node, *cmd):
        return subprocess.run(ns_cluster.enter(node, list(cmd)), check=False, capture_output=True, text=True,
                              timeout=30).stdout
    assert on(node, "hostname").strip() == node.host
    assert on(node, "ip", "route", "show", "default").strip() == "", "a node has a default route"
    assert on(node, "ip", "-o", "-4", "addr", "show").split().count("inet") == 2      # lo and eth0 only
    assert f"{ns_cluster.nodes[0].addr} {ns_cluster.nodes[0].host}" in on(node, "cat", "/etc/hosts")
    with open("/etc/hosts") as f:
        assert ns_cluster.nodes[0].host not in f.read(), "the host's /etc/hosts was written"
    r = tool("--name", ns_cluster.name, "exec", "n7", "--", "true")
    assert r.returncode == 2 and "unknown node 'n7'" in r.stderr
    # the name is taken: refused, and the running cluster survives (run must not take it down)
    for args in (["up", "--nodes", "1"], ["run", "--nodes", "1", "--ranks-per-node", "1", "--", "true"]):
        r = tool("--name", ns_cluster.name, *args)
        assert r.returncode == 2 and "is already up" in r.stderr, r.stderr
    ns_cluster.check_alive()
    assert "10.77.0." not in subprocess.run(["ip", "-o", "addr"], check=False, capture_output=True, text=True).stdout


@needs_root
def test_run_starts_ranks_on_every_node_and_down_leaves_nothing():
    name, links = unique_name("r"), host_links()
    hello = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; h = c.gather(socket.gethostname()); "
             "c.rank == 0 and print('hosts', *h)")
    r = tool("--name", name, "run", "--nodes", "2", "--ranks-per-node", "1", "--nic", "100mbit", "--",
             sys.executable, "-c", hello)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"hosts {name}-n0 {name}-n1" in r.stdout
    assert not leftovers(Cluster(name, 2), links)
    for _ in range(2):       # down is safe to repeat, and on a cluster that was never up
        d = tool("--name", name, "down")
        assert d.returncode == 0 and "not up" in d.stdout, d.stdout + d.stderr


def sleepers(cluster, node) -> list[int]:
    """The test's ranks (``time.sleep(120)``) running on ``node``."""
    found = []
    for pid in cluster.pids(node):
        try:
            if b"time.sleep(120)" in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(pid)
        except OSError:
            pass
    return found


@needs_root
def test_sigterm_to_run_takes_the_cluster_down():
    name, links = unique_name("s"), host_links()
    proc = subprocess.Popen([str(TOOL), "--name", name, "run", "--nodes", "2", "--ranks-per-node", "1", "--",
                             sys.executable, "-c", "import time; time.sleep(120)"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=ENV)
    try:
        cluster = Cluster(name, 2)
        wait_until(lambda: all(sleepers(cluster, n) for n in cluster.nodes), 60, "a rank on every node")
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        left = leftovers(cluster, links)       # before the safety net below
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        Cluster(name, 2).down()
    assert proc.returncode != 0
    assert not left, f"run left behind after SIGTERM: {left}"


@needs_root
def test_a_node_whose_holder_died_is_reported_not_entered():
    name, links = unique_name("h"), host_links()
    cluster = Cluster(name, 2)
    try:
        cluster.up()
        os.kill(cluster.nodes[1].pid, signal.SIGKILL)
        wait_until(lambda: not cluster.pids(cluster.nodes[1]), 10, "the holder to end")
        r = tool("--name", name, "exec", "n0", "--", "true")
        assert r.returncode == 2 and f"node {name}-n1 of cluster {name} is gone" in r.stderr, r.stderr
        assert "HOLDER GONE" in tool("--name", name, "status").stdout
    finally:
        cluster.down()
    assert not leftovers(cluster, links)
