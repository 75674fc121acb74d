"""``ssdmpi bench accuracy``: final test accuracy of ``W`` per algorithm, schedule, local update and k.

The table that chose the defaults of ``--local-update``, ``--period-rule`` and ``--comm``
(docs/ACCURACY.md). Every configuration runs in the reference simulator
(``ssdmpi/algos/reference.py``: ``N`` workers in one process, pure NumPy, no MPI), so the
numbers depend only on the algorithm, not on the network or the number of cores.

One configuration = (model, N, variant, k). Each runs ``epochs * steps_per_epoch``
iterations (an epoch is ``floor(n_train / (N * B))`` iterations, the sharded loader's
policy, so every variant of a row sees the same samples in the same order), then
``Simulation.finalize()`` (the end-of-training flush: what is in flight is applied to
``W``; ``delta-own`` folds its partial period in), then the accuracy of ``W`` on the whole
test set. Model initialisation and data order use ``--seed``, identical for every variant.

Variants (``--variants``, comma separated; every algorithm's and period rule's named
configurations, ``ssdmpi/algos/registry.py``; ``k`` applies to those whose algorithm takes
``--delay``)::

    ssgd                    synchronous SGD (the reference of each row; no k)
    step/global-momentum    ssd --comm step --local-update global-momentum
    step/glu-paper          ssd --comm step --local-update glu-paper (local lr N * lr)
    step/sgd                ssd --comm step --local-update sgd       (local lr N * lr)
    period/delta-own        ssd --comm period --period-rule delta-own
    period/replay           ssd --comm period --period-rule replay --local-update global-momentum
    odsgd                   ssd --comm step with k = 1 (no k)
    localsgd                blocking periodic averaging, local momentum
    asgd                    --algo asgd --servers 1 --asgd-order round-robin (no k): N workers
                            plus one parameter server, the server applying the N pushes of
                            an iteration in worker order (``ASGDSimulation``); like ssgd it
                            has no k, so it has one column per row

Outputs: a Markdown table on stdout (rows model x N; columns variant x k; cells
``accuracy% [difference to ssgd of the row, points]``); with ``--out DIR`` also
``DIR/results.csv`` (one row per configuration, appended as each finishes, so an
interrupted sweep keeps what it did; ``--resume`` skips configurations already there)
and ``DIR/results.md`` (the table) and ``DIR/result.json`` (every row, the command line and the
machine: ``ssdmpi/bench/result.py``), both rewritten after each configuration.
"""

from __future__ import annotations

import csv
import os
import sys
import time

from ssdmpi.algos import registry
from ssdmpi.bench import result as result_file
from ssdmpi.errors import UserError
from ssdmpi.parsing import parse_list

MODELS = ("mlp", "lenet5")
# Every algorithm's named configurations (``ssdmpi/algos/registry.py``: a new rule adds ``period/<rule>``).
VARIANTS = registry.variants()
# Variants without a delay/period k: one configuration (k = 0) and one column per row.
NO_DELAY = tuple(v for v, s in VARIANTS.items() if not registry.ALGORITHMS[s["algo"]].takes("delay"))
BASELINE = next(v for v, s in VARIANTS.items() if registry.ALGORITHMS[s["algo"]].baseline)   # ssgd
DEFAULT_VARIANTS = ("ssgd", "step/global-momentum", "step/glu-paper", "step/sgd", "period/delta-own", "localsgd")
DEFAULT_EPOCHS = "mlp=3,lenet5=2"
# Settings that identify a result; --resume only reuses rows whose settings all match.
SETTINGS = ("dataset", "lr", "batch_size", "epochs", "warmup_steps", "momentum", "weight_decay",
            "train_subset", "seed")
FIELDS = ("model", "N", "variant", "k") + SETTINGS + ("steps", "acc_W", "acc_W_noflush", "seconds")


