"""``ssdmpi bench comm``: the Communicator against raw mpi4py, and overlap per progress strategy.

Run with 2 ranks: ``mpiexec -n 2 ssdmpi bench comm [--sizes 1K,64K,4M] [--repeats N] [--json FILE|-]``.

(a) **bandwidth**: on the same float32 buffer, interleaved in rotating order with a barrier
    before each sample, ``raw`` = ``comm.Allreduce(IN_PLACE, buf, SUM)``; ``sum`` =
    ``Communicator.allreduce(buf, average=False)`` (the same operation through ssdmpi); ``mean``
    = ``Communicator.allreduce_mean(buf)`` (the fused mean of ``ssdmpi/comm/fused_mean.py`` from
    its ``MIN_BYTES`` up); ``sum+div`` = ``sum`` and then a division pass (what the mean costs
    without the fusion, for comparison). Reported:
    the median over samples of the slowest rank's time, algorithm bandwidth ``bytes / time``
    in GB/s, and the median of the paired ratios ``raw_time / time`` (1.0 = as fast as raw
    mpi4py; pairs are adjacent samples, which cancels the machine's slow load drifts).
(b) **overlap**: ``allreduce_start`` of an ``--overlap-size`` buffer, then compute sized to
    ``--compute-ratio`` times the allreduce time, then ``wait``; per strategy, interleaved, for
    CPU-bound compute (NumPy float32 matmuls) and idle compute (``time.sleep``, standing in for
    GPU work). The compute is cut into ``--pieces`` (10) with ``Communicator.progress()`` between them
    (as a trainer calls it between layers). ``overlap = (t_comm + t_compute - t_total) / t_comm``
    (1.0: the allreduce was fully hidden), each term the slowest rank's in that repeat, median
    over repeats. ``stats``
    is what the Communicator's own instrumentation reported (``1 - wait_s / inflight_s``).
(c) **control**: what a sync point's control message costs while a gradient allreduce is in
    flight. Per repeat: ``allreduce_scalars`` alone; an ``--overlap-size`` allreduce (``test``
    progress) alone; then that allreduce started, progressed 10 times 5 ms apart (as a trainer's
    compute would), and ``allreduce_scalars`` timed while it is still in flight. Slowest rank,
    median over repeats. The in-flight time is what a metrics line or a signal agreement waits
    when the MPI library queues the control message behind the gradient data
    (``ssdmpi/comm/mpi_env.py``).

(d) **compressed**: the sum of a ``--compressed-size`` float32 buffer in each ``--comm-dtype``
    (``ssdmpi/comm/compressed.py``: encode, ``Ialltoall`` of the codes, the shard sums, ``Iallgather``,
    decode) against the float32 allreduce, ``allreduce_start(...).wait()`` under ``--progress blocking``,
    interleaved with a barrier before each sample: the median of the slowest rank's time, the median of
    the paired ratios ``float32_time / time``, and the bytes each rank sent (``comm.stats``).

``--json FILE`` writes the result file of ``ssdmpi/bench/result.py``: the command line, the
machine and the numbers (keys ``bandwidth``, ``overlap``, ``control``). Measured results and
the commands that produced them: ``BENCHMARKS.md``, section "Communicator vs raw mpi4py".
"""

from __future__ import annotations

import time

from ssdmpi.bench import result as result_file
from ssdmpi.bench.flags import CommaList, add_json, emit_json, parse_choices
from ssdmpi.bench.stats import median
from ssdmpi.comm.mpi_env import load_mpi
from ssdmpi.parsing import SIZE_SUFFIXES, parse_list

DEFAULT_SIZES = ("1K", "4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M")
PARTS = ("bandwidth", "overlap", "control", "compressed")
STRATEGIES = ("blocking", "test", "poll", "thread")


def _sizes(texts, flag: str = "--sizes") -> list:
    """Bytes of each size; each must hold at least one float32 (4 bytes)."""
    return parse_list(texts, flag, "size", minimum=4, example="64K,4M")


