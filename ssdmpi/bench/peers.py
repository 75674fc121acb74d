"""``ssdmpi bench peers``: ssdmpi next to what users would pick instead, PyTorch DDP and PyTorch's
post-local SGD, in one run.

Every variant is a whole training run launched, interleaved and parsed by ``bench train``'s
machinery (``ssdmpi/bench/train.py``: the same flags, ``--preset``, network, ``--nodes``,
``--repeats``, ``--reuse``, output layout), so all of them train the same model from the same
initial weights on the same samples in the same order, with the same global batch, learning-rate
schedule, optimizer (momentum SGD, or AdamW with its gradient clipping), weight decay (on the
tensors the engine decays) and seed. The PyTorch peers are ``ssdmpi/bench/torch_peer.py`` (one
rank program that takes ``ssdmpi train``'s flags), run where an ``ssdmpi train`` run would be; with
a text dataset (``--preset text-gpt``) they train the language model, nanoGPT's module on the same
token windows. ``--variants`` (default ``DEFAULT_VARIANTS``):

==================== =======================================================================
``ddp``              PyTorch DDP over gloo, DDP's default bucket (25 MiB)
``ddp:MB``           the same with ``bucket_cap_mb`` MB (a tuned bucket)
``postlocal:K``      PyTorch post-local SGD: DDP for the warm-up, then a
                     ``PeriodicModelAverager`` every K steps (aligned with ssdmpi's localsgd)
``ssgd``             ssdmpi's SSGD: its allreduce overlapped with the backward pass in buckets
                     of DDP's default size (``ssdmpi/algos/overlap.py``)
``ssgd:no-overlap``  the same with one bucket (``--bucket-size 1G``): one blocking allreduce
                     after the backward pass
``ssd``              ssdmpi's SSD-SGD with its default schedule and k
``localsgd:K``, ...  any ``bench train`` variant (``ssd:period:K``, ``ssd:step:K``, ``odsgd``)
``V@PROGRESS``       an ssdmpi variant with ``--progress PROGRESS`` (``test|poll|thread|blocking``)
==================== =======================================================================

Results in ``OUT`` (``--out``, default ``runs/bench-peers-<timestamp>``), as ``bench train``
writes them: ``results.md`` (three tables: each variant against DDP -- samples/s, final test
accuracy, time to ssgd's final accuracy minus ``--target-drop`` points and each one's ratio to
DDP's; ``bench train``'s step breakdown; the backward-overlap bound of the ssgd variants),
``results.csv`` (one row per variant, every column), ``result.json`` (the result file of
``ssdmpi/bench/result.py``: the command line, the machine, the settings, the compute probe,
the rows; what ``ssdmpi bench report`` renders from), ``figures/``, ``logs/``, ``runs/``. A
language model's runs (``peer_columns``) give tokens/s and its ratio to DDP's, the final
validation loss (nats per token), its difference to DDP's (``loss_vs_ddp``) and to ssgd's in
percent of theirs, and the time to ssgd's final loss plus ``--target-rise`` percent.

The compute probe (``ssdmpi/bench/probe.py``): after the runs, this process times one forward
pass, one backward pass and one update of the model at the per-rank batch, ssdmpi's engine and the
PyTorch twin interleaved (``--probe-repeats``, medians), with the threads each rank gets. It says how
much of a gap is engine speed, and splits ssgd's measured forward+backward into ``c_fwd`` and
``c_bwd`` for the overlap bound ``max(c_bwd, T) + c_fwd + update`` (``T``: ssgd:no-overlap's
allreduce). It times the image models only: a language model's benchmark has none.

PyTorch is a benchmark peer only: without it, a variant list with PyTorch peers is refused
in one line saying what to install (exit 2, nothing created).
"""

from __future__ import annotations

from pathlib import Path

from ssdmpi.algos import registry
from ssdmpi.bench.probe import compute_probe, probe_line
from ssdmpi.bench.result import command_line
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
from ssdmpi.bench.torch_peer import PEERS
from ssdmpi.bench.variants import Variant, forms, parse_variant
from ssdmpi.data.names import TEXT_DATASETS
from ssdmpi.errors import UserError
from ssdmpi.metrics import atomic_write

