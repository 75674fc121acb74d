"""The two-rank parts of the GPU check, both ranks sharing one GPU:
``mpiexec -n 2 python -m ssdmpi.gpucheck.ranks PART FILE [--transport host|cuda-aware]``.

- ``algorithms``: every algorithm on CuPy buffers through the Communicator (the GPU default
  progress, ``thread``, and ``test`` for ssd) against the NumPy reference simulator
  (``ssdmpi/verify/reference.py``), step by step, float64 (relative 1e-9: cuBLAS and NumPy's
  BLAS round differently) and one float32 case (1e-4); ``W`` must hash the same on both ranks.
- ``overlap``: an allreduce in flight while the GPU computes: the fraction of the allreduce
  hidden behind the compute (goal >= 95%), and the Communicator's own overlap statistic.

Rank 0 records the checks in ``FILE``. An exception in a case is caught and gathered at the
case's end, so the other cases still run; a rank stuck inside a collective is stopped by the
part's time budget (the runner kills the part, keeping the checks recorded so far).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import numpy as np

from ssdmpi import backend
from ssdmpi.algos import registry
from ssdmpi.comm import mpi_env, world
from ssdmpi.gpucheck.report import PartLog

F, CLASSES, B = 10, 3, 4
# Every algorithm's named configurations (the registry's), at k = 3 where they take one; asgd has its
# own comparison (``compare_asgd``: a server rank and a worker rank).
CONFIGS = tuple(dict(s, **({"delay": 3} if registry.ALGORITHMS[s["algo"]].takes("delay") else {}))
                for s in registry.variants().values() if not registry.ALGORITHMS[s["algo"]].takes("servers"))


def tiny_mlp(xp, dtype):
    from ssdmpi.nn import build_model

    return lambda: build_model("mlp", (F,), CLASSES, widths=(8,), dtype=dtype, seed=3, xp=xp)


def dataset(dtype, n=240):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, F)).astype(dtype), rng.integers(0, CLASSES, size=n)


def worst_rel(mine, ref) -> float:
    mine = backend.to_host(mine)
    return float(np.abs(mine - ref).max() / max(1.0, float(np.abs(ref).max())))


def compare_one(comm, cupy, settings: dict, dtype, progress: str, transport: str) -> tuple[float, bool]:
    """Run ``settings`` on CuPy next to the reference, over the ranks of ``comm`` (an mpi4py
    communicator, None: all); ``(worst relative difference, replicas equal)``."""
    from ssdmpi.algos import AlgoConfig, build_algorithm
    from ssdmpi.comm.communicator import Communicator
    from ssdmpi.data import ShardedLoader as Loader
    from ssdmpi.verify.reference import Simulation

    worst, same = 0.0, True
    with Communicator(comm, progress=progress, transport=transport) as c:
        N, rank = c.size, c.rank
        cfg = AlgoConfig(warmup_steps=3, lr=0.05, **settings)
        k = cfg.validate(N).delay or 1
        x, y = dataset(dtype)
        algo = build_algorithm(cfg, tiny_mlp(cupy, dtype)(), c)
        loader = Loader(x, y, B, rank, N, seed=7)
        sim = Simulation(cfg, tiny_mlp(np, dtype), [Loader(x, y, B, r, N, seed=7) for r in range(N)], N)
        for _ in range(3 + 4 * k + 2):
            xb, yb = loader.next_batch()
            loss = algo.step(backend.to_device(xb), backend.to_device(yb))
            sim.step()
            worst = max(worst, abs(float(loss) - sim.losses[rank]) / max(1.0, abs(sim.losses[rank])),
                        worst_rel(algo.global_weights(), sim.W))
            if sim.stage == "delay":
                worst = max(worst, worst_rel(algo.local_weights(), sim.L[rank]))
            digest = hashlib.sha256(backend.to_host(algo.global_weights()).tobytes()).hexdigest()
            same = same and not c.any_true(c.broadcast_object(digest) != digest)
        algo.finalize()
        sim.finalize()
        worst = max(worst, worst_rel(algo.global_weights(), sim.W))
    return worst, same


def compare_asgd(comm, cupy, transport: str) -> float:
    """asgd, round-robin order (deterministic), one server and one worker, against its reference."""
    from ssdmpi.algos import AlgoConfig, build_algorithm
    from ssdmpi.comm.communicator import Communicator
    from ssdmpi.data import ShardedLoader as Loader
    from ssdmpi.verify.reference import ASGDSimulation

    # the variant of the algorithm with parameter servers, in its deterministic order (the registry's)
    servers = next(v for v in registry.variants().values() if registry.ALGORITHMS[v["algo"]].takes("servers"))
    cfg = AlgoConfig(**servers, warmup_steps=3, lr=0.05)
    x, y = dataset(np.float64)
    worst = 0.0
    with Communicator(comm, transport=transport) as c:
        algo = build_algorithm(cfg, tiny_mlp(cupy, np.float64)(), c)
        loader = Loader(x, y, B, 0, 1, seed=7) if c.rank == 0 else None
        sim = ASGDSimulation(cfg, tiny_mlp(np, np.float64), [Loader(x, y, B, 0, 1, seed=7)], 2)
        for _ in range(12):
            batch = loader.next_batch() if loader else (None, None)
            algo.step(*(backend.to_device(b) if b is not None else None for b in batch))
            sim.step()
            algo.drain()
            worst = max(worst, worst_rel(algo.global_weights(), sim.W))
    return worst


def algorithms(log: PartLog | None, comm, cupy, transport: str) -> None:
    """Every case of ``CONFIGS`` (and asgd) against the reference; ``verdicts``, a Communicator of
    its own, gathers each case's worst difference over the ranks, even after a case failed."""
    from ssdmpi.comm.communicator import Communicator

    with Communicator(comm, progress="blocking", stall_timeout=None) as verdicts:
        _algorithms(log, comm, cupy, transport, verdicts)