def add_arguments(parser) -> None:
    parser.add_argument("--models", default="mlp,lenet5", metavar="M1,M2",
                        help="models (mlp = 784-256-10, lenet5; default %(default)s)")
    parser.add_argument("--ranks", default="2,4", metavar="N1,N2", help="simulated workers N (default %(default)s)")
    parser.add_argument("--delays", default="2,5,10", metavar="K1,K2", help="delays/periods k (default %(default)s)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), metavar="V1,V2",
                        help=f"variants, from {', '.join(VARIANTS)} (default %(default)s)")
    parser.add_argument("--dataset", default="fashion-mnist", help="dataset name (default %(default)s)")
    parser.add_argument("--data-path", default=None, metavar="PATH", help="dataset directory or file")
    parser.add_argument("--lr", type=float, default=0.02, help="global learning rate, constant (default %(default)s)")
    parser.add_argument("--momentum", type=float, default=registry.SETTINGS["momentum"].default,
                        help="momentum mu (default %(default)s, as ssdmpi train)")
    parser.add_argument("--weight-decay", type=float, default=registry.SETTINGS["weight_decay"].default,
                        help="weight decay lambda (default %(default)s, as ssdmpi train)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch per worker B (default %(default)s)")
    parser.add_argument("--epochs", default=DEFAULT_EPOCHS, metavar="E|M=E,...",
                        help="epochs, one number or per model (default %(default)s); fractions allowed")
    parser.add_argument("--warmup-steps", type=int, default=200, help="SSGD iterations before the delay stage "
                        "(default %(default)s)")
    parser.add_argument("--train-subset", type=int, default=None, metavar="N",
                        help="train on a fixed random subset of N training samples (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="model-initialisation and data-order seed (default 0)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="configurations run in parallel processes (default %(default)s)")
    parser.add_argument("--out", default=None, metavar="DIR", help="write DIR/results.csv and DIR/results.md")
    parser.add_argument("--resume", action="store_true",
                        help="with --out: keep DIR's results.csv and skip the configurations already in it")


# --- arguments -------------------------------------------------------------------------

def _int_list(text: str, what: str, minimum: int) -> list[int]:
    return parse_list(text, f"--{what}", int, minimum=minimum)


def _epochs(text: str, models) -> dict:
    """``"3"`` or ``"mlp=3,lenet5=2"`` -> ``{model: epochs}`` for every model in ``models``."""
    out = {}
    try:
        if "=" not in text:
            out = {m: float(text) for m in models}
        else:
            for part in text.split(","):
                name, _, value = part.partition("=")
                out[name.strip()] = float(value)
    except ValueError:
        raise UserError(f"--epochs must be a number or MODEL=E,...; got {text!r}") from None
    missing = [m for m in models if m not in out]
    if missing:
        raise UserError(f"--epochs {text!r} gives no epochs for {', '.join(missing)}")
    if any(out[m] <= 0 for m in models):
        raise UserError(f"--epochs must be > 0, got {text!r}")
    return {m: out[m] for m in models}


