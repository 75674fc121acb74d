"""``ssdmpi bench model``: the command line (flags, checks, relaunch under MPI, output).

Run it as ``ssdmpi bench model --net 1gbit`` (it relaunches itself as
``bin/ssdmpi-netns --rate 1gbit -- mpiexec -n 2 python -m ssdmpi bench model ...``) or
under your own launcher: ``bin/ssdmpi-netns --rate 1gbit -- mpiexec -n 2 ssdmpi bench model
--net 1gbit`` (then ``--net`` only tells the model the nominal rate). With ``--nodes N``
it relaunches itself on a namespaced cluster instead (``ssdmpi.bench.launch``), a NIC of
``--net`` per node; ``--fit-from`` predicts this run from an earlier run's link. ``--json FILE``
writes the result file of ``ssdmpi/bench/result.py`` (the command line, the machine,
``measured`` and ``model``).
"""

from __future__ import annotations

import json
import sys

from ssdmpi.bench import launch
from ssdmpi.bench import result as result_file
from ssdmpi.bench.flags import add_json, deprecated_alias, emit_json
from ssdmpi.bench.model.alphabeta import analyse, parse_pattern, pattern_forms
from ssdmpi.bench.model.measure import measure, sizes_mb
from ssdmpi.bench.model.report import report
from ssdmpi.errors import UserError
from ssdmpi.parsing import parse_list


def add_arguments(parser) -> None:
    parser.add_argument("--net", default="1gbit", metavar="RATE|none",
                        help="network: a tc rate (1gbit, 100mbit) for a throttled namespace, or 'none' "
                             "(shared memory); when not already under mpiexec, the command relaunches "
                             "itself there (default %(default)s)")
    parser.add_argument("--ranks", type=int, default=None, help="ranks when relaunching itself (default 2)")
    launch.add_node_arguments(parser)
    parser.add_argument("--fit-from", default=None, metavar="FILE",
                        help="take the link (alpha, beta, overlap slowdowns) from an earlier run's --json FILE "
                             "(e.g. on 2 nodes) instead of fitting it here: every point of this run is held out")
    parser.add_argument("--model", default="wide-mlp",
                        help="model whose step and gradient are measured (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank (default %(default)s)")
    parser.add_argument("--fit-sizes", default="4,16,64", metavar="MB1,MB2",
                        help="allreduce sizes the fit uses, in MB (default %(default)s)")
    parser.add_argument("--check-sizes", default="2,8,32", metavar="MB1,MB2",
                        help="held-out allreduce sizes, in MB (default %(default)s; the model's gradient size is "
                             "always added)")
    parser.add_argument("--patterns", default="blocking,step,period:2,period:5,period:10,averaging:5",
                        metavar="P1,P2", help=f"step loops to measure: {pattern_forms()} (default %(default)s)")
    parser.add_argument("--steps", type=int, default=6,
                        help="measured steps per loop (at least 2 periods; default %(default)s)")
    reps = parser.add_argument("--allreduce-repeats", type=int, default=3,
                               help="repetitions per allreduce size, median (default %(default)s)")
    deprecated_alias(parser, "--reps", reps)
    parser.add_argument("--repeats", type=int, default=1,
                        help="interleaved repeats of the step loops, median (default %(default)s)")
    parser.add_argument("--progress", default="auto",
                        help="allreduce progress strategy (see ssdmpi train; default %(default)s)")
    parser.add_argument("--plan-ranks", default="2,4,8,16,32", metavar="N1,N2",
                        help="rank counts of the planning table (default %(default)s)")
    parser.add_argument("--plan-gbits", default="1,10,25,100", metavar="G1,G2",
                        help="link bandwidths of the planning table, Gbit/s (default %(default)s)")
    plan_delay = parser.add_argument("--plan-delay", type=int, default=5, metavar="K",
                                     help="period k of the planning table (default %(default)s)")
    deprecated_alias(parser, "--plan-k", plan_delay)
    parser.add_argument("--plan-compute-ms", type=float, default=None,
                        help="compute per step for planning (default: the measured one)")
    parser.add_argument("--plan-efficiency", type=float, default=None,
                        help="link efficiency (0, 1] for planning (default: from the fit at --net's rate, "
                             "0.9 with --net none)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the model's initial weights and the random batches (default 0)")
    add_json(parser, "the measurements and predictions")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds, when relaunching (default %(default)s)")


def _plan_ranks(text: str) -> list:
    return parse_list(text, "--plan-ranks", int, minimum=1, example="2,4,8")


def _plan_gbits(text: str) -> list:
    return parse_list(text, "--plan-gbits", float, minimum=0, strict=True, example="1,10,25")


def _fit_from(path: str | None):
    """The ``model`` result of an earlier ``--json`` file (None without ``--fit-from``); one-line errors."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            model = json.load(f)["model"]
        needed = ("alpha_s", "beta_s_per_byte", "fit_a_s", "fit_b_s_per_byte", "compute_slowdown",
                  "comm_slowdown", "fit_ranks")
        missing = [key for key in needed if key not in model]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"--fit-from {path}: not a readable 'bench model --json' file ({exc})") from None
    if missing:
        raise UserError(f"--fit-from {path}: lacks {', '.join(missing)}; write it again with this version's "
                        "bench model --json")
    return model


def _validate(args) -> None:
    args.ranks = launch.node_ranks(args, 2)
    for name in ("ranks", "batch_size", "steps", "allreduce_repeats", "repeats", "plan_delay"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.ranks < 2:
        raise UserError("--ranks must be at least 2: the model is fitted to a real allreduce")
    launch.parse_rate(args.net)
    sizes_mb(args.check_sizes, "--check-sizes")
    for p in map(parse_pattern, args.patterns.split(",")):
        if p.comm.allreduce == "servers" and p.k >= args.ranks:
            raise UserError(f"--patterns {p.kind}:{p.k}: {p.k} server(s) leave no worker among {args.ranks} "
                            "ranks; use fewer servers or more ranks")
    _fit_from(args.fit_from)
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
        return launch.relaunch("bench model", args.ranks, args.net, args.timeout, nodes=args.nodes)
    from ssdmpi.comm.communicator import Communicator

    comm = Communicator(progress=args.progress)
    if comm.size < 2:
        comm.free()
        raise UserError("bench model needs at least 2 ranks (mpiexec -n 2 ...)", collective=True)
    patterns = map(parse_pattern, args.patterns.split(","))
    served = max([p for p in patterns if p.comm.allreduce == "servers"], key=lambda p: p.k, default=None)
    if served is not None and served.k >= comm.size:
        comm.free()
        raise UserError(f"--patterns {served.kind}:{served.k} needs more than {served.k} ranks, got {comm.size}",
                        collective=True)
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
                         plan_k=args.plan_delay, fit_from=_fit_from(args.fit_from),
                         shared_link=args.nodes is None)
        if args.json != "-":
            print(report(measured, result, args.net), end="", flush=True)
        if args.json:
            emit_json(args.json, result_file.dumps({**result_file.provenance("model"), "net": args.net,
                                                    "nodes": args.nodes, "progress": args.progress,
                                                    "fit_from": args.fit_from, "measured": measured,
                                                    "model": result}))
    return 0