PEER = "ssdmpi.bench.torch_peer"
BASE, DEFAULT_ALGO = registry.BASELINE, registry.DEFAULT_ALGORITHM   # ssdmpi's baseline; ssdmpi train's default
BASE_PEER = registry.ALGORITHMS[BASE].torch_peer      # ``ddp``: the peer the tables compare with
NO_OVERLAP = "no-overlap"    # ``BASE:no-overlap``: the baseline with one bucket (NO_OVERLAP_BUCKET)
PROGRESS = ("test", "poll", "thread", "blocking")
NO_OVERLAP_BUCKET = "1G"     # larger than any model here: one bucket, the blocking allreduce


def _defaults(algo: str) -> str:
    """``:V1:V2``: the defaults of ``algo``'s bench settings, as a variant writes them."""
    return "".join(f":{registry.SETTINGS[n].default}" for n in registry.ALGORITHMS[algo].bench)


# The baseline's peer at DDP's bucket and at 1 MB, the other peers at their algorithms' defaults, then
# ssdmpi's baseline with and without the overlap, its default algorithm and the other peers' algorithms.
_OTHERS = [(peer, algo) for peer, algo in PEERS.items() if peer != BASE_PEER]
DEFAULT_VARIANTS = ",".join([BASE_PEER, f"{BASE_PEER}:1", *(peer + _defaults(algo) for peer, algo in _OTHERS),
                             BASE, f"{BASE}:{NO_OVERLAP}", DEFAULT_ALGO,
                             *(algo + _defaults(algo) for _, algo in _OTHERS)])

# The first table: each variant against DDP (the first ddp variant) and ssgd.
PEER_COLUMNS = (
    ("name", "variant"),
    ("samples_per_s", "samples/s"),
    ("x_ddp", "samples/s / DDP's"),
    ("final_acc", "final test acc %"),
    ("acc_vs_ddp", "acc - DDP (points)"),
    ("acc_delta", f"acc - {BASE} (points)"),
    ("tta_s", "time to target s"),
    ("tta_x_ddp", "time to target / DDP's"),
    ("wall_s", "train s"),
    ("mb_per_step", "MB sent/step"),
    ("status", "status"),
)
# The third: ssgd's step against the bound of a perfect backward overlap.
OVERLAP_COLUMNS = (
    ("name", "variant"),
    ("step_ms", "step ms"),
    ("fwd_ms", "c_fwd ms"),
    ("bwd_ms", "c_bwd ms"),
    ("update_ms", "update ms"),
    ("T_ms", "T ms (no-overlap allreduce)"),
    ("overlap_bound_ms", "bound ms"),
    ("of_overlap_bound", "bound / step"),
)
# A language model's runs: the first table's DDP columns in tokens/s and validation loss (the others as
# ``tables.columns_for`` swaps them for bench train).
LANGUAGE_PEER_COLUMNS = {
    "x_ddp": ("x_ddp", "tokens/s / DDP's"),
    "acc_vs_ddp": ("loss_vs_ddp", "val loss vs DDP %"),
}


def peer_columns(rows) -> tuple:
    """The first table's columns for ``rows``: ``PEER_COLUMNS``, or for a language model's runs
    (``columns_for`` swaps its columns in) with ``LANGUAGE_PEER_COLUMNS`` too."""
    columns = columns_for(rows, PEER_COLUMNS)
    if columns == PEER_COLUMNS:
        return columns
    return tuple(LANGUAGE_PEER_COLUMNS.get(key, (key, header)) for key, header in columns)


def tables_of(rows) -> tuple:
    """Every row's keys in results.csv and result.json: the three tables' columns."""
    return (peer_columns(rows), BREAKDOWN_COLUMNS, OVERLAP_COLUMNS)