def add_arguments(parser) -> None:
    parser.add_argument("--sizes", action=CommaList, default=",".join(DEFAULT_SIZES), metavar="S1,S2",
                        help="buffer sizes for the bandwidth part, e.g. 64K,4M (default: 1K to 64M by 4x)")
    parser.add_argument("--repeats", type=int, default=15, help="samples per variant and size (default %(default)s)")
    parser.add_argument("--parts", action=CommaList, default=",".join(PARTS), metavar="P1,P2",
                        help=f"which parts to run, from {','.join(PARTS)} (default: all)")
    parser.add_argument("--overlap-size", default="16M", metavar="SIZE",
                        help="buffer size for the overlap and control parts (default %(default)s)")
    parser.add_argument("--compressed-size", default="20M", metavar="SIZE",
                        help="buffer size for the compressed part (default %(default)s)")
    parser.add_argument("--compute-ratio", type=float, default=1.2,
                        help="compute time as a multiple of the allreduce time in the overlap part "
                             "(default %(default)s)")
    parser.add_argument("--pieces", type=int, default=10,
                        help="the compute is cut into this many pieces with progress() between them "
                             "(default %(default)s)")
    parser.add_argument("--strategies", action=CommaList, default=",".join(STRATEGIES), metavar="S1,S2",
                        help=f"progress strategies to compare, from {','.join(STRATEGIES)} (default: all of them)")
    add_json(parser, "the result (one document)", legacy_switch=True)


