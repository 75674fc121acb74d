"""Where this rank runs: its node, its share of the node's CPUs, its GPU.

``discover()`` (collective over COMM_WORLD) learns the node: host name, local rank and
local size (the ranks on the same host name), the CPUs this process may use
(``os.sched_getaffinity``, so Slurm's and cgroups' limits count) and the CPUs usable by
all the ranks of the node together (the union of their affinity sets).

``place(node, device, threads, gpu_id)`` then decides, on each rank, with two pure rules:

- ``choose_threads``: BLAS/OpenMP threads per rank. ``--threads N`` wins; else a thread
  variable the user set (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``)
  is left alone; else ``max(1, usable CPUs on the node // local size)``, never more than
  this rank's own CPUs. Without a limit every rank's BLAS starts one thread per core, and
  four ranks on one node run many times slower.
- ``choose_gpu``: one GPU per local rank. ``--gpu-id`` wins; a launcher that already bound
  one GPU per rank (``CUDA_VISIBLE_DEVICES`` with one entry, Slurm's ``--gpus-per-task``,
  one GPU in ``SLURM_STEP_GPUS``) is followed (device 0 of what it shows); else device
  ``local_rank % device_count``, and ranks share a GPU when they outnumber the devices.

and applies them (threadpoolctl; ``backend.bind_gpu`` before the backend's first
allocation; ``backend.select``). The ``Placement`` it returns says what was chosen and why,
for the run header, the summary, ``config.yaml`` and ``ssdmpi info``.
"""

from __future__ import annotations

import dataclasses
import os
import socket

from ssdmpi.comm.mpi_env import load_mpi
from ssdmpi.errors import UserError

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclasses.dataclass(frozen=True)
class Node:
    """This process's node, as ``discover`` found it."""

    host: str
    local_rank: int
    local_size: int
    cpus: int          # CPUs this process may run on
    node_cpus: int     # CPUs the node's ranks may run on, together


@dataclasses.dataclass(frozen=True)
class Placement:
    """What ``place`` chose for this rank, and why (one phrase each)."""

    node: Node
    threads: int | None        # BLAS/OpenMP threads of this rank (None: no pool loaded)
    threads_reason: str
    device: str                # "cpu" or "gpu"
    gpu_id: int | None         # the CUDA device used (None: CPU)
    gpu_reason: str
    shared_gpu: str | None = None   # set when local ranks outnumber the GPUs

    def describe(self) -> str:
        """One line: ``threads 1 (...); GPU 0 (...)`` or ``...; CPU``."""
        threads = f"{self.threads}" if self.threads is not None else "unknown"
        where = f"GPU {self.gpu_id} ({self.gpu_reason})" if self.device == "gpu" else "CPU"
        return f"threads {threads} per rank ({self.threads_reason}); {where}"

    def as_dict(self) -> dict:
        return dict(dataclasses.asdict(self.node), threads=self.threads, threads_reason=self.threads_reason,
                    device=self.device, gpu_id=self.gpu_id, gpu_reason=self.gpu_reason, shared_gpu=self.shared_gpu)


def usable_cpus() -> set:
    """The CPU ids this process may run on (all of ``os.cpu_count()`` where affinity is unknown)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def discover() -> Node:
    """Collective over COMM_WORLD: this rank's ``Node``.

    The local ranks are those on the same host name, not MPI's ``COMM_TYPE_SHARED`` split: that
    one follows the transport, and with shared memory turned off (``MPIR_CVAR_NOLOCAL=1``, as
    ``bin/ssdmpi-netns`` does to force every byte through TCP) each rank is its own "node" while
    the ranks still share the host's CPUs."""
    world = load_mpi().COMM_WORLD
    host, mine = socket.gethostname(), usable_cpus()
    hosts = sorted(set(world.allgather(host)))
    local = world.Split(hosts.index(host), world.Get_rank())
    try:
        union = set().union(*local.allgather(sorted(mine)))
        return Node(host=host, local_rank=local.Get_rank(), local_size=local.Get_size(),
                    cpus=len(mine), node_cpus=len(union))
    finally:
        local.Free()