def parse_peer_variant(spec: str) -> Variant:
    """One ``--variants`` item (module docstring) -> its ``Variant``; ``UserError`` otherwise."""
    spec = spec.strip()
    base, _, progress = spec.partition("@")
    parts = base.split(":")
    try:
        if parts[0] in PEERS:
            if progress:
                raise ValueError(progress)
            return _torch_variant(parts)
        if base == DEFAULT_ALGO:     # its default settings spelt out (the tables' bounds need them)
            spec = registry.algorithm(base)
            v = Variant(base, base, {k: registry.SETTINGS[k].default for k in spec.bench})
        elif base == f"{BASE}:{NO_OVERLAP}":
            v = Variant(f"{BASE}-{NO_OVERLAP}", BASE, extra=("--bucket-size", NO_OVERLAP_BUCKET))
        else:
            v = parse_variant(base)
    except (ValueError, UserError):
        raise UserError(f"--variants: {spec!r} is not understood; use {', '.join(_peer_forms())}, "
                        f"{BASE}:{NO_OVERLAP}, {DEFAULT_ALGO}, or a bench train variant "
                        f"({', '.join(text for text, _, _ in forms())}), an ssdmpi one optionally with "
                        f"@PROGRESS ({'|'.join(PROGRESS)})") from None
    if progress:
        if progress not in PROGRESS:
            raise UserError(f"--variants: {spec!r}: the progress strategy after @ must be one of "
                            f"{', '.join(PROGRESS)}")
        v.name, v.extra = f"{v.name}-{progress}", v.extra + ("--progress", progress)
    return v


def _torch_variant(parts: list) -> Variant:
    """A PyTorch peer's variant: ``PEER`` or ``PEER:MB`` (its DDP bucket) for a peer of an algorithm
    without bench settings (``ddp``, ``ddp:25``), else ``PEER:V...``, the values of its algorithm's bench
    settings as a ``bench train`` variant gives them (``postlocal:5``); ``ValueError`` (or ``UserError``)
    on anything else."""
    peer, values = parts[0], parts[1:]
    algo = PEERS[peer]
    program = (PEER, "--peer", peer)
    if registry.ALGORITHMS[algo].bench:
        if not values:
            raise ValueError(parts)
        v = parse_variant(":".join([algo, *values]))
        return Variant(peer + v.name[len(algo):], algo, v.settings, program=program)
    if not values:
        return Variant(peer, algo, program=program)
    if len(values) == 1 and int(values[0]) >= 1:
        mb = int(values[0])
        return Variant(f"{peer}-b{mb}", algo, extra=("--bucket-size", f"{mb}M"), program=program)
    raise ValueError(parts)


def _peer_forms() -> list:
    """How ``--variants`` names the PyTorch peers: ``ddp``, ``ddp:MB``, ``postlocal:K`` (from the forms of
    the algorithms they mirror)."""
    out = []
    for peer, algo in PEERS.items():
        if registry.ALGORITHMS[algo].bench:
            out += [peer + text[len(algo):] for text, spec, _ in forms() if spec.name == algo]
        else:
            out += [peer, f"{peer}:MB"]
    return out


def check_torch(args, variants) -> None:
    """``UserError`` (one line: what to install) when PyTorch peers must run and PyTorch is missing.

    A peer whose run ``--reuse`` finds complete is only parsed, so it needs no PyTorch."""
    from ssdmpi.verify.torch_ref import torch_available

    to_run = {v.name for v, _, run_dir in run_jobs(args, variants)
              if not reused(args, run_dir)}
    peers = [v.name for v in variants if not v.by_ssdmpi and v.name in to_run]
    ok, why = torch_available()
    if peers and not ok:
        raise UserError(f"the PyTorch peers ({', '.join(peers)}) need PyTorch: {why}; pip install torch "
                        "(a benchmark peer only), or leave them out of --variants")


# ----------------------------------------------------------------------------- against DDP

def compare_to_ddp(rows, variants) -> None:
    """Add each row's ratios to DDP's (the first ddp variant): ``x_ddp`` (samples/s; a language model's:
    tokens/s), ``acc_vs_ddp`` (points of test accuracy) or, for a language model, ``loss_vs_ddp`` (the
    final validation loss's difference in percent of DDP's), ``tta_x_ddp`` (time to target)."""
    peer_of = {v.name: v for v in variants}
    ddp = next((r for r in rows if r["name"] in peer_of and peer_of[r["name"]].program[-1] == BASE_PEER
                and r.get("samples_per_s")), None)
    if ddp is None:
        return
    speed = "tokens_per_s" if ddp.get("tokens_per_s") else "samples_per_s"
    for row in rows:
        if row.get(speed) is not None:
            row["x_ddp"] = row[speed] / ddp[speed]
        if row.get("final_acc") is not None and ddp.get("final_acc") is not None:
            row["acc_vs_ddp"] = row["final_acc"] - ddp["final_acc"]
        if row.get("final_loss") is not None and ddp.get("final_loss"):
            row["loss_vs_ddp"] = 100 * (row["final_loss"] / ddp["final_loss"] - 1)
        if row.get("tta_s") is not None and ddp.get("tta_s"):
            row["tta_x_ddp"] = row["tta_s"] / ddp["tta_s"]


