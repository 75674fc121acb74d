"""``ssdmpi bench checkpoint``: what a checkpoint costs the training, ``ssdmpi train``'s sharded
background writer against the gather-to-rank-0 single file it replaced, at several rank counts.

For each layout of ``--layouts`` (``N``: N ranks on this machine; ``NODESxR``: a namespaced
cluster of NODES nodes with R ranks each, ``bin/ssdmpi-cluster``, docs/CLUSTER.md) the command
relaunches itself under MPI. The ranks build ``--model`` (default wide-mlp, 20 M parameters)
with the default algorithm at its defaults (``ssd --comm period``, k = 5) from its first step, so
that every rank holds what a delay-stage checkpoint holds (W, M, its own L, U and S, a held mean),
assembled as ``ssdmpi train`` assembles it from the parts' own ``state_dict`` (``state_tree``), on
synthetic data, and
then run ``--repeats`` rounds, each of: plain steps (the baseline step time), and the two paths
in alternating order:

- ``gather``: format 1's path, kept here (``save_gathered``): every rank's state copied, sent
  to rank 0 one rank at a time, written by rank 0 into one file, while every rank waits;
- ``sharded``: ``CheckpointWriter.save(background=True)`` as ``ssdmpi train`` calls it, then
  training steps go on, each followed by ``poll`` (the baseline steps make the same small
  allreduce), until the commit.

Each number is the slowest rank's, median over the rounds:

    bytes_rank  bytes a rank writes (sharded: the largest rank file; gather: rank 0's file)
    drain_s     completing the allreduce in flight before the state is taken (both paths; not
                counted below: training waits for it at any checkpoint)
    wall_s      from the checkpoint's start to its commit (gather: to its end)
    write_s     sharded: the writer thread's time (the I/O, fsync and checksums)
    call_s      sharded: the save call (the copies into host memory)
    slowdown_s  sharded: the time the steps that ran while the thread wrote took above the
                baseline's median step
    stall_s     what training lost: gather: wall_s; sharded: call_s + slowdown_s
    copy_s      the time to copy this rank's own part of the state (its arrays and its pieces of
                W, M, the held mean) into buffers allocated beforehand: the floor of a stall

Goals: sharded ``stall_s <= 1.5 x copy_s``; sharded ``write_s`` flat in N at a fixed number of
ranks per node (gather grows with N). Run on a quiet machine, as root for the cluster layout::

    ssdmpi bench checkpoint --out runs/bench-checkpoint

Output: a table on stdout, ``OUT/result.json`` (the result file of ``ssdmpi/bench/result.py``:
the command, the machine, ``rows`` as in the table, ``layouts`` with every number) and
``OUT/results.csv`` (the rows). Checkpoints are written under ``OUT/ckpt-<layout>/`` and removed
afterwards. Started under ``mpiexec`` by hand it measures that world alone (``--json FILE``: its
result file).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from ssdmpi.algos import registry
from ssdmpi.bench import launch
from ssdmpi.bench import result as result_file
from ssdmpi.bench.flags import add_json, emit_json
from ssdmpi.errors import UserError

PATHS = ("gather", "sharded")
COLUMNS = ("layout", "ranks", "nodes", "path", "num_params", "bytes_rank", "drain_s", "wall_s", "write_s", "call_s",
           "slowdown_s", "stall_s", "copy_s", "stall_over_copy", "steps_while_writing")
GOAL_STALL = 1.5


def add_arguments(parser) -> None:
    parser.add_argument("--layouts", default="2,4,4x2", metavar="L1,L2",
                        help="rank layouts: N (N ranks here) or NODESxR (a namespaced cluster of NODES nodes, R "
                             "ranks each; needs root) (default %(default)s)")
    parser.add_argument("--model", default="wide-mlp", help="model whose state is checkpointed (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds per layout, median (default %(default)s)")
    parser.add_argument("--plain-steps", type=int, default=6, help="baseline steps per round (default %(default)s)")
    parser.add_argument("--max-steps", type=int, default=500,
                        help="steps to wait for a background write before waiting for it outright "
                             "(default %(default)s)")
    parser.add_argument("--progress", default="auto", help="allreduce progress strategy (see ssdmpi train)")
    parser.add_argument("--out", metavar="DIR", help="results and scratch checkpoints (default runs/bench-checkpoint-"
                                                     "<timestamp>)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per layout (default %(default)s)")
    add_json(parser, "the result file (ssdmpi/bench/result.py)")


def parse_layouts(text: str) -> list:
    """``"2,4,4x2"`` -> ``[(label, ranks, nodes or None, ranks per node)]``; ``UserError`` if malformed."""
    layouts = []
    for item in str(text).split(","):
        item = item.strip().lower()
        nodes, cross, per = item.partition("x")
        if not nodes.isdigit() or int(nodes) < 1 or (cross and not (per.isdigit() and int(per) >= 1)):
            raise UserError(f"--layouts: {item!r} is not N or NODESxR (e.g. 2,4,4x2)")
        if cross:
            layouts.append((f"{nodes}x{per}", int(nodes) * int(per), int(nodes), int(per)))
        else:
            layouts.append((item, int(nodes), None, int(nodes)))
    return layouts


# --- format 1's path, as it was --------------------------------------------------------------------

def save_gathered(comm, path: str, meta: dict, tree: dict, shared: dict | None) -> None:
    """Collective: every rank's ``tree`` to rank 0 one rank at a time (``gather_trees``), rank 0 writes
    them into one format-1 file, every rank waits for the outcome (format 1's ``save_collective``)."""
    from ssdmpi.checkpoint import format as format1

    states = comm.gather_trees(tree, root=0)
    if comm.rank == 0:
        format1.write_checkpoint(path, dict(meta, world_size=comm.size), states, shared)
    comm.broadcast_object(None, root=0)


# --- the measurement (every rank) -----------------------------------------------------------------

def state_tree(model, algo, loader, step: int, copy: bool = True) -> tuple[dict, tuple]:
    """``(tree, replicated)``: this rank's state in the layout of a checkpoint (``ssdmpi/checkpoint/
    sharded.py``), from the parts' own ``state_dict`` (the algorithm's drains it first): host copies,
    or with ``copy=False`` the live buffers; ``replicated``: the paths identical on every rank."""
    from ssdmpi import backend

    buffers = {k: backend.to_host(v).copy() if copy else v for k, v in model.buffers().items()}
    tree = {"algo": algo.state_dict(copy=copy), "model": {"buffers": buffers}, "loader": loader.state_dict(),
            "trainer": {"step": step}}
    return tree, tuple(f"algo/{k}" for k in algo.replicated())


class Bench:
    """One rank's training state, its writer, and the step the measurements repeat."""

    def __init__(self, args, comm, directory: str):
        import numpy as np

        from ssdmpi.algos import AlgoConfig, build_algorithm
        from ssdmpi.checkpoint import CheckpointWriter
        from ssdmpi.data import ShardedLoader
        from ssdmpi.nn import build_model
        self.comm, self.directory = comm, directory
        self.model = build_model(args.model, (1, 28, 28), 10, seed=0)
        comm.broadcast(self.model.params, root=0)
        rng = np.random.default_rng(0)
        n = 8 * args.batch_size * comm.size                 # 8 steps an epoch: the loader's state is real
        x = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
        y = rng.integers(0, 10, n)
        self.loader = ShardedLoader(x, y, args.batch_size, comm.rank, comm.size, seed=0)
        config = AlgoConfig(algo=registry.DEFAULT_ALGORITHM, warmup_steps=0, lr=0.01)
        self.algo = build_algorithm(config, self.model, comm)
        self.step_count = 0
        self.writer = CheckpointWriter(directory, keep=1)
        self.meta = {"epoch": 0.0, "stage": "delay", "model": args.model, "num_params": int(self.model.params.size),
                     "dataset": "synthetic", "algo": registry.DEFAULT_ALGORITHM, "reason": "bench",
                     "config": {"model": args.model}}

    def state(self, copy: bool = True) -> tuple[dict, tuple]:
        return state_tree(self.model, self.algo, self.loader, self.step_count, copy)

    def step(self) -> float:
        """One training step and a one-scalar allreduce (what ``poll`` costs); its seconds."""
        t0 = time.perf_counter()
        xb, yb = self.loader.next_batch()
        self.algo.step(xb, yb)
        self.step_count += 1
        self.comm.allreduce_scalars({"busy": 0.0}, op="max")
        return time.perf_counter() - t0

    def copy_time(self, repeats: int = 3) -> float:
        """Seconds to copy this rank's own arrays and its pieces of the shared ones into buffers made
        beforehand (plain ``np.copyto``), the median of ``repeats``."""
        import numpy as np

        from ssdmpi.checkpoint.sharded import piece

        tree, replicated = self.state(copy=False)
        arrays = []

        def walk(prefix, node):
            for key, value in node.items():
                path = f"{prefix}{key}"
                if isinstance(value, dict):
                    walk(path + "/", value)
                elif isinstance(value, np.ndarray) and value.ndim >= 1:
                    arrays.append(value[piece(value.size, self.comm.rank, self.comm.size)] if path in replicated
                                  else value)
        walk("", tree)
        buffers = [np.ones_like(a) for a in arrays]
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for dst, src in zip(buffers, arrays):
                np.copyto(dst, src)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def drain(self) -> float:
        t0 = time.perf_counter()
        self.algo.drain()
        return time.perf_counter() - t0

    def gather_round(self, path: str) -> dict:
        drain = self.drain()
        t0 = time.perf_counter()
        tree, _ = self.state()
        shared = {"model": {"global_weights": tree["algo"]["W"], "buffers": {}}} if self.comm.rank == 0 else None
        save_gathered(self.comm, path, dict(self.meta, step=self.step_count), tree, shared)
        wall = time.perf_counter() - t0
        size = os.path.getsize(path) if self.comm.rank == 0 else 0
        return {"bytes_rank": size, "drain_s": drain, "wall_s": wall, "write_s": wall, "call_s": wall,
                "slowdown_s": 0.0, "stall_s": wall, "steps_while_writing": 0}

    def sharded_round(self, baseline: float, max_steps: int) -> dict:
        drain = self.drain()
        t0 = time.perf_counter()
        tree, replicated = self.state(copy=False)
        records = self.writer.save(self.comm, self.step_count, dict(self.meta), tree, replicated, background=True)
        call = time.perf_counter() - t0
        slowdown, steps = 0.0, 0
        while not records and steps < max_steps:
            t = time.perf_counter()
            xb, yb = self.loader.next_batch()
            self.algo.step(xb, yb)
            self.step_count += 1
            records = self.writer.poll(self.comm)
            slowdown += (time.perf_counter() - t) - baseline
            steps += 1
        if not records:
            t = time.perf_counter()
            records = self.writer.complete(self.comm)
            slowdown += time.perf_counter() - t
        record = records[-1]
        slowdown = max(0.0, slowdown)
        return {"bytes_rank": max(record["bytes_per_rank"]), "drain_s": drain, "wall_s": time.perf_counter() - t0,
                "write_s": record["write_s"], "call_s": call, "slowdown_s": slowdown, "stall_s": call + slowdown,
                "steps_while_writing": steps}


def measure(args, comm) -> dict:
    """Collective: every round of the module docstring; the slowest rank's medians per path."""
    directory = os.path.join(args.out, f"ckpt-{comm.size}")
    if comm.rank == 0:
        os.makedirs(directory, exist_ok=True)
    comm.barrier()
    bench = Bench(args, comm, directory)
    rounds: dict = {p: [] for p in PATHS}
    copies = []
    try:
        for _ in range(3):                               # the first steps allocate; a held mean appears
            bench.step()
        bench.sharded_round(0.0, args.max_steps)         # the writer's buffers allocated once, as in training
        for r in range(args.repeats):
            baseline = statistics.median(bench.step() for _ in range(max(1, args.plain_steps)))
            baseline = comm.allreduce_scalars({"b": baseline}, op="max")["b"]
            copies.append(comm.allreduce_scalars({"c": bench.copy_time()}, op="max")["c"])
            for path in (PATHS if r % 2 == 0 else PATHS[::-1]):
                result = (bench.gather_round(os.path.join(directory, "gathered.h5")) if path == "gather"
                          else bench.sharded_round(baseline, args.max_steps))
                rounds[path].append(comm.allreduce_scalars(result, op="max"))
    finally:
        bench.writer.close()
        comm.barrier()
        if comm.rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
    copy_s = statistics.median(copies)
    out = {"ranks": comm.size, "model": args.model, "num_params": int(bench.model.params.size), "copy_s": copy_s}
    for path, values in rounds.items():
        row = {key: statistics.median(v[key] for v in values) for key in values[0]}
        row["stall_over_copy"] = row["stall_s"] / copy_s if copy_s > 0 else None
        out[path] = row
    return out


# --- the driver -----------------------------------------------------------------------------------

def run(args) -> int:
    if args.repeats < 1:
        raise UserError(f"--repeats must be at least 1, got {args.repeats}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    layouts = parse_layouts(args.layouts)
    if args.out is None:
        args.out = os.path.join("runs", f"bench-checkpoint-{time.strftime('%Y%m%d-%H%M%S')}")
    if launch.under_launcher():
        return _worker(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for label, ranks, nodes, per_node in layouts:
        layout_file = out / f"layout-{label}.json"
        argv = ["bench", "checkpoint", "--model", args.model, "--batch-size", str(args.batch_size), "--repeats",
                str(args.repeats), "--plain-steps", str(args.plain_steps), "--max-steps", str(args.max_steps),
                "--progress", args.progress, "--out", str(out.resolve()), "--json", str(layout_file.resolve())]
        rc = launch.relaunch(f"bench checkpoint {label}", ranks, "none", args.timeout, argv, nodes=nodes)
        if rc != 0:
            raise UserError(f"bench checkpoint: layout {label} failed (exit {rc}); see the output above")
        (measured,) = json.loads(layout_file.read_text())["layouts"]
        results.append(dict(measured, layout=label, nodes=nodes or 1, ranks_per_node=per_node))
    text = result_file.dumps(document(results))
    (out / "result.json").write_text(text)
    (out / "results.csv").write_text(csv_table(results))
    if args.json:
        emit_json(args.json, text)
    if args.json != "-":
        print(report(results))
        print(f"[bench checkpoint] wrote {out / 'result.json'}, {out / 'results.csv'}")
    return 0


def document(results: list) -> dict:
    """The result file: provenance, the table's ``rows``, every number per layout, the goal."""
    return {**result_file.provenance("checkpoint"), "rows": rows(results), "layouts": results,
            "goal_stall_over_copy": GOAL_STALL}


def _worker(args) -> int:
    """Under MPI (relaunched, or started under mpiexec by hand): measure this world; rank 0 writes
    ``--json`` and prints the table (not with ``--json -``)."""
    from ssdmpi.comm.communicator import Communicator

    with Communicator(progress=args.progress) as comm:
        measured = measure(args, comm)
        if comm.rank == 0:
            results = [dict(measured, layout=str(comm.size), nodes=1, ranks_per_node=comm.size)]
            if args.json:
                emit_json(args.json, result_file.dumps(document(results)))
            if args.json != "-":
                print(report(results))
    return 0


def rows(results: list) -> list:
    """One row per layout and path (``COLUMNS``)."""
    out = []
    for r in results:
        for path in PATHS:
            row = r[path]
            out.append({"layout": r["layout"], "ranks": r["ranks"], "nodes": r["nodes"], "path": path,
                        "num_params": r["num_params"], "copy_s": r["copy_s"],
                        **{key: row[key] for key in COLUMNS if key in row}, "bytes_rank": int(row["bytes_rank"])})
    return out


def csv_table(results: list) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows(results))
    return buf.getvalue()


def report(results: list) -> str:
    """The Markdown table and the two goals, each met or not."""
    lines = ["| layout | ranks | path | MB per rank | drain s | wall s | write s | call s | slowdown s | stall s | "
             "copy s | stall / copy |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows(results):
        ratio = "-" if row["stall_over_copy"] is None else f"{row['stall_over_copy']:.2f}"
        lines.append(f"| {row['layout']} | {row['ranks']} | {row['path']} | {row['bytes_rank'] / 1e6:.1f} | "
                     f"{row['drain_s']:.4f} | {row['wall_s']:.3f} | {row['write_s']:.3f} | {row['call_s']:.4f} | "
                     f"{row['slowdown_s']:.4f} | {row['stall_s']:.4f} | {row['copy_s']:.4f} | {ratio} |")
    lines.append("")
    for r in results:
        ratio = r["sharded"]["stall_over_copy"]
        met = ratio is not None and ratio <= GOAL_STALL
        lines.append(f"{r['layout']}: sharded stall {r['sharded']['stall_s']:.4f} s = "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} x the copy ({r['copy_s']:.4f} s): "
                     f"{'met' if met else 'not met'} (goal <= {GOAL_STALL:g}x)")
    by_node = {}
    for r in results:
        by_node.setdefault(r["ranks_per_node"], []).append(r)
    for per_node, group in sorted(by_node.items()):
        if len(group) > 1:
            first = group[0]["sharded"]["write_s"]
            spread = ", ".join(f"{g['layout']}: {g['sharded']['write_s']:.3f} s" for g in group)
            worst = max(g["sharded"]["write_s"] for g in group) / first if first > 0 else float("inf")
            lines.append(f"{per_node} rank(s) per node, sharded write time: {spread} (largest / first "
                         f"{worst:.2f}x)")
    return "\n".join(lines)