def choose_threads(node: Node, requested: int | None, environ=None) -> tuple[int | None, str]:
    """``(threads, why)`` for one rank (see the module docstring); ``None``: leave as set."""
    environ = os.environ if environ is None else environ
    if requested is not None:
        return requested, "--threads"
    # a value this process wrote itself (an earlier run in the same process) is not the user's
    given = [f"{name}={environ[name]}" for name in THREAD_VARIABLES
             if environ.get(name) and environ.get(name) != _written.get(name)]
    if given:
        return None, f"{', '.join(given)} set by the user"
    n = max(1, min(node.cpus, node.node_cpus // node.local_size))
    ranks = "1 local rank" if node.local_size == 1 else f"{node.local_size} local ranks"
    return n, f"{node.node_cpus} usable CPUs on {node.host} / {ranks}"


def launcher_bound_gpu(environ) -> str | None:
    """Why the launcher already gave this rank its own GPU(s), or None."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and len([d for d in visible.split(",") if d.strip()]) == 1:
        return f"CUDA_VISIBLE_DEVICES={visible.strip()}"
    if environ.get("SLURM_GPUS_PER_TASK"):
        return f"Slurm --gpus-per-task={environ['SLURM_GPUS_PER_TASK']}"
    step = environ.get("SLURM_STEP_GPUS")
    if step is not None and len([d for d in step.split(",") if d.strip()]) == 1:
        return f"SLURM_STEP_GPUS={step.strip()}"
    return None


def choose_gpu(node: Node, device_count: int, requested: int | None,
               environ=None) -> tuple[int | None, str, str | None]:
    """``(device id or None, why, shared)`` for one rank; ``UserError`` for a ``--gpu-id`` not visible.

    ``shared``: a sentence when this node's ranks outnumber its GPUs, else None.
    """
    environ = os.environ if environ is None else environ
    if requested is not None:
        if not 0 <= requested < device_count:
            seen = f"devices 0..{device_count - 1}" if device_count else "no GPU"
            raise UserError(f"--gpu-id {requested} is not a GPU this rank can see ({seen}); "
                            "choose one of those or drop --gpu-id")
        return requested, "--gpu-id", None
    if device_count == 0:
        return None, "no GPU", None
    bound = launcher_bound_gpu(environ)
    if bound:
        return 0, f"bound by the launcher: {bound}", None
    shared = None
    if node.local_size > device_count:
        shared = (f"{node.local_size} ranks on {node.host} share {device_count} GPU(s); give each rank its own "
                  "(fewer ranks per node, or srun --gpus-per-task=1) for full speed")
    return node.local_rank % device_count, f"local rank {node.local_rank} of {node.local_size}, " \
                                           f"{device_count} GPU(s) seen", shared


def limit_threads(n: int) -> None:
    """Limit this process's BLAS/OpenMP pools to ``n`` threads for the rest of its life: those
    loaded now through threadpoolctl, those loaded later (SciPy's own OpenBLAS, PyTorch)
    through the thread variables, which a library reads when it loads."""
    global _limiter
    import numpy  # noqa: F401  (NumPy's BLAS must be loaded to be limited)
    from threadpoolctl import threadpool_limits

    for name in THREAD_VARIABLES:
        os.environ[name] = _written[name] = str(n)
    _limiter = threadpool_limits(limits=n)


_limiter = None   # kept: the limits hold while it lives
_written: dict = {}   # the thread variables limit_threads set, by name


def blas_threads() -> int | None:
    """The largest thread count of the BLAS/OpenMP pools loaded now (None: none found)."""
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_info

    counts = [pool["num_threads"] for pool in threadpool_info()]
    return max(counts) if counts else None


def blas_info() -> list:
    """threadpoolctl's description of each loaded pool: library, version, threads (for reports)."""
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_info

    return [{k: pool.get(k) for k in ("user_api", "internal_api", "version", "num_threads", "threading_layer",
                                      "architecture")} for pool in threadpool_info()]


def place(node: Node, device: str = "auto", threads: int | None = None, gpu_id: int | None = None,
          environ=None) -> Placement:
    """Apply this rank's threads and GPU and select the array backend; return the ``Placement``.

    ``UserError``: a ``--gpu-id`` this rank cannot see, ``--gpu-id`` with ``--device cpu``,
    ``--device gpu`` without a usable GPU (one line each).
    """
    from ssdmpi import backend

    n, why_threads = choose_threads(node, threads, environ)
    if n is not None:
        limit_threads(n)
    else:
        n = blas_threads()
    if device == "cpu":
        if gpu_id is not None:
            raise UserError("--gpu-id needs a GPU but --device is cpu; drop one of them")
        backend.select("cpu")
        return Placement(node, n, why_threads, "cpu", None, "--device cpu")
    count = backend.gpu_count()
    if count == 0 and gpu_id is None:
        backend.select(device)      # --device gpu: the one-line error of the backend
        return Placement(node, n, why_threads, "cpu", None, "no GPU")
    gpu, why_gpu, shared = choose_gpu(node, count, gpu_id, environ)
    backend.bind_gpu(gpu)
    backend.select(device)
    on_gpu = backend.device() == "gpu"
    return Placement(node, n, why_threads, backend.device(), gpu if on_gpu else None,
                     why_gpu if on_gpu else backend.reason(), shared if on_gpu else None)
