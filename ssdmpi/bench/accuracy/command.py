"""``ssdmpi bench accuracy``'s command: its flags, the grid of configurations, the sweep (in parallel
processes with ``--jobs``) and its files (``--out DIR``: ``results.csv``, ``results.md``, ``result.json``).
"""

from __future__ import annotations

import csv
import functools
import io
import os
import sys

from ssdmpi.algos import registry
from ssdmpi.bench import result as result_file
from ssdmpi.bench.accuracy.configs import (
    ADDED_FIELDS,
    DEFAULT_DATASETS,
    DEFAULT_EPOCHS,
    DEFAULT_VARIANTS,
    FIELDS,
    GPT_SIZES,
    LANGUAGE_MODELS,
    MODELS,
    NO_DELAY,
    VARIANTS,
    gpt_sizes,
    gpt_text,
    known,
    result_key,
    runs_at,
    warmup_steps,
)
from ssdmpi.bench.accuracy.simulate import run_config
from ssdmpi.bench.accuracy.tables import report_text, with_diffs
from ssdmpi.bench.flags import CommaList
from ssdmpi.errors import UserError
from ssdmpi.metrics import atomic_write
from ssdmpi.parsing import parse_list


def add_arguments(parser) -> None:
    parser.add_argument("--models", default="mlp,lenet5", metavar="M1,M2",
                        help="models (mlp = 784-256-10, lenet5; gpt, a language model of a text --dataset, "
                             "scored by its validation loss; default %(default)s)")
    parser.add_argument("--gpt", default=gpt_text(GPT_SIZES), metavar="NAME=INT,...",
                        help="the gpt's sizes, those not given at the default's (default %(default)s)")
    parser.add_argument("--ranks", default="2,4", metavar="N1,N2", help="simulated workers N (default %(default)s)")
    parser.add_argument("--delays", default="2,5,10", metavar="K1,K2", help="delays/periods k (default %(default)s)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), metavar="V1,V2",
                        help=f"variants, from {', '.join(VARIANTS)} (default %(default)s)")
    parser.add_argument("--dataset", default=None,
                        help="dataset name (default: " + ", ".join(f"{name} for a model of {kind} data"
                                                                 for kind, name in DEFAULT_DATASETS.items()) + ")")
    parser.add_argument("--data-path", default=None, metavar="PATH", help="dataset directory or file")
    parser.add_argument("--lr", action=CommaList, default="0.02", metavar="LR1,LR2",
                        help="global learning rates, constant (default %(default)s)")
    parser.add_argument("--optimizer", default=registry.DEFAULT_OPTIMIZER, choices=tuple(registry.OPTIMIZERS),
                        help="inner optimizer, its other settings at their defaults (default %(default)s)")
    parser.add_argument("--momentum", type=float, default=None,
                        help=f"momentum mu, with {registry.where('momentum')} (default "
                             f"{registry.SETTINGS['momentum'].default}, as ssdmpi train)")
    parser.add_argument("--weight-decay", type=float, default=None,
                        help=f"weight decay lambda (default: the optimizer's, as ssdmpi train: "
                             f"{registry.default_text('weight_decay')})")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="batch per worker B (a language model's: windows of its context) (default %(default)s)")
    parser.add_argument("--epochs", default=DEFAULT_EPOCHS, metavar="E|M=E,...",
                        help="epochs, one number or per model (default %(default)s); fractions allowed")
    parser.add_argument("--warmup-steps", default="200", metavar="T|P%",
                        help="SSGD iterations before the delay stage, or a percentage of the run's "
                             "(default %(default)s)")
    parser.add_argument("--train-subset", type=int, default=None, metavar="N",
                        help="train on a fixed random subset of N training samples (default: all)")
    parser.add_argument("--val-windows", type=int, default=None, metavar="N",
                        help="a language model: score it on N of the validation windows, evenly spread (default: "
                             "all)")
    parser.add_argument("--seed", action=CommaList, default="0", metavar="S1,S2",
                        help="model-initialisation and data-order seeds (default %(default)s)")
    parser.add_argument("--tail", type=int, default=0, metavar="E",
                        help="also report the mean test accuracy (a language model's: validation loss) of W over E "
                             "evaluations spread over the second half of training, a steadier figure than the final "
                             "one at a high lr (default "
                             "%(default)s: off)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="configurations run in parallel processes (default %(default)s)")
    parser.add_argument("--out", default=None, metavar="DIR", help="write DIR/results.csv and DIR/results.md")
    parser.add_argument("--resume", action="store_true",
                        help="with --out: keep DIR's results.csv and skip the configurations already in it")
    parser.add_argument("--no-run", action="store_true",
                        help="with --out DIR --resume: rewrite DIR/results.md and DIR/result.json from the rows "
                             "already in results.csv and run nothing (the others shown as not run)")


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


def _dataset(args, models) -> str:
    """The dataset ``models`` train on: ``--dataset``, or the default for the kind of data they take; ``UserError``
    when they do not all take the same kind, or the dataset holds the other one."""
    from ssdmpi.data.datasets import dataset_kind

    language = [m for m in models if m in LANGUAGE_MODELS]
    if language and len(language) < len(models):
        images = [m for m in models if m not in language]
        raise UserError(f"--models: {', '.join(language)} train on text, {', '.join(images)} on images: run them in "
                        "separate commands")
    kind = "text" if language else "classification"
    name = args.dataset or DEFAULT_DATASETS[kind]
    if dataset_kind(name) != kind:
        what = "text" if kind == "classification" else "images or feature vectors"
        raise UserError(f"--dataset {name} holds {what}, and --models {','.join(models)} takes {kind} data: choose "
                        f"a {kind} dataset (e.g. {DEFAULT_DATASETS[kind]})")
    return name


def parse(args) -> tuple[list[dict], dict]:
    """Check ``args``; return ``(configurations, epochs per model)``. ``UserError`` on nonsense. Sets
    ``args.dataset`` (its default resolved) and ``args.warmup_steps`` (``configs.warmup_steps``)."""
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if not models or bad:
        raise UserError(f"--models: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(MODELS)}")
    args.dataset = _dataset(args, models)
    language = models[0] in LANGUAGE_MODELS
    sizes = gpt_sizes(args.gpt) if language else None
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if not known(v)]
    if not variants or bad:
        raise UserError(f"--variants: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(VARIANTS)}")
    ranks = _int_list(args.ranks, "ranks", 1)
    delays = _int_list(args.delays, "delays", 1)
    epochs = _epochs(args.epochs, models)
    lrs = parse_list(args.lr, "--lr", float, minimum=0, strict=True)
    seeds = parse_list(args.seed, "--seed", int, minimum=0)
    takes_momentum = any(s.name == "momentum" for s in registry.OPTIMIZERS[args.optimizer].settings)
    if args.momentum is not None and not takes_momentum:
        raise UserError(f"--momentum applies only to {registry.where('momentum')}; drop it")
    if args.momentum is None and takes_momentum:
        args.momentum = registry.SETTINGS["momentum"].default
    if args.weight_decay is None:
        args.weight_decay = registry.default_value("weight_decay", args.optimizer)
    if args.momentum is not None and not 0 <= args.momentum < 1:
        raise UserError(f"--momentum must be in [0, 1), got {args.momentum}")
    if args.weight_decay < 0:
        raise UserError(f"--weight-decay must be >= 0, got {args.weight_decay}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    args.warmup_steps = warmup_steps(args.warmup_steps)
    if args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    if args.tail < 0:
        raise UserError(f"--tail must be >= 0 (0: off), got {args.tail}")
    if language and args.train_subset is not None:
        raise UserError("--train-subset applies to an image model; a language model trains on every window of "
                        f"{args.dataset}: drop it")
    if args.gpt != gpt_text(GPT_SIZES) and not language:
        raise UserError("--gpt applies to a language model (--models gpt): drop it")
    if args.val_windows is not None and not language:
        raise UserError("--val-windows applies to a language model (--models gpt): drop it")
    if args.val_windows is not None and args.val_windows < 1:
        raise UserError(f"--val-windows must be >= 1 (leave it out for every window), got {args.val_windows}")
    if args.train_subset is not None and args.train_subset < max(ranks) * args.batch_size:
        raise UserError(f"--train-subset {args.train_subset} is smaller than one global batch "
                        f"({max(ranks)} x {args.batch_size}); use more samples")
    if args.resume and not args.out:
        raise UserError("--resume needs --out DIR (the sweep to continue)")
    if args.no_run and not args.resume:
        raise UserError("--no-run renders the rows a sweep already has: give it with --out DIR --resume")
    settings = dict(dataset=args.dataset, batch_size=args.batch_size, warmup_steps=args.warmup_steps,
                    optimizer=args.optimizer, momentum="" if args.momentum is None else args.momentum,
                    weight_decay=args.weight_decay, train_subset=args.train_subset or 0,
                    tail=args.tail, gpt=gpt_text(sizes) if language else "",
                    val_windows=(args.val_windows or 0) if language else 0)
    configs = []
    # Model-major (the cheaper model first on the command line gets its whole table first), then
    # seed-major, variant-major inside a row, k = 5 first: an interrupted sweep has whole tables.
    k_order = sorted(delays, key=lambda k: (k != 5, k))
    for model in models:
        for seed in seeds:
            for lr in lrs:
                for k in k_order:
                    for n in ranks:
                        for v in variants:
                            if (v in NO_DELAY and k != k_order[0]) or not runs_at(v, k, args.optimizer):
                                continue
                            configs.append(dict(model=model, N=n, variant=v, k=0 if v in NO_DELAY else k,
                                                epochs=epochs[model], lr=lr, seed=seed, **settings))
    return configs, epochs


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
        if reader.fieldnames is None or not set(FIELDS) - set(ADDED_FIELDS) <= set(reader.fieldnames):
            raise UserError(f"--resume: {csv_path} is not a results.csv of 'bench accuracy'")
        rows = [{f: row[f] if f in row else ADDED_FIELDS[f] for f in FIELDS} for row in reader]
    if list(reader.fieldnames) != list(FIELDS):      # written before a field was added: rewrite with every field
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(csv_path, text.getvalue())
    return rows


def _append_csv(out: str, row: dict) -> None:
    path = os.path.join(out, "results.csv")
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerow({f: row[f] for f in FIELDS})


def _write_results(out: str, report: str, rows: list[dict]) -> None:
    """``results.md`` (the table) and ``result.json`` (``ssdmpi/bench/result.py``: the command line,
    the machine and ``rows``, one object per configuration with the ``FIELDS`` and the differences of
    ``with_diffs``)."""
    atomic_write(os.path.join(out, "results.md"), report)
    typed = [{key: _typed(value) for key, value in row.items()} for row in rows]
    atomic_write(os.path.join(out, "result.json"),
                 result_file.dumps({**result_file.provenance("accuracy"), "rows": typed}))


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


def _check_data(args, configs) -> None:
    """Load the dataset (fail early; with fork, load once for all jobs); for a language model also build its
    model once, so that sizes its factory refuses (or a context longer than the data) fail before any run."""
    from ssdmpi.data import load_dataset

    ds = load_dataset(args.dataset, args.data_path)
    language = [c for c in configs if c["model"] in LANGUAGE_MODELS]
    if not language:
        return
    from ssdmpi.nn import build_model

    sizes = gpt_sizes(language[0]["gpt"])
    context = sizes["context"]
    if ds.num_val_windows(context) == 0:
        raise UserError(f"--gpt context={context}: the validation split of {args.dataset} has "
                        f"{ds.num_val_tokens} tokens, not one window; use a shorter context")
    ds.train_windows(context)                             # a train split shorter than one window: UserError
    try:
        build_model(language[0]["model"], *ds.model_inputs(context), **sizes)
    except UserError as exc:
        raise UserError(f"--gpt {language[0]['gpt']}: {exc}") from None


def run(args) -> int:
    configs, epochs = parse(args)
    models = list(epochs)
    ranks = _int_list(args.ranks, "ranks", 1)
    delays = _int_list(args.delays, "delays", 1)
    lrs = parse_list(args.lr, "--lr", float)
    seeds = parse_list(args.seed, "--seed", int)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    report = functools.partial(report_text, args, models=models, lrs=lrs, ranks=ranks, variants=variants,
                               delays=delays, epochs=epochs, seeds=seeds)
    done = []
    if args.out:
        previous = _prepare_out(args.out, args.resume)
        wanted = {result_key(c) for c in configs}
        done = [r for r in previous if result_key(r) in wanted]
        have = {result_key(r) for r in done}
        configs = [c for c in configs if result_key(c) not in have]
        if done:
            print(f"resume: {len(done)} configuration(s) already in {args.out}/results.csv", file=sys.stderr)
    if args.no_run:
        rows = with_diffs(done)
        _write_results(args.out, report(rows, pending=len(configs)), rows)
        print(report(rows, pending=len(configs)))
        return 0
    _check_data(args, configs)
    rows = list(done)
    total = len(configs)

    def record(row):
        rows.append(row)
        figure = f"{row['acc_W']:.2f}%" if row["val_loss"] == "" else f"val loss {row['val_loss']:.4f}"
        print(f"[{len(rows) - len(done)}/{total}] {row['model']} lr={row['lr']:g} N={row['N']} {row['variant']}"
              f"{'' if row['variant'] in NO_DELAY else ' k=' + str(row['k'])} seed={row['seed']}: "
              f"{figure} ({row['seconds']} s)", file=sys.stderr, flush=True)
        if args.out:
            _append_csv(args.out, row)
            diffs = with_diffs(rows)
            _write_results(args.out, report(diffs, pending=total - len(rows) + len(done)), diffs)

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
        _write_results(args.out, report(rows, pending=0), rows)
    print(report(rows, pending=0))
    return 0
