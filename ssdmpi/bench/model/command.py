"""``ssdmpi bench model``: the command line (flags, checks, relaunch under MPI, output).

Run it as ``ssdmpi bench model --net 1gbit`` (it relaunches itself as
``bin/ssdmpi-netns --rate 1gbit -- mpiexec -n 2 python -m ssdmpi bench model ...``) or
under your own launcher: ``bin/ssdmpi-netns --rate 1gbit -- mpiexec -n 2 ssdmpi bench model
--net 1gbit`` (then ``--net`` only tells the model the nominal rate).
"""

from __future__ import annotations

import json
import os
import sys

from ssdmpi.bench import launch
from ssdmpi.bench.model.alphabeta import analyse, parse_pattern
from ssdmpi.bench.model.measure import measure, sizes_mb
from ssdmpi.bench.model.report import report
from ssdmpi.errors import UserError
from ssdmpi.parsing import parse_list


def add_arguments(parser) -> None:
    parser.add_argument("--net", default="1gbit", metavar="RATE|none",
                        help="network: a tc rate (1gbit, 100mbit) for a throttled namespace, or 'none' "
                             "(shared memory); when not already under mpiexec, the command relaunches "
                             "itself there (default 1gbit)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks when relaunching itself (default 2)")
    parser.add_argument("--model", default="wide-mlp", help="model whose step and gradient are measured")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    parser.add_argument("--fit-sizes", default="4,16,64", metavar="MB,...", help="allreduce sizes the fit uses")
    parser.add_argument("--check-sizes", default="2,8,32", metavar="MB,...",
                        help="held-out allreduce sizes (the model's gradient size is always added)")
    parser.add_argument("--patterns", default="ssgd,step,period:2,period:5,period:10,localsgd:5",
                        metavar="P,...", help="step loops to measure: ssgd, step, period:K, localsgd:K")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per loop (at least 2 periods)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per allreduce size (median)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved repeats of the step loops (median)")
    parser.add_argument("--progress", default="auto", help="allreduce progress strategy (see ssdmpi train)")
    parser.add_argument("--plan-ranks", default="2,4,8,16,32", metavar="N,...")
    parser.add_argument("--plan-gbits", default="1,10,25,100", metavar="G,...", help="link bandwidths, Gbit/s")
    parser.add_argument("--plan-k", type=int, default=5, help="k of the planning table (default 5)")
    parser.add_argument("--plan-compute-ms", type=float, default=None, help="compute per step for planning")
    parser.add_argument("--plan-efficiency", type=float, default=None, help="link efficiency (0, 1] for planning")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write measurements and predictions as JSON")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds, when relaunching (default 1800)")


def _plan_ranks(text: str) -> list:
    return parse_list(text, "--plan-ranks", int, minimum=1, example="2,4,8")


def _plan_gbits(text: str) -> list:
    return parse_list(text, "--plan-gbits", float, minimum=0, strict=True, example="1,10,25")


def _validate(args) -> None:
    for name in ("ranks", "batch_size", "steps", "reps", "repeats", "plan_k"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.ranks < 2:
        raise UserError("--ranks must be at least 2: the model is fitted to a real allreduce")
    launch.parse_rate(args.net)
    sizes_mb(args.check_sizes, "--check-sizes")
    for p in args.patterns.split(","):
        parse_pattern(p)
    _plan_ranks(args.plan_ranks)
    _plan_gbits(args.plan_gbits)
    if args.plan_efficiency is not None and not 0 < args.plan_efficiency <= 1:
        raise UserError(f"--plan-efficiency must be in (0, 1], got {args.plan_efficiency}")
    if args.plan_compute_ms is not None and args.plan_compute_ms <= 0:
        raise UserError(f"--plan-compute-ms must be > 0, got {args.plan_compute_ms}")
    if len(set(fit := sizes_mb(args.fit_sizes, "--fit-sizes"))) < 2:
        raise UserError(f"--fit-sizes needs at least two distinct sizes, got {fit}")


def run(args) -> int:
    _validate(args)
    if not launch.under_launcher():
        return launch.relaunch("bench model", args.ranks, args.net, args.timeout)
    from ssdmpi.comm.communicator import Communicator

    comm = Communicator(progress=args.progress)
    if comm.size < 2:
        comm.free()
        raise UserError("bench model needs at least 2 ranks (mpiexec -n 2 ...)", collective=True)
    say = (lambda text: print(f"[bench model] {text}", file=sys.stderr, flush=True)) if comm.rank == 0 \
        else (lambda text: None)
    say(f"{comm.size} ranks, progress {comm.strategy}, network {args.net}")
    try:
        measured = measure(args, comm, say)
    finally:
        comm.free()
    if comm.rank == 0:
        result = analyse(measured, rate_bps=launch.parse_rate(args.net), efficiency=args.plan_efficiency,
                         plan_ranks=_plan_ranks(args.plan_ranks), plan_gbits=_plan_gbits(args.plan_gbits),
                         plan_compute_s=None if args.plan_compute_ms is None else args.plan_compute_ms / 1e3,
                         plan_k=args.plan_k)
        print(report(measured, result, args.net), end="", flush=True)
        if args.json:
            tmp = f"{args.json}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"net": args.net, "progress": args.progress, "measured": measured, "model": result}, f,
                          indent=2)
            os.replace(tmp, args.json)
    return 0
