#!/usr/bin/env python3
"""Run the whole test suite: serial unit tests, MPI tests at 1, 2 and 4 ranks, Slurm tests,
and the namespaced 2-node cluster (MPI and Slurm across nodes; root only, else skipped).

Every stage runs under an outer timeout, so a deadlock fails instead of hanging, and
pytest-timeout fails a single stuck test sooner. Under mpiexec, ranks other than 0
write their pytest output to per-rank logs, printed only when the stage fails.

Usage: python tests/run.py [--quick] [--stage unit|mpi|slurm|cluster ...] [-- extra pytest args]
Uses the ``mpiexec`` next to this Python (the venv's own), not whatever is on PATH.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ssdmpi.comm.shm import SHM_DIR, stale_segments  # noqa: E402

PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"]
RANKS = (1, 2, 4)


def mpiexec() -> str:
    """The MPI launcher of this Python's environment, falling back to PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")


def pytest_counts(output: str) -> dict:
    """The counts of pytest's closing line ("3 passed, 1 skipped in 2.0s"), as a dict."""
    for line in reversed(output.splitlines()):
        if re.search(r" in [\d.]+s", line) and COUNT.search(line):
            return {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
                    for n, kind in COUNT.findall(line)}
    return {}


def remove_new_stale_segments(before: set) -> None:
    """Remove the MPI shared-memory segments this stage's aborted or killed jobs left behind
    (new since ``before``, unmapped): a later job could attach to one (ssdmpi/comm/shm.py)."""
    left = [p for p in stale_segments(min_age_s=1) if p.name not in before]
    for path in left:
        path.unlink(missing_ok=True)
    if left:
        print(f"=== removed {len(left)} stale MPI segment(s) left in {SHM_DIR} by this stage's aborted jobs")


def run_stage(name: str, cmd: list[str], timeout: int, env: dict, totals: dict, logdir: Path | None = None) -> bool:
    """Run one stage under an outer timeout, echoing its output; add its pytest counts to ``totals``."""
    print(f"\n=== {name}: {' '.join(cmd)} (timeout {timeout}s)", flush=True)
    start = time.monotonic()
    shm_before = {p.name for p in SHM_DIR.glob("*")}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    timed_out = threading.Event()

    def kill_on_timeout():
        timed_out.set()
        os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill_on_timeout)
    timer.start()
    output = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        output.append(line)
    rc = proc.wait()
    timer.cancel()
    if timed_out.is_set():
        print(f"=== {name}: TIMED OUT after {timeout}s (deadlock?)", flush=True)
        rc = 124
    for kind, n in pytest_counts("".join(output)).items():
        totals[kind] = totals.get(kind, 0) + n
    if rc == 5:   # pytest: no tests collected (a stage whose tests do not exist yet)
        print(f"=== {name}: no tests collected", flush=True)
    ok = rc in (0, 5)
    remove_new_stale_segments(shm_before)
    print(f"=== {name}: {'ok' if ok else f'FAILED (exit {rc})'} in {time.monotonic() - start:.0f}s", flush=True)
    if not ok and logdir is not None:
        for log in sorted(logdir.glob("rank*.log")):
            print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-20000:]}", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--stage", action="append", choices=("unit", "mpi", "slurm", "cluster"),
                        help="run only these stages (default: all)")
    parser.add_argument("--timeout", type=int, default=1500, help="outer timeout per stage, seconds")
    parser.add_argument("--cluster-timeout", type=int, default=600,
                        help="outer timeout of the cluster stage, seconds (it takes ~2 minutes)")
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    args = parser.parse_args()
    stages = args.stage or ["unit", "mpi", "slurm", "cluster"]
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    # No thread variables: every rank chooses its BLAS threads itself (ssdmpi/comm/node.py).
    results, totals = [], {}
    if "unit" in stages:
        results.append(run_stage("unit (serial)", PYTEST + ["--timeout=300", "tests/unit"] + args.pytest_args,
                                 args.timeout, env, totals))
    if "mpi" in stages:
        for n in RANKS:
            logdir = Path(tempfile.mkdtemp(prefix=f"ssdmpi-test-n{n}-"))
            cmd = [mpiexec(), "-n", str(n), sys.executable, "tests/mpi_pytest.py", str(logdir)] + PYTEST[3:] \
                + ["--timeout=300", "tests/mpi"] + args.pytest_args
            results.append(run_stage(f"mpi (-n {n})", cmd, args.timeout, env, totals, logdir))
    if "slurm" in stages:
        results.append(run_stage("slurm", PYTEST + ["--timeout=900", "tests/slurm"] + args.pytest_args,
                                 args.timeout, env, totals))
    if "cluster" in stages:
        results.append(run_stage("cluster", PYTEST + ["--timeout=400", "tests/cluster"] + args.pytest_args,
                                 args.cluster_timeout, env, totals))
    failed_stages = len(results) - sum(results)
    print(f"\nstages: {sum(results)} passed, {failed_stages} failed")
    # Test counts summed over stages (an MPI stage counts rank 0's report once).
    failed = totals.get("failed", 0) + totals.get("error", 0) + (failed_stages if not totals.get("failed") else 0)
    print(f"tests: {totals.get('passed', 0)} passed, {failed} failed, {totals.get('skipped', 0)} skipped")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
