"""bin/ssdmpi-netns: a private, rate-limited loopback for MPI ranks, always cleaned up.

The namespace tests need root and iproute2 (the development machine and CI have both);
they skip with a reason elsewhere. The refusal paths are tested by hiding ``ip``/``tc`` or
faking a non-root ``id`` on PATH.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, mpiexec

SCRIPT = str(ROOT / "bin" / "ssdmpi-netns")
CAN_NETNS = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
needs_netns = pytest.mark.skipif(not CAN_NETNS, reason="needs root and iproute2 (ip, tc)")


def netns(*args, timeout=60, env=None):
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def namespace_name(stderr: str) -> str:
    return re.search(r"network namespace (ssdmpi-\d+-\d+)", stderr).group(1)


def fake_path(tmp_path, tools: dict) -> str:
    """A PATH holding only the named tools: real ones (value None) or shell-script fakes."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in tools.items():
        target = bindir / name
        if body is None:
            target.symlink_to(shutil.which(name))
        else:
            target.write_text("#!/bin/sh\n" + body + "\n")
            target.chmod(0o755)
    return str(bindir)


def test_refuses_without_root(tmp_path):
    path = fake_path(tmp_path, {"bash": None, "id": "echo 1000", "ip": None, "tc": None})
    proc = subprocess.run(["bash", SCRIPT, "--", "true"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PATH=path))
    assert proc.returncode == 2
    assert "needs root" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the root check comes first")
def test_refuses_without_iproute2(tmp_path):
    path = fake_path(tmp_path, {"bash": None, "id": None})
    proc = subprocess.run(["bash", SCRIPT, "--", "true"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PATH=path))
    assert proc.returncode == 2
    assert "needs iproute2 ('ip' not found" in proc.stderr


def test_refuses_without_a_command():
    proc = netns("--rate", "1gbit")
    assert proc.returncode == 2 and "no command given" in proc.stderr


@needs_netns
def test_command_runs_in_a_throttled_private_loopback_and_the_namespace_is_removed():
    inside = "ip -o link; tc qdisc show dev lo; echo env=$MPIR_CVAR_NOLOCAL,$MPIR_CVAR_CH4_NETMOD,$FI_PROVIDER; exit 3"
    proc = netns("--rate", "10mbit", "--", "sh", "-c", inside)
    assert proc.returncode == 3                                   # the command's status passes through
    links = [line for line in proc.stdout.splitlines() if re.match(r"\d+: ", line)]
    assert len(links) == 1 and links[0].startswith("1: lo:") and "UP" in links[0]
    assert "qdisc tbf" in proc.stdout and "rate 10Mbit" in proc.stdout
    assert "env=1,ofi,tcp" in proc.stdout
    assert namespace_name(proc.stderr) not in namespaces()


@needs_netns
def test_bad_rate_is_refused_and_cleaned_up():
    proc = subprocess.Popen([SCRIPT, "--rate", "fast", "--", "true"], stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "tc rejected rate 'fast'" in stderr
    assert f"ssdmpi-{proc.pid}-" not in namespaces()          # names carry the launcher's pid


SEND_2MB = """
import socket, threading, time
server = socket.create_server(("127.0.0.1", 0))
def sink():
    conn, _ = server.accept()
    while conn.recv(1 << 20):
        pass
receiver = threading.Thread(target=sink)
receiver.start()
client = socket.create_connection(server.getsockname())
start = time.perf_counter()
client.sendall(b"x" * (2 << 20))
client.shutdown(socket.SHUT_WR)
receiver.join()                 # until the last byte arrived
print(f"seconds={time.perf_counter() - start:.3f}")
"""


@needs_netns
def test_the_rate_limit_is_real():
    # 2 MB at 16 Mbit/s (2 MB/s) needs about a second; unthrottled loopback takes milliseconds.
    slow = netns("--rate", "16mbit", "--quiet", "--", sys.executable, "-c", SEND_2MB)
    fast = netns("--rate", "unlimited", "--quiet", "--", sys.executable, "-c", SEND_2MB)
    t_slow = float(slow.stdout.split("seconds=")[1])
    t_fast = float(fast.stdout.split("seconds=")[1])
    assert t_slow > 0.5, slow.stdout + slow.stderr
    assert t_fast < t_slow / 5


@needs_netns
def test_mpi_ranks_talk_over_tcp_inside():
    # Rank 0 alone prints what every rank got (the ranks' own lines can interleave mid-line).
    code = ("from mpi4py import MPI; import numpy as np; a = np.ones(1 << 18, np.float32); "
            "c = MPI.COMM_WORLD; c.Allreduce(MPI.IN_PLACE, a); sums = c.gather(float(a[0])); "
            "c.rank == 0 and print('sums', sums)")
    proc = netns("--rate", "1gbit", "--quiet", "--", mpiexec(), "-n", "2", sys.executable, "-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "sums [2.0, 2.0]" in proc.stdout, proc.stdout


@needs_netns
def test_term_reaches_the_command_and_the_namespace_is_removed():
    proc = subprocess.Popen([SCRIPT, "--", "sleep", "60"], stderr=subprocess.PIPE, text=True)
    name = namespace_name(proc.stderr.readline())
    deadline = time.monotonic() + 10
    while subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.strip() == "" \
            and time.monotonic() < deadline:
        time.sleep(0.05)                                          # until `sleep` runs inside
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) != 0
    assert time.monotonic() - start < 10                          # did not wait for sleep's 60 s
    assert name not in namespaces()
