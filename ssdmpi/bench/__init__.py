"""``ssdmpi bench KIND``: benchmark harnesses, one module each (``ssdmpi/bench/KIND.py``).

Each module provides ``add_arguments(parser)`` and ``run(args) -> int``, like the
top-level subcommands. Benchmarks print ratios measured side by side in one run.
Shared helpers: ``flags.py`` (one spelling per concept across the subcommands, and the
deprecated old spellings), ``launch.py`` (mpiexec, the throttled network, relaunching under
MPI) and ``stats.py``; of the training benchmarks (``train``, ``peers``): ``variants.py`` (the
variants, from the algorithms' specs), ``runner.py`` (their flags, one launch per run, each run
parsed), ``rows.py`` (each run's numbers against the baseline), ``bounds.py`` (the schedules'
bounds) and ``tables.py`` (Markdown, CSV, the result file).

An outer layer: the benchmarks use the CLI, the public API and configuration, the registry's
specs (``ssdmpi/algos/registry.py``: every algorithm's, rule's and optimizer's name comes from
there) and one run-directory reader, ``ssdmpi/rundir.py``; never the trainer's internals
(``tests/unit/test_bench_layering.py``). Measured results and how they were obtained:
``BENCHMARKS.md``.
"""

from __future__ import annotations

import importlib

from ssdmpi.bench.flags import Formatter

KINDS = {
    "engine": "one training step of ssdmpi's engine vs PyTorch, single-threaded",
    "comm": "allreduce bandwidth vs raw mpi4py, and overlap per progress strategy",
    "train": "whole training runs per algorithm on a throttled network: speed and accuracy",
    "peers": "ssdmpi next to PyTorch DDP and post-local SGD: the same training runs, side by side",
    "model": "alpha-beta communication model: predicted vs measured speedup",
    "accuracy": "final test accuracy (a language model's: validation loss) of W per algorithm, schedule, local update "
                "and k (reference simulator)",
    "stability": "largest stable lr x curvature of each period rule per k and merge delay (linear model)",
    "checkpoint": "what a checkpoint costs: sharded background writes vs the gather to rank 0, per rank count",
    "report": "render BENCHMARKS.md from the result files under docs/results/",
}


def add_arguments(parser) -> None:
    # Subcommand parsers are of the caller's class (the CLI's rank-aware parser).
    sub = parser.add_subparsers(dest="bench_kind", metavar="KIND", parser_class=type(parser))
    sub.required = True
    for kind, help_text in KINDS.items():
        p = sub.add_parser(kind, help=help_text, description=help_text, formatter_class=Formatter)
        module = importlib.import_module(f"ssdmpi.bench.{kind}")
        module.add_arguments(p)
        p.set_defaults(bench_run=module.run)


def run(args) -> int:
    return args.bench_run(args)
