"""``ssdmpi bench KIND``: benchmark harnesses, one module each (``ssdmpi/bench/KIND.py``).

Each module provides ``add_arguments(parser)`` and ``run(args) -> int``, like the
top-level subcommands. Benchmarks print ratios measured side by side in one run.
"""

from __future__ import annotations

import importlib
import importlib.util

from ssdmpi.errors import UserError

KINDS = {
    "engine": "one training step of ssdmpi's engine vs PyTorch, single-threaded",
    "comm": "allreduce bandwidth vs raw mpi4py, and overlap per progress strategy",
    "train": "whole training runs per algorithm on a throttled network: speed and accuracy",
    "model": "alpha-beta communication model: predicted vs measured speedup",
    "accuracy": "final test accuracy of W per algorithm, schedule, local update and k (reference simulator)",
}


def add_arguments(parser) -> None:
    from ssdmpi.cli import Parser

    sub = parser.add_subparsers(dest="bench_kind", metavar="KIND", parser_class=Parser)
    sub.required = True
    for kind, help_text in KINDS.items():
        p = sub.add_parser(kind, help=help_text, description=help_text)
        name = f"ssdmpi.bench.{kind}"
        module = importlib.import_module(name) if importlib.util.find_spec(name) else None
        if module is None:
            p.set_defaults(bench_run=None)
            continue
        module.add_arguments(p)
        p.set_defaults(bench_run=module.run)


def run(args) -> int:
    if args.bench_run is None:
        raise UserError(f"'ssdmpi bench {args.bench_kind}' is not implemented yet")
    return args.bench_run(args)
