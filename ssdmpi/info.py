"""``ssdmpi info``: what this installation and this MPI job look like.

Reports package and dependency versions, the MPI library, the thread level MPI
actually granted, the world size, the active array backend and why, and the
verdict on CUDA-aware MPI. ``--json`` prints one JSON object (rank 0 only).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys

from ssdmpi.comm.transport import TRANSPORTS, cuda_aware_verdict

DEPENDENCIES = ("numpy", "mpi4py", "h5py", "mpich", "cupy-cuda12x", "PyYAML", "tqdm", "matplotlib", "torch")


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="array backend to probe (default: auto)")
    parser.add_argument("--transport", choices=TRANSPORTS, default="auto",
                        help="GPU transport setting to report the CUDA-aware verdict for (default: auto)")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect(device: str = "auto", transport: str = "auto") -> dict:
    """Everything ``ssdmpi info`` reports, as a JSON-ready dict. Initialises MPI."""
    from mpi4py import MPI

    from ssdmpi import __version__, backend

    backend.select(device)
    comm = MPI.COMM_WORLD
    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    return {
        "ssdmpi": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dependencies": {name: _version(name) for name in DEPENDENCIES},
        "mpi": {
            "library": MPI.Get_library_version().strip().splitlines()[0].strip(),
            "standard": "{}.{}".format(*MPI.Get_version()),
            "thread_level": levels.get(MPI.Query_thread(), str(MPI.Query_thread())),
            "world_size": comm.Get_size(),
            "processor": MPI.Get_processor_name(),
        },
        "backend": backend.describe(),
        "cuda_aware": cuda_aware_verdict(transport),
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "SLURM_JOB_ID")
                if k in os.environ},
    }


def run(args) -> int:
    from mpi4py import MPI

    report = collect(args.device, args.transport)
    if MPI.COMM_WORLD.Get_rank() != 0:
        return 0
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    mpi, be = report["mpi"], report["backend"]
    lines = [
        f"ssdmpi {report['ssdmpi']}  (Python {report['python']}, {report['platform']})",
        "dependencies: " + ", ".join(f"{k} {v}" for k, v in report["dependencies"].items() if v),
        "missing: " + (", ".join(k for k, v in report["dependencies"].items() if not v) or "none"),
        f"MPI library: {mpi['library']} (MPI {mpi['standard']})",
        f"MPI thread level granted: {mpi['thread_level']}",
        f"world size: {mpi['world_size']}",
        f"array backend: {be['active']} — {be['reason']}",
        f"CUDA-aware MPI: {report['cuda_aware']}",
    ]
    print("\n".join(lines))
    sys.stdout.flush()
    return 0
