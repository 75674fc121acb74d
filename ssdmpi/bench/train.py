"""``ssdmpi bench train``: the same training job under several algorithms, on a throttled network.

Each variant (``ssdmpi/bench/variants.py``: ``ssgd``, ``ssd:period:5``, ...; by default every
algorithm the specs mark ``bench_default``, at each of ``--delays``) is a whole ``ssdmpi train`` run
on ``--ranks`` ranks, launched as a subprocess in a throttled network namespace, on a namespaced
cluster or over shared memory, ``--repeats`` times interleaved (``ssdmpi/bench/runner.py``). Then
every run directory is read (``ssdmpi/rundir.py``) and the results are written:

- ``OUT/results.md`` and ``OUT/results.csv``: one row per variant, each variant's median over
  repeats, compared with the baseline (``ssdmpi/bench/rows.py`` defines every number;
  ``ssdmpi/bench/tables.py`` the columns), and a second table: the step breakdown and the
  schedule's bounds (``ssdmpi/bench/bounds.py``);
- ``OUT/result.json``: the same rows, the settings, the command line and the machine
  (``ssdmpi/bench/result.py``; what ``ssdmpi bench report`` renders ``BENCHMARKS.md`` from);
- ``OUT/figures/*.png``: ``ssdmpi plot`` of all runs;
- ``OUT/logs/NAME.log``: each run's stdout and stderr.

``OUT`` is ``--out`` (default ``runs/bench-train-<timestamp>``). The defaults run the
communication-bound case of ``BENCHMARKS.md`` (wide-mlp on Fashion-MNIST, 2 ranks, 1 Gbit/s).
Never overwrites: a run directory that already exists is an error unless ``--reuse``, which
parses it instead of training again (to rebuild tables after a change).
"""

from __future__ import annotations

from pathlib import Path

from ssdmpi.bench import result as result_file
from ssdmpi.bench.bounds import bound_note
from ssdmpi.bench.flags import deprecated_alias
from ssdmpi.bench.rows import summarise
from ssdmpi.bench.runner import (
    add_run_arguments,
    check_run_arguments,
    check_variants,
    reused,
    run_jobs,
    run_variants,
    settings_line,
    write_figures,
)
from ssdmpi.bench.tables import (
    BREAKDOWN_COLUMNS,
    breakdown_table,
    columns_for,
    csv_table,
    markdown_table,
    result_json,
)
from ssdmpi.bench.variants import default_variants, forms_text, parse_variant
from ssdmpi.metrics import atomic_write
from ssdmpi.parsing import parse_list


def _delays(text: str) -> list:
    return parse_list(text, "--delays", int, minimum=1, example="2,5,10")


def add_arguments(parser) -> None:
    add_run_arguments(parser, "train")
    delays = parser.add_argument("--delays", default="5", metavar="K1,K2",
                                 help="delays/periods k for the default variants (default %(default)s)")
    deprecated_alias(parser, "--k", delays)
    parser.add_argument("--variants", metavar="V1,V2",
                        help=f"explicit variants instead of the default list: {forms_text()}; parameter servers "
                             "run on ranks of their own")


def _validate(args) -> list:
    check_run_arguments(args)
    if args.variants:
        variants = [parse_variant(v) for v in args.variants.split(",")]
    else:
        variants = default_variants(_delays(args.delays))
    check_variants(args, variants)
    return variants


def run(args) -> int:
    variants = _validate(args)
    earlier = {}
    if args.out and all(reused(args, d) for _, _, d in run_jobs(args, variants)):
        earlier = result_file.earlier_provenance(Path(args.out) / "result.json")     # nothing runs again
    launched = run_variants(args, variants, "train")
    if launched is None:
        return 0
    results, failures = launched
    out = Path(args.out)
    rows = summarise(variants, results, target_drop=args.target_drop / 100.0, target_rise=args.target_rise / 100.0)
    columns = columns_for(rows)
    md, text_csv = markdown_table(rows, columns), csv_table(rows, (columns, BREAKDOWN_COLUMNS))
    md += "\n" + breakdown_table(rows, bound_note(rows))
    atomic_write(out / "results.md", f"<!-- {settings_line(args)} -->\n" + md)
    atomic_write(out / "results.csv", text_csv)
    atomic_write(out / "result.json", result_json(rows, settings_line(args), tables=(columns, BREAKDOWN_COLUMNS),
                                                  **earlier))
    write_figures(args, results)
    print(md, end="")
    print(f"[bench train] wrote {out / 'results.md'}, {out / 'results.csv'}, {out / 'result.json'}, "
          f"{out / 'figures'}/")
    return 1 if failures else 0
