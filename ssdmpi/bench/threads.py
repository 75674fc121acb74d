"""``python -m ssdmpi.bench.threads``: does a bare launch run as fast as a hand-tuned one?

Before each rank chose its own BLAS threads (``ssdmpi/comm/node.py``), ``mpiexec -n 4
ssdmpi train`` without ``OMP_NUM_THREADS=1`` ran many times slower: every rank's BLAS
started one thread per core. This runs the same training at each rank count twice, once
with no thread variable set (the ranks choose) and once with ``OMP_NUM_THREADS=1``,
interleaved in pairs (the order alternating from pair to pair, so a load change on a shared
machine hits both sides alike), and prints the median wall time of each side and their
ratio. The acceptance bar is a ratio within 1.1. Also prints the BLAS libraries
(threadpoolctl) the ranks limit. ``--unlimited-runs N`` adds N runs per rank count with
one thread per CPU in every rank (``OMP_NUM_THREADS`` = this process's CPUs: what a bare
launch got before the ranks chose), to show what the choice avoids. Results:
BENCHMARKS.md, "Threads per rank".

Usage: python -m ssdmpi.bench.threads [--ranks 2,4] [--pairs 3] [--preset NAME] [--steps N]
A standalone module (not yet an ``ssdmpi bench`` kind).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ssdmpi import rundir
from ssdmpi.bench import result as result_file
from ssdmpi.parsing import parse_list

SIDES = ("auto", "OMP_NUM_THREADS=1")
UNLIMITED = "one thread per CPU"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def add_arguments(parser) -> None:
    parser.add_argument("--ranks", default="2,4", help="rank counts, comma-separated (default: %(default)s)")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs per rank count (default: %(default)s)")
    parser.add_argument("--preset", default="fashion-mnist-lenet5", help="training preset (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=150, help="training steps per run (default: %(default)s)")
    parser.add_argument("--mpiexec", default=None, help="launcher (default: the one next to this Python)")
    parser.add_argument("--unlimited-runs", type=int, default=0, metavar="N",
                        help="also N runs per rank count with one thread per CPU in every rank (default: 0)")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the results as a result file (ssdmpi/bench/result.py: command, machine)")


def side_env(side: str) -> dict:
    """The environment of one side: no thread variable at all, or ``OMP_NUM_THREADS=1``."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    if side == UNLIMITED:
        env["OMP_NUM_THREADS"] = str(len(os.sched_getaffinity(0)))
    elif side != "auto":
        env["OMP_NUM_THREADS"] = "1"
    return env


def one_run(launcher: str, ranks: int, side: str, args, workdir: str) -> dict:
    """Run ``mpiexec -n RANKS ssdmpi train`` once; its wall time and what rank 0 chose."""
    run_dir = tempfile.mkdtemp(prefix=f"n{ranks}-", dir=workdir)
    cmd = [launcher, "-n", str(ranks), sys.executable, "-m", "ssdmpi", "train", "--preset", args.preset,
           "--steps", str(args.steps), "--eval-every", "0", "--no-progress-bar", "--run-dir", run_dir]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=side_env(side), capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    summary = rundir.read_summary(run_dir)
    return {"wall_s": wall, "train_s": summary["time"], "placement": summary.get("placement")}


def run(args) -> int:
    from ssdmpi.comm.node import blas_info

    ranks = parse_list(args.ranks, "--ranks", int, minimum=1, example="2,4")
    launcher = args.mpiexec or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    print("BLAS (threadpoolctl, this process):", "; ".join(
        f"{b['internal_api']} {b['version']} ({b['threading_layer']}, {b['architecture']}), "
        f"{b['num_threads']} threads by default" for b in blas_info()), flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="ssdmpi-bench-threads-") as workdir:
        for n in ranks:
            runs = {side: [] for side in SIDES}
            for pair in range(args.pairs):
                order = SIDES if pair % 2 == 0 else SIDES[::-1]
                for side in order:
                    r = one_run(launcher, n, side, args, workdir)
                    runs[side].append(r)
                    print(f"  -n {n} pair {pair + 1} {side:>18}: {r['wall_s']:6.1f} s wall, "
                          f"{r['train_s']:6.1f} s run  [{r['placement']}]", flush=True)
            for _ in range(args.unlimited_runs):
                r = one_run(launcher, n, UNLIMITED, args, workdir)
                runs.setdefault(UNLIMITED, []).append(r)
                print(f"  -n {n} {UNLIMITED:>25}: {r['wall_s']:6.1f} s wall, {r['train_s']:6.1f} s run", flush=True)
            results[n] = {side: {"wall_s": statistics.median(r["wall_s"] for r in rs),
                                 "train_s": statistics.median(r["train_s"] for r in rs),
                                 "placement": rs[0]["placement"]} for side, rs in runs.items()}
    print(f"\nmpiexec -n N ssdmpi train --preset {args.preset} --steps {args.steps}: medians of {args.pairs} "
          "interleaved pairs")
    print("| ranks | no thread variable (wall / run) | OMP_NUM_THREADS=1 (wall / run) | ratio (wall) | ratio (run) "
          f"| {UNLIMITED} (wall / run) |")
    print("|---|---|---|---|---|---|")
    for n, r in results.items():
        a, b, u = r["auto"], r["OMP_NUM_THREADS=1"], r.get(UNLIMITED)
        print(f"| {n} | {a['wall_s']:.1f} s / {a['train_s']:.1f} s | {b['wall_s']:.1f} s / {b['train_s']:.1f} s | "
              f"{a['wall_s'] / b['wall_s']:.2f} | {a['train_s'] / b['train_s']:.2f} | "
              + (f"{u['wall_s']:.1f} s / {u['train_s']:.1f} s |" if u else "not run |"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(result_file.dumps({**result_file.provenance("threads", program="python -m ssdmpi.bench.threads"),
                                       "args": vars(args), "blas": blas_info(), "results": results,
                                       "rows": rows(results)}))
    return 0


def rows(results: dict) -> list:
    """One row per rank count (``ranks``, ``bare_*`` / ``omp1_*`` / ``unlimited_*`` ``wall_s`` and
    ``run_s``, ``ratio_wall`` and ``ratio_run``: bare over ``OMP_NUM_THREADS=1``), as BENCHMARKS.md shows them."""
    out = []
    for n, r in results.items():
        row = {"ranks": n}
        for prefix, side in (("bare", "auto"), ("omp1", "OMP_NUM_THREADS=1"), ("unlimited", UNLIMITED)):
            if side in r:
                row[f"{prefix}_wall_s"], row[f"{prefix}_run_s"] = r[side]["wall_s"], r[side]["train_s"]
        row["ratio_wall"] = row["bare_wall_s"] / row["omp1_wall_s"]
        row["ratio_run"] = row["bare_run_s"] / row["omp1_run_s"]
        out.append(row)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m ssdmpi.bench.threads",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
