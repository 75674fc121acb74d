"""``ssdmpi-gpucheck --out DIR``: run every part of the GPU check, each in its own subprocess under
its own time budget, and write ``DIR/report.json`` and ``DIR/report.md`` after each part.

Exit status: 0 when every part passed (or was skipped as not applicable: a CUDA-aware MPI that
is not there, PyTorch not importable), 1 when a part failed, crashed or ran out of its budget,
2 with one line ("no GPU: ...") when no GPU is usable here, or on a bad argument.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import subprocess
import sys
import time

from ssdmpi.comm import mpi_env
from ssdmpi.gpucheck.report import Report

# (part, budget in seconds, where it runs): "one" = one process, "two" = mpiexec -n 2 (one GPU shared).
# The budgets add up to 470 s, under the 8 minutes the check is allowed on one H200 (the typical
# run takes a fraction of them: they are ceilings that stop a hang, not estimates).
PARTS = (
    ("models", 80, "one"),
    ("optimizers", 30, "one"),
    ("algorithms-host", 90, "two"),
    ("algorithms-cuda-aware", 50, "two"),
    ("overlap", 60, "two"),
    ("engine", 70, "one"),
    ("training", 90, "one"),
)
TOTAL_BUDGET = 480


def mpiexec() -> str:
    """The ``mpiexec`` next to this Python (a venv's own MPI), else the one on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.path.exists(local) else (shutil.which("mpiexec") or "mpiexec")


@functools.lru_cache(maxsize=1)
def mpi_library() -> str:
    """The MPI library's version text, asked without starting MPI in this process (``mpi_env``)."""
    return mpi_env.library_version()


def cuda_aware_mpi() -> tuple[bool, str]:
    """``(usable, why)``: may device buffers be passed to this MPI? ``SSDMPI_GPUCHECK_CUDA_AWARE=1/0``
    decides if set; else Open MPI's ``ompi_info``, else a CUDA mention in the library's version text."""
    from ssdmpi.comm.transport import _open_mpi_built_with_cuda

    forced = os.environ.get("SSDMPI_GPUCHECK_CUDA_AWARE")
    if forced in ("0", "1"):
        return forced == "1", f"SSDMPI_GPUCHECK_CUDA_AWARE={forced}"
    text = mpi_library()
    first = text.splitlines()[0].strip() if text else "unknown MPI"
    built = _open_mpi_built_with_cuda()
    if built is not None:
        return built, f"{first}: ompi_info says built with CUDA: {'yes' if built else 'no'}"
    if "cuda" in text.lower():
        return True, f"{first}: its version text mentions CUDA"
    return False, f"{first}: not built with CUDA (no CUDA in its version text; PyPI's mpich wheel is not)"


def command(part: str, where: str, part_file: str, out_dir: str) -> list[str]:
    """The command line of one part."""
    if where == "two":
        name, _, transport = part.partition("-")
        cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "ssdmpi.gpucheck.ranks", name, part_file]
        return cmd + (["--transport", transport] if transport else [])
    return [sys.executable, "-m", "ssdmpi.gpucheck.parts", part, part_file, "--work", os.path.join(out_dir, part)]


def run_part(part: str, budget: float, cmd: list[str], part_file: str, log_path: str) -> dict:
    """Run one part under ``budget`` seconds (its process group killed after); return its record."""
    import json

    t0 = time.monotonic()
    error = None
    with open(log_path, "w") as log:
        # Both ranks run here (one GPU): MPICH's launcher must fork them, not ask Slurm for a step.
        env = {**os.environ, "HYDRA_LAUNCHER": os.environ.get("HYDRA_LAUNCHER", "fork")}
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            rc = proc.wait(timeout=budget)
            if rc != 0:
                error = f"exit status {rc} (see {log_path})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            error = f"ran past its budget of {budget:.0f} s and was killed (partial results kept; see {log_path})"
    try:
        with open(part_file) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = {"part": part, "checks": [], "notes": []}
    record.update(seconds=time.monotonic() - t0, budget_s=budget, error=error, command=" ".join(cmd))
    return record


def parse(argv):
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="ssdmpi-gpucheck",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for report.json, report.md and logs")
    parser.add_argument("--parts", default=",".join(p for p, _, _ in PARTS),
                        help=f"comma-separated subset of: {', '.join(p for p, _, _ in PARTS)}")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every part's time budget (e.g. 2 on a slower GPU)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    known = {p for p, _, _ in PARTS}
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in known]
    if unknown:
        print(f"ssdmpi-gpucheck: unknown part(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}",
              file=sys.stderr)
        return 2
    try:
        os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    except OSError as exc:
        print(f"ssdmpi-gpucheck: cannot write the report to {args.out} ({exc.strerror}); pass a writable --out",
              file=sys.stderr)
        return 2
    from ssdmpi import backend

    cupy, why = backend.probe_cupy()
    if cupy is None:
        text = why[len("no GPU ("):-1] if why.startswith("no GPU (") else why
        Report(args.out, {"command": " ".join(["ssdmpi-gpucheck"] + argv)}, verdict=f"no GPU: {text}").save()
        print(f"ssdmpi-gpucheck: no GPU: {text}", file=sys.stderr)
        return 2
    return run_all(args, chosen, why, argv)


def run_all(args, chosen: list[str], gpu: str, argv: list[str]) -> int:
    """Every chosen part in order, each under its budget and the run's remaining time."""
    aware, aware_why = cuda_aware_mpi()
    header = {"gpu": gpu, "mpi": mpi_library().splitlines()[0].strip(), "cuda_aware_mpi": aware_why,
              "python": sys.version.split()[0], "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": " ".join(["ssdmpi-gpucheck"] + argv)}
    report = Report(args.out, header)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)   # run_all may be called directly (tests)
    deadline = time.monotonic() + TOTAL_BUDGET * args.budget_scale
    for part, budget, where in PARTS:
        if part not in chosen:
            continue
        if part == "algorithms-cuda-aware" and not aware:
            report.add({"part": part, "notes": [f"host staging tested only: {aware_why}"],
                        "checks": [{"name": "CUDA-aware transport", "ok": None, "value": None, "goal": None,
                                    "detail": f"not tested: {aware_why}"}], "seconds": 0.0, "budget_s": 0})
            continue
        budget = min(budget * args.budget_scale, deadline - time.monotonic())
        if budget < 5:
            report.add({"part": part, "checks": [], "notes": [], "error": "not run: the run's time was spent",
                        "seconds": 0.0, "budget_s": 0})
            continue
        part_file = os.path.join(args.out, "logs", f"{part}.json")
        cmd = command(part, where, part_file, args.out)
        print(f"ssdmpi-gpucheck: {part} (budget {budget:.0f} s) ...", flush=True)
        record = run_part(part, budget, cmd, part_file, os.path.join(args.out, "logs", f"{part}.log"))
        report.add(record)
        print(f"ssdmpi-gpucheck: {part}: {report.parts[-1]['status']} in {record['seconds']:.0f} s", flush=True)
    print(f"ssdmpi-gpucheck: {report.summary()} — {os.path.join(args.out, 'report.md')}")
    return 0 if report.passed else 1