def bandwidth(world, sizes, repeats: int) -> list:
    """Part (a): one row per size: median seconds per variant, GB/s, paired ratios to raw."""
    import numpy as np

    from ssdmpi.comm.communicator import Communicator
    from ssdmpi.comm.fused_mean import divide

    MPI = load_mpi()

    raw_comm = world.Dup()
    comm = Communicator(world, progress="blocking")
    rows = []
    try:
        for nbytes in sizes:
            buf = np.zeros(nbytes // 4, dtype=np.float32)
            inner = max(1, min(200, (1 << 21) // nbytes))      # small sizes: time batches, not one call
            variants = {
                "raw": lambda buf=buf: raw_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                "sum": lambda buf=buf: comm.allreduce(buf, average=False),
                "mean": lambda buf=buf: comm.allreduce_mean(buf),
                "sum+div": lambda buf=buf: divide(comm.allreduce(buf, average=False), comm.size),
            }
            names = list(variants)
            samples = {name: [] for name in names}
            for name in names:        # warm up each path once
                variants[name]()
            for rep in range(repeats):
                for name in names[rep % len(names):] + names[:rep % len(names)]:
                    world.Barrier()
                    start = time.perf_counter()
                    for _ in range(inner):
                        variants[name]()
                    samples[name].append((time.perf_counter() - start) / inner)
            # Samples are aligned by the barriers: a sample's time is its slowest rank's.
            table = np.array([samples[n] for n in names])
            world.Allreduce(MPI.IN_PLACE, table, op=MPI.MAX)
            row = {"bytes": nbytes}
            for name, times in zip(names, table):
                row[f"{name}_s"] = float(np.median(times))
                row[f"{name}_GBps"] = nbytes / row[f"{name}_s"] / 1e9
            # Paired ratios (samples taken next to each other) cancel the machine's slow drifts.
            row["sum_vs_raw"] = float(np.median(table[0] / table[1]))
            row["mean_vs_raw"] = float(np.median(table[0] / table[2]))
            row["sum+div_vs_raw"] = float(np.median(table[0] / table[3]))
            rows.append(row)
    finally:
        comm.free()
        raw_comm.Free()
    return rows


def _matmul_work(seconds: float, pieces: int):
    """A list of ``pieces`` callables of NumPy matmul work totalling about ``seconds``."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((192, 192)).astype(np.float32)
    out = np.empty_like(a)
    start = time.perf_counter()
    for _ in range(20):
        np.matmul(a, a, out=out)
    one = (time.perf_counter() - start) / 20
    per_piece = max(1, round(seconds / pieces / one))

    def piece():
        for _ in range(per_piece):
            np.matmul(a, a, out=out)
    return [piece] * pieces


def _sleep_work(seconds: float, pieces: int):
    return [lambda: time.sleep(seconds / pieces)] * pieces


def overlap(world, nbytes: int, repeats: int, strategies, ratio: float, pieces: int = 10) -> list:
    """Part (b): one row per (compute kind, strategy)."""
    import numpy as np

    from ssdmpi.comm.communicator import Communicator

    MPI = load_mpi()

    comms = {s: Communicator(world, progress=s) for s in strategies}
    baseline = Communicator(world, progress="blocking")
    buf = np.ones(nbytes // 4, dtype=np.float32)
    rows = []
    try:
        comm_alone = []
        for _ in range(max(5, repeats // 2)):
            world.Barrier()
            start = time.perf_counter()
            baseline.allreduce_mean(buf)
            comm_alone.append(time.perf_counter() - start)
        t_comm = np.array([median(comm_alone)])
        world.Allreduce(MPI.IN_PLACE, t_comm, op=MPI.MAX)     # every rank sizes the same compute
        t_comm = float(t_comm[0])
        for kind, make in (("cpu-bound (matmul)", _matmul_work), ("idle (sleep)", _sleep_work)):
            work = make(ratio * t_comm, pieces)
            alone, totals, comm_only = [], {s: [] for s in strategies}, []
            for s in strategies:
                comms[s].stats.reset()
            for rep in range(repeats):
                world.Barrier()
                start = time.perf_counter()
                for piece in work:
                    piece()
                alone.append(time.perf_counter() - start)
                world.Barrier()
                start = time.perf_counter()
                baseline.allreduce_mean(buf)
                comm_only.append(time.perf_counter() - start)
                order = strategies[rep % len(strategies):] + strategies[:rep % len(strategies)]
                for s in order:
                    c = comms[s]
                    world.Barrier()
                    start = time.perf_counter()
                    handle = c.allreduce_start(buf)
                    for piece in work:
                        piece()
                        c.progress()
                    handle.wait()
                    totals[s].append(time.perf_counter() - start)
            # Per repeat, the slowest rank's times; overlap from the same repeat's three timings.
            names = list(strategies)
            table = np.array([alone, comm_only] + [totals[s] for s in names])
            world.Allreduce(MPI.IN_PLACE, table, op=MPI.MAX)
            t_compute, t_comm_k = table[0], table[1]
            for i, s in enumerate(names):
                stats = np.array([comms[s].stats.snapshot_and_reset()["overlap"]])
                world.Allreduce(MPI.IN_PLACE, stats, op=MPI.MIN)
                total = table[2 + i]
                rows.append({"compute": kind, "strategy": s, "bytes": nbytes, "pieces": pieces,
                             "comm_s": float(np.median(t_comm_k)), "compute_s": float(np.median(t_compute)),
                             "total_s": float(np.median(total)),
                             "overlap": float(np.median((t_comm_k + t_compute - total) / t_comm_k)),
                             "stats_overlap": float(stats[0])})
    finally:
        for c in comms.values():
            c.free()
        baseline.free()
    return rows


CONTROL_POKES, CONTROL_POKE_S = 10, 0.005   # the control part's progress calls before its timed message


def control(world, nbytes: int, repeats: int) -> dict:
    """Part (c): the control allreduce alone and with an ``nbytes`` allreduce in flight (module docstring)."""
    import numpy as np

    from ssdmpi.comm.communicator import Communicator

    MPI = load_mpi()

    comm = Communicator(world, progress="test")
    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    rows = []
    try:
        for _ in range(repeats):
            world.Barrier()
            start = time.perf_counter()
            comm.allreduce_scalars({"x": 1.0}, op="max")
            alone = time.perf_counter() - start
            world.Barrier()
            start = time.perf_counter()
            comm.allreduce_start(buf, average=False).wait()
            big = time.perf_counter() - start
            world.Barrier()
            handle = comm.allreduce_start(buf, average=False)
            for _ in range(CONTROL_POKES):
                time.sleep(CONTROL_POKE_S)
                comm.progress()
            start = time.perf_counter()
            comm.allreduce_scalars({"x": 1.0}, op="max")
            in_flight = time.perf_counter() - start
            handle.wait()
            rows.append([alone, big, in_flight])
    finally:
        comm.free()
    table = np.array(rows)
    world.Allreduce(MPI.IN_PLACE, table, op=MPI.MAX)
    alone, big, in_flight = (float(np.median(table[:, i])) for i in range(3))
    return {"bytes": nbytes, "control_alone_s": alone, "allreduce_s": big, "control_in_flight_s": in_flight}


def compressed(world, nbytes: int, repeats: int) -> list:
    """Part (d): one row per ``--comm-dtype`` (float32 first): median seconds, paired ratio to float32,
    bytes sent per rank."""
    import numpy as np

    from ssdmpi.comm.communicator import Communicator
    from ssdmpi.comm.compressed import DTYPES

    MPI = load_mpi()

    comm = Communicator(world, progress="blocking")
    buf = np.random.default_rng(world.Get_rank()).standard_normal(max(1, nbytes // 4)).astype(np.float32)
    streams = {dtype: comm.compressor(dtype, buf) if dtype != DTYPES[0] else None for dtype in DTYPES}
    sent = {}
    try:
        def variant(dtype):
            return lambda: comm.allreduce_start(buf, average=False, compressor=streams[dtype]).wait() \
                if streams[dtype] is not None else comm.allreduce_start(buf, average=False).wait()
        variants = {dtype: variant(dtype) for dtype in DTYPES}
        for dtype, run in variants.items():     # warm up each path once, and count its bytes
            comm.stats.reset()
            run()
            sent[dtype] = comm.stats.snapshot_and_reset()["bytes_sent"]
        samples = {dtype: [] for dtype in DTYPES}
        for rep in range(repeats):
            for dtype in DTYPES[rep % len(DTYPES):] + DTYPES[:rep % len(DTYPES)]:
                world.Barrier()
                start = time.perf_counter()
                variants[dtype]()
                samples[dtype].append(time.perf_counter() - start)
        table = np.array([samples[d] for d in DTYPES])
        world.Allreduce(MPI.IN_PLACE, table, op=MPI.MAX)
    finally:
        comm.free()
    return [{"dtype": dtype, "bytes": buf.nbytes, "time_s": float(np.median(times)),
             "float32_vs": float(np.median(table[0] / times)), "bytes_sent": int(sent[dtype]),
             "bytes_ratio": sent[dtype] / sent[DTYPES[0]] if sent[DTYPES[0]] else None}
            for dtype, times in zip(DTYPES, table)]


def _print_tables(result: dict) -> None:
    print(f"ssdmpi bench comm: {result['ranks']} ranks, {result['mpi']}")
    if result.get("bandwidth"):
        print("\n(a) allreduce: median time (slowest rank per sample); x/raw = median of paired raw_time/time "
              "(1.0 = as fast as raw mpi4py)")
        print(f"{'size':>8} {'raw GB/s':>9} {'sum GB/s':>9} {'sum/raw':>8} {'mean GB/s':>10} {'mean/raw':>9} "
              f"{'sum+div/raw':>12}")
        for r in result["bandwidth"]:
            print(f"{_size_name(r['bytes']):>8} {r['raw_GBps']:9.3f} {r['sum_GBps']:9.3f} {r['sum_vs_raw']:8.3f} "
                  f"{r['mean_GBps']:10.3f} {r['mean_vs_raw']:9.3f} {r['sum+div_vs_raw']:12.3f}")
    if result.get("overlap"):
        print("\n(b) overlap of allreduce_start + compute + wait; overlap = (t_comm + t_compute - t_total) / t_comm")
        print(f"{'compute':>20} {'strategy':>9} {'comm ms':>8} {'compute ms':>11} {'total ms':>9} "
              f"{'overlap':>8} {'stats':>6}")
        for r in result["overlap"]:
            print(f"{r['compute']:>20} {r['strategy']:>9} {r['comm_s'] * 1e3:8.1f} {r['compute_s'] * 1e3:11.1f} "
                  f"{r['total_s'] * 1e3:9.1f} {r['overlap'] * 100:7.0f}% {r['stats_overlap'] * 100:5.0f}%")
    if result.get("control"):
        r = result["control"]
        print(f"\n(c) a control allreduce (a sync point's) alone and with a {_size_name(r['bytes'])} allreduce "
              "in flight")
        print(f"control alone {r['control_alone_s'] * 1e3:.2f} ms, allreduce alone {r['allreduce_s'] * 1e3:.1f} ms, "
              f"control with it in flight {r['control_in_flight_s'] * 1e3:.1f} ms")
    if result.get("compressed"):
        _print_compressed(result["compressed"])


def _print_compressed(rows: list) -> None:
    print(f"\n(d) a sum of {_size_name(rows[0]['bytes'])} in each --comm-dtype (blocking; slowest rank, median); "
          "x float32 = median of paired float32_time/time")
    print(f"{'dtype':>9} {'ms':>8} {'x float32':>10} {'MB sent/rank':>13} {'bytes/f32':>10}")
    for r in rows:
        ratio = "-" if r["bytes_ratio"] is None else f"{r['bytes_ratio']:.3f}"
        print(f"{r['dtype']:>9} {r['time_s'] * 1e3:8.2f} {r['float32_vs']:10.2f} {r['bytes_sent'] / 1e6:13.2f} "
              f"{ratio:>10}")


def _size_name(nbytes: int) -> str:
    for suffix in ("G", "M", "K"):
        if nbytes >= SIZE_SUFFIXES[suffix] and nbytes % SIZE_SUFFIXES[suffix] == 0:
            return f"{nbytes // SIZE_SUFFIXES[suffix]}{suffix}"
    return str(nbytes)


def run(args) -> int:
    from ssdmpi.errors import UserError

    MPI = load_mpi()

    if args.repeats < 1 or args.pieces < 1:
        raise UserError("--repeats and --pieces must be at least 1")
    sizes = _sizes(args.sizes)
    parts = parse_choices(args.parts, "--parts", PARTS)
    strategies = parse_choices(args.strategies, "--strategies", STRATEGIES)
    world = MPI.COMM_WORLD
    result = {"ranks": world.Get_size(), "mpi": MPI.Get_library_version().splitlines()[0].strip()}
    if world.Get_size() < 2 and world.Get_rank() == 0 and args.json != "-":
        print("note: one rank measures no communication; run under mpiexec -n 2")
    if "bandwidth" in parts:
        result["bandwidth"] = bandwidth(world, sizes, args.repeats)
    size = _sizes([args.overlap_size], "--overlap-size")[0]
    if "overlap" in parts:
        result["overlap"] = overlap(world, size, args.repeats, strategies, args.compute_ratio, args.pieces)
    if "control" in parts:
        result["control"] = control(world, size, args.repeats)
    if "compressed" in parts:
        result["compressed"] = compressed(world, _sizes([args.compressed_size], "--compressed-size")[0], args.repeats)
    if world.Get_rank() == 0:
        if args.json:
            emit_json(args.json, result_file.dumps({**result_file.provenance("comm"), **result}))
        if args.json != "-":
            _print_tables(result)
    return 0