def parse(args) -> tuple[list[dict], dict]:
    """Check ``args``; return ``(configurations, epochs per model)``. ``UserError`` on nonsense."""
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if not models or bad:
        raise UserError(f"--models: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(MODELS)}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if not variants or bad:
        raise UserError(f"--variants: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(VARIANTS)}")
    ranks = _int_list(args.ranks, "ranks", 1)
    delays = _int_list(args.delays, "delays", 1)
    epochs = _epochs(args.epochs, models)
    if not args.lr > 0:
        raise UserError(f"--lr must be > 0, got {args.lr}")
    if not 0 <= args.momentum < 1:
        raise UserError(f"--momentum must be in [0, 1), got {args.momentum}")
    if args.weight_decay < 0:
        raise UserError(f"--weight-decay must be >= 0, got {args.weight_decay}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.warmup_steps < 0:
        raise UserError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    if args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    if args.train_subset is not None and args.train_subset < max(ranks) * args.batch_size:
        raise UserError(f"--train-subset {args.train_subset} is smaller than one global batch "
                        f"({max(ranks)} x {args.batch_size}); use more samples")
    if args.resume and not args.out:
        raise UserError("--resume needs --out DIR (the sweep to continue)")
    settings = dict(dataset=args.dataset, lr=args.lr, batch_size=args.batch_size, warmup_steps=args.warmup_steps,
                    momentum=args.momentum, weight_decay=args.weight_decay,
                    train_subset=args.train_subset or 0, seed=args.seed)
    configs = []
    # Variant-major inside a row, k = 5 first: an interrupted sweep has the requirement's column.
    k_order = sorted(delays, key=lambda k: (k != 5, k))
    for model in models:
        for k in k_order:
            for n in ranks:
                for v in variants:
                    if v in NO_DELAY and k != k_order[0]:
                        continue
                    configs.append(dict(model=model, N=n, variant=v, k=0 if v in NO_DELAY else k,
                                        epochs=epochs[model], **settings))
    return configs, epochs


def _key(row: dict) -> tuple:
    """What identifies a result: the configuration and every setting, as strings (CSV round trip)."""
    return tuple(_fmt(row[f]) for f in ("model", "N", "variant", "k") + SETTINGS)


def _fmt(value) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


# --- one configuration -----------------------------------------------------------------

def run_config(cfg: dict, data_path: str | None = None) -> dict:
    """Simulate one configuration; return its CSV row (``acc_W`` after finalize, in percent)."""
    import numpy as np

    from ssdmpi.algos import AlgoConfig
    from ssdmpi.algos.reference import simulate
    from ssdmpi.data import ShardedLoader, load_dataset
    from ssdmpi.nn import build_model

    ds = load_dataset(cfg["dataset"], data_path)
    x, y = ds.train_x, ds.train_y
    if cfg["train_subset"]:
        if cfg["train_subset"] > len(x):
            raise UserError(f"--train-subset {cfg['train_subset']} is more than the "
                            f"{len(x)} training samples of {cfg['dataset']}")
        # A fixed subset (independent of --seed), so runs with other seeds see the same data.
        idx = np.sort(np.random.default_rng(12345).permutation(len(x))[:cfg["train_subset"]])
        x, y = x[idx], y[idx]
    n, model = cfg["N"], cfg["model"]
    options = dict(widths=(256,)) if model == "mlp" else {}

    def factory():
        return build_model(model, ds.input_shape, ds.num_classes, seed=cfg["seed"], **options)

    # N = the workers that train on data (asgd's server is an extra rank: world N + servers).
    loaders = [ShardedLoader(x, y, cfg["batch_size"], r, n, cfg["seed"]) for r in range(n)]
    steps = max(1, int(round(cfg["epochs"] * loaders[0].steps_per_epoch)))
    algo = dict(VARIANTS[cfg["variant"]])
    if cfg["variant"] not in NO_DELAY:
        algo["delay"] = cfg["k"]
    config = AlgoConfig(lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"],
                        warmup_steps=cfg["warmup_steps"], **algo)
    start = time.perf_counter()
    sim = simulate(config, factory, loaders, steps, world_size=n + algo.get("servers", 0))
    acc_noflush, _ = sim.accuracy(sim.W, ds.test_x, ds.test_y)
    sim.finalize()
    acc, _ = sim.accuracy(sim.W, ds.test_x, ds.test_y)
    row = dict(cfg, steps=steps, acc_W=round(100 * acc, 2), acc_W_noflush=round(100 * acc_noflush, 2),
               seconds=round(time.perf_counter() - start, 1))
    return {f: row[f] for f in FIELDS}


# --- the table -------------------------------------------------------------------------

def table(rows: list[dict], models, ranks, variants, delays) -> str:
    """Markdown: rows model x N, columns variant x k; ``acc [acc - ssgd of the row]``, '—' if not run."""
    acc = {(r["model"], int(r["N"]), r["variant"], int(r["k"])): float(r["acc_W"]) for r in rows}
    columns = [(v, k) for v in variants for k in ([0] if v in NO_DELAY else delays)]
    head = ["model", "N"] + [v if v in NO_DELAY else f"{v} k={k}" for v, k in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in models:
        for n in ranks:
            ref = acc.get((model, n, BASELINE, 0))
            cells = [model, str(n)]
            for v, k in columns:
                a = acc.get((model, n, v, k))
                if a is None:
                    cells.append("—")
                elif ref is None:
                    cells.append(f"{a:.2f}")
                else:
                    cells.append(f"{a:.2f} [{a - ref:+.2f}]")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def with_diffs(rows: list[dict]) -> list[dict]:
    """Each row plus ``diff_vs_ssgd`` (points; '' when the row's ssgd did not run)."""
    ref = {(r["model"], int(r["N"])): float(r["acc_W"]) for r in rows if r["variant"] == BASELINE}
    out = []
    for r in rows:
        base = ref.get((r["model"], int(r["N"])))
        out.append(dict(r, diff_vs_ssgd="" if base is None else round(float(r["acc_W"]) - base, 2)))
    return out


# --- the sweep -------------------------------------------------------------------------

def _prepare_out(out: str, resume: bool) -> list[dict]:
    """Create ``out`` (refusing a non-empty one unless resuming); return the rows already there."""
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--out {out}: exists and is not a directory")
    existing = os.path.isdir(path) and bool(os.listdir(path))
    if existing and not resume:
        raise UserError(f"--out {out} is not empty; pass --resume to continue that sweep or choose a new directory")
    os.makedirs(path, exist_ok=True)
    csv_path = os.path.join(path, "results.csv")
    if not os.path.exists(csv_path):
        if existing:
            raise UserError(f"--resume: {out} has no results.csv to continue")
        return []
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not set(FIELDS) <= set(reader.fieldnames):
            raise UserError(f"--resume: {csv_path} is not a results.csv of 'bench accuracy'")
        return list(reader)


def _append_csv(out: str, row: dict) -> None:
    path = os.path.join(out, "results.csv")
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerow({f: row[f] for f in FIELDS})


def _write_new(out: str, name: str, text: str) -> None:
    """Write ``out/name`` through a temporary file, so a reader never sees half of it."""
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _write_results(out: str, report: str, rows: list[dict]) -> None:
    """``results.md`` (the table) and ``result.json`` (``ssdmpi/bench/result.py``: the command line,
    the machine and ``rows``, one object per configuration with the ``FIELDS`` and ``diff_vs_ssgd``)."""
    _write_new(out, "results.md", report)
    typed = [{key: _typed(value) for key, value in row.items()} for row in rows]
    _write_new(out, "result.json", result_file.dumps({**result_file.provenance("accuracy"), "rows": typed}))


def _typed(value):
    """A CSV cell read back by ``--resume`` (a string) as the number it was written from."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _report(args, rows, models, ranks, variants, delays, epochs, pending: int) -> str:
    settings = (f"dataset {args.dataset}, batch {args.batch_size} per worker, lr {args.lr} (constant), "
                f"momentum {args.momentum}, weight decay {args.weight_decay}, warm-up {args.warmup_steps} "
                f"iterations, epochs {', '.join(f'{m} {e:g}' for m, e in epochs.items())}, "
                f"train subset {args.train_subset or 'all'}, seed {args.seed}")
    text = ["Final test accuracy (%) of W after finalize [difference to ssgd of the row, points]; "
            "reference simulator.", "", settings, "", table(rows, models, ranks, variants, delays), ""]
    if pending:
        text += [f"({pending} configuration(s) not run yet: '—')", ""]
    return "\n".join(text)


def run(args) -> int:
    configs, epochs = parse(args)
    models = list(epochs)
    ranks = _int_list(args.ranks, "ranks", 1)
    delays = _int_list(args.delays, "delays", 1)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    done = []
    if args.out:
        previous = _prepare_out(args.out, args.resume)
        wanted = {_key(c) for c in configs}
        done = [r for r in previous if _key(r) in wanted]
        have = {_key(r) for r in done}
        configs = [c for c in configs if _key(c) not in have]
        if done:
            print(f"resume: {len(done)} configuration(s) already in {args.out}/results.csv", file=sys.stderr)
    from ssdmpi.data import load_dataset
    load_dataset(args.dataset, args.data_path)      # fail early (and, with fork, load once for all jobs)
    rows = list(done)
    total = len(configs)

    def record(row):
        rows.append(row)
        print(f"[{len(rows) - len(done)}/{total}] {row['model']} N={row['N']} {row['variant']}"
              f"{'' if row['variant'] in NO_DELAY else ' k=' + str(row['k'])}: {row['acc_W']:.2f}% "
              f"({row['seconds']} s)", file=sys.stderr, flush=True)
        if args.out:
            _append_csv(args.out, row)
            diffs = with_diffs(rows)
            _write_results(args.out, _report(args, diffs, models, ranks, variants, delays, epochs,
                                             total - len(rows) + len(done)), diffs)

    if args.jobs == 1 or total <= 1:
        for cfg in configs:
            record(run_config(cfg, args.data_path))
    else:
        import concurrent.futures
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool:
            futures = [pool.submit(run_config, cfg, args.data_path) for cfg in configs]
            for future in concurrent.futures.as_completed(futures):
                record(future.result())
    rows = with_diffs(rows)
    if args.out:
        _write_results(args.out, _report(args, rows, models, ranks, variants, delays, epochs, 0), rows)
    print(_report(args, rows, models, ranks, variants, delays, epochs, 0))
    return 0

