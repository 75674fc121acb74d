"""Stale MPI shared-memory segments: detection, cleanup, and an abort that leaves none behind."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ssdmpi.comm import shm
from tests.conftest import ROOT, mpiexec

MAPPER = ("import mmap, sys\n"
          "f = open(sys.argv[1], 'r+b')\n"
          "m = mmap.mmap(f.fileno(), 4096)\n"
          "print('mapped', flush=True)\n"
          "sys.stdin.read()\n")


@pytest.fixture
def segment():
    """A fake MPICH segment in /dev/shm (unique name), removed afterwards."""
    path = shm.SHM_DIR / f"mpich_shm_ssdmpitest{os.getpid()}_{time.monotonic_ns()}_0"
    path.write_bytes(b"\0" * 4096)
    yield path
    path.unlink(missing_ok=True)


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.mark.parametrize("name, mpi", [("mpich_shm_aa8f2bd4_0", True), ("mpich_vci_aa8f2bd4_1", True),
                                       ("sm_segment.host.0.1a2b.0", True), ("vader_segment.host.1", True),
                                       ("sem.mp-xyz", False), ("mpich_other", False), ("torch_123", False)])
def test_only_mpi_segment_names_count(name, mpi):
    assert shm.is_mpi_segment(name) is mpi


def test_a_mapped_segment_is_in_use_and_never_stale(segment):
    age(segment, 3600)
    child = subprocess.Popen([sys.executable, "-c", MAPPER, str(segment)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "mapped"
        assert segment.name in shm.mapped_segments(child.pid)
        assert segment.name in shm.segments_in_use()
        assert segment not in shm.stale_segments(min_age_s=0)
        assert segment.name not in shm.remove_stale_segments(min_age_s=0)
        assert segment.exists()
    finally:
        child.communicate("", timeout=30)
    # its only user is gone: now it is stale, and cleanup removes it
    assert segment in shm.stale_segments(min_age_s=0)
    assert segment.name in shm.remove_stale_segments(min_age_s=0)
    assert not segment.exists()


def test_a_fresh_segment_is_left_alone(segment):
    """A segment being created is mapped within microseconds: an age floor protects it."""
    assert segment not in shm.stale_segments(min_age_s=60)
    age(segment, 120)
    assert segment in shm.stale_segments(min_age_s=60)


def test_command_lists_then_cleans(segment):
    age(segment, 3600)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    listed = subprocess.run([sys.executable, "-m", "ssdmpi.comm.shm"], capture_output=True, text=True, env=env,
                            timeout=60)
    assert listed.returncode == 0 and f"stale: {segment}" in listed.stdout and segment.exists()
    cleaned = subprocess.run([sys.executable, "-m", "ssdmpi.comm.shm", "--clean"], capture_output=True, text=True,
                             env=env, timeout=60)
    assert cleaned.returncode == 0 and f"removed: {segment}" in cleaned.stdout and not segment.exists()


def test_command_rejects_a_negative_age():
    r = subprocess.run([sys.executable, "-m", "ssdmpi.comm.shm", "--min-age", "-1"], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert r.returncode == 2 and "--min-age must be >= 0" in r.stderr and "Traceback" not in r.stderr


def test_abort_leaves_no_segment_behind(tmp_path):
    """Rank 1 raises after both ranks attached to the node's segment: the job aborts, and the
    segment's name is gone (MPI_Abort alone would leave it in /dev/shm)."""
    script = tmp_path / "boom.py"
    script.write_text(
        "import sys, time\n"
        "from ssdmpi.comm.abort import install_abort_hook\n"
        "from ssdmpi.comm.shm import mapped_segments\n"
        "from mpi4py import MPI\n"
        "install_abort_hook()\n"
        "comm = MPI.COMM_WORLD\n"
        "comm.Barrier()\n"
        "print('segments', *sorted(mapped_segments()), flush=True)\n"
        "comm.Barrier()\n"
        "if comm.Get_rank() == 1:\n"
        "    raise RuntimeError('deliberate failure')\n"
        "time.sleep(60)\n")
    r = subprocess.run([mpiexec(), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                       timeout=90, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode != 0 and "deliberate failure" in r.stderr
    names = {n for line in r.stdout.splitlines() if line.startswith("segments") for n in line.split()[1:]}
    if not names:
        pytest.skip("this MPI keeps no named node segment here (e.g. one rank per node, or no POSIX shm)")
    assert not [n for n in names if (shm.SHM_DIR / n).exists()], names