def add_overlap_bounds(rows, variants, probe) -> list:
    """The ssgd rows' bound with a perfect backward overlap, ``max(c_bwd, T) + c_fwd + update`` per
    step: ``T`` is ssgd:no-overlap's allreduce time in flight (one blocking allreduce per step);
    ``c_fwd``/``c_bwd`` split the row's own forward+backward time as the probe's engine does
    (``fwd_share``). The rows that have it (empty without a no-overlap row or a probe)."""
    by_name = {v.name: v for v in variants}
    blocking = next((r for r in rows if r["name"].startswith(f"{BASE}-{NO_OVERLAP}") and r.get("inflight_ms")),
                    None)
    share = (probe or {}).get("engine_fwd_share")
    if blocking is None or share is None:
        return []
    out = []
    for row in rows:
        v = by_name.get(row["name"])
        if v is None or not v.by_ssdmpi or not v.spec.baseline or row.get("fb_ms") is None:
            continue
        fwd, bwd, update, T = share * row["fb_ms"], (1 - share) * row["fb_ms"], row.get("update_ms") or 0.0, \
            blocking["inflight_ms"]
        row.update(fwd_ms=fwd, bwd_ms=bwd, T_ms=T, overlap_bound_ms=max(bwd, T) + fwd + update)
        if row.get("step_ms"):
            row["of_overlap_bound"] = row["overlap_bound_ms"] / row["step_ms"]
        out.append(row)
    return out


# ----------------------------------------------------------------------------- command

def add_arguments(parser) -> None:
    add_run_arguments(parser, "peers")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, metavar="V1,V2",
                        help=f"{', '.join(_peer_forms())} (MB: bucket_cap_mb), {BASE}, {BASE}:{NO_OVERLAP}, "
                             f"{DEFAULT_ALGO}, any bench train variant; an ssdmpi one may end in @PROGRESS "
                             f"({'|'.join(PROGRESS)}) (default {DEFAULT_VARIANTS})")
    parser.add_argument("--probe-repeats", type=int, default=5, metavar="N",
                        help="timed forward/backward passes of the compute probe per engine (0: no probe; default "
                             "%(default)s)")


def run(args) -> int:
    check_run_arguments(args)
    if args.probe_repeats < 0:
        raise UserError(f"--probe-repeats must be >= 0, got {args.probe_repeats}")
    variants = [parse_peer_variant(v) for v in args.variants.split(",") if v.strip()]
    if not variants:
        raise UserError(f"--variants is empty; give at least one, e.g. {BASE_PEER},{BASE}")
    check_variants(args, variants)
    if not args.dry_run:
        check_torch(args, variants)
    launched = run_variants(args, variants, "peers")
    if launched is None:
        return 0
    results, failures = launched
    out = Path(args.out)
    probe = None if args.dataset in TEXT_DATASETS else compute_probe(args, args.probe_repeats)
    rows = summarise(variants, results, target_drop=args.target_drop / 100.0, target_rise=args.target_rise / 100.0)
    compare_to_ddp(rows, variants)
    overlap = add_overlap_bounds(rows, variants, probe)
    tables = tables_of(rows)
    md = markdown_table(rows, tables[0]) + "\n" + breakdown_table(rows)
    if overlap:
        md += "\n" + markdown_table(overlap, OVERLAP_COLUMNS)
    settings = settings_line(args, "peers")
    notes = "\n".join(n for n in (probe_line(probe), f"Command: `{command_line()}`") if n)
    atomic_write(out / "results.md", f"<!-- {settings} -->\n" + md + "\n" + notes + "\n")
    atomic_write(out / "results.csv", csv_table(rows, tables))
    atomic_write(out / "result.json", result_json(rows, settings, "peers", tables, compute_probe=probe,
                                                  target_drop_points=args.target_drop))
    write_figures(args, results)
    print(md + notes)
    print(f"[bench peers] wrote {out / 'results.md'}, {out / 'results.csv'}, {out / 'result.json'}, "
          f"{out / 'figures'}/")
    return 1 if failures else 0