def _algorithms(log: PartLog | None, comm, cupy, transport: str, verdicts) -> None:
    cases = [(s, np.float64, "thread") for s in CONFIGS]
    step = {**registry.variants()["step/global-momentum"], "delay": 2}    # --comm step, the default local update
    cases += [(step, np.float64, "test"), (step, np.float32, "thread")]
    for settings, dtype, progress in cases:
        name = " ".join(f"{k}={v}" for k, v in settings.items()) + f" {np.dtype(dtype).name} --progress {progress}"
        tol = 1e-9 if dtype == np.float64 else 1e-4
        try:
            worst, same = compare_one(comm, cupy, settings, dtype, progress, transport)
            error = ""
        except Exception as exc:   # recorded, and the other rank told, so neither waits for the other
            worst, same, error = float("inf"), False, f"{type(exc).__name__}: {exc}"
        worst = verdicts.allreduce_scalars({"worst": worst}, "max")["worst"]
        same = not verdicts.any_true(not same)
        if log is not None:
            log.check(f"{transport}: {name} vs reference", worst <= tol and same, value=worst,
                      goal=f"<= {tol:g} rel; W equal on both ranks", detail=error)
    try:
        worst, error = compare_asgd(comm, cupy, transport), ""
    except Exception as exc:
        worst, error = float("inf"), f"{type(exc).__name__}: {exc}"
    worst = verdicts.allreduce_scalars({"worst": worst}, "max")["worst"]
    if log is not None:
        log.check(f"{transport}: asgd round-robin float64 vs reference", worst <= 1e-9, value=worst,
                  goal="<= 1e-9 rel", detail=error)


def _matmuls(a, seconds_each: float) -> int:
    """How many ``a @ a`` make about ``seconds_each`` of GPU work (measured)."""
    backend.synchronize()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.2:
        a @ a
        n += 1
        backend.synchronize()
    return max(1, int(n * seconds_each / (time.perf_counter() - t0)))


def overlap(log: PartLog | None, comm, xp, transport: str = "host", mb: int = 64, rounds: int = 5) -> None:
    """Allreduce of ``mb`` MB alone, GPU compute alone (about twice as long), then both at once."""
    from ssdmpi.comm.communicator import Communicator

    with Communicator(comm, transport=transport) as c:
        buf = xp.ones(mb * 2**20 // 4, dtype=xp.float32)
        a = xp.ones((2048, 2048), dtype=xp.float32)
        sync = backend.synchronize

        def comm_alone():
            c.allreduce_start(buf, average=False).wait()
            sync()

        t_comm = _median_time(comm_alone, c, rounds)
        n = _matmuls(a, 2 * t_comm)

        def compute_alone():
            for _ in range(n):
                a @ a
            sync()

        def both():
            handle = c.allreduce_start(buf, average=False)
            for _ in range(n):
                a @ a
            handle.wait()
            sync()

        t_compute = _median_time(compute_alone, c, rounds)
        c.stats.reset()
        t_both = _median_time(both, c, rounds)
        stats = c.stats.snapshot()
        hidden = (t_comm + t_compute - t_both) / t_comm
        value = {"hidden": hidden, "comm_ms": t_comm * 1e3, "compute_ms": t_compute * 1e3, "both_ms": t_both * 1e3,
                 "stat_overlap": stats.get("overlap"), "progress": c.strategy, "transport": c.transport.name}
        hidden = c.allreduce_scalars({"hidden": hidden}, "min")["hidden"]
        if log is not None:
            log.check(f"overlap: {mb} MB allreduce ({c.transport.name}, --progress {c.strategy}) behind GPU compute",
                      hidden >= 0.95, value=value, goal="hidden fraction >= 0.95 (worst rank)")


def _median_time(fn, comm, rounds: int) -> float:
    """Median wall time of ``fn`` over ``rounds`` (after one warm-up), the ranks of the
    Communicator ``comm`` starting together."""
    times = []
    for r in range(rounds + 1):
        comm.barrier()
        t0 = time.perf_counter()
        fn()
        if r:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m ssdmpi.gpucheck.ranks")
    parser.add_argument("part", choices=("algorithms", "overlap"))
    parser.add_argument("file")
    parser.add_argument("--transport", default="host", choices=("host", "cuda-aware"))
    parser.add_argument("--numpy", action="store_true",
                        help="the harness on NumPy, no GPU (its tests: it proves nothing about a GPU)")
    args = parser.parse_args(argv)
    rank, size = world.rank_and_size()
    log = PartLog(args.file, f"{args.part}-{args.transport}") if rank == 0 else None
    if args.numpy:
        cupy = backend.select("cpu")
    else:
        backend.bind_gpu(0)                    # both ranks share the one GPU
        cupy = backend.select("gpu")
    if log is not None:
        log.note(f"{size} ranks on one GPU; transport {args.transport}; "
                 f"{mpi_env.library_version().splitlines()[0]}")
    if args.part == "algorithms":
        algorithms(log, None, cupy, args.transport)
    else:
        overlap(log, None, cupy, args.transport)
    return 0


if __name__ == "__main__":
    sys.exit(main())
