"""``ssdmpi bench accuracy``: final test accuracy of ``W`` per algorithm, schedule, local update and k.

The table that chose the defaults of ``--local-update``, ``--period-rule`` and ``--comm``
(docs/ACCURACY.md). Every configuration runs in the reference simulator
(``ssdmpi/verify/reference.py``: ``N`` workers in one process, pure NumPy, no MPI), so the
numbers depend only on the algorithm, not on the network or the number of cores.

One configuration = (model, lr, N, variant, k, seed). Each runs ``epochs * steps_per_epoch``
iterations (an epoch is ``floor(n_train / (N * B))`` iterations, the sharded loader's
policy, so every variant of a row sees the same samples in the same order), then
``Simulation.finalize()`` (the end-of-training flush: what is in flight is applied to
``W``; ``delta-merge`` and ``delta-own`` fold the progress not yet posted in), then the accuracy of ``W`` on the whole
test set. Model initialisation and data order use the seed, identical for every variant.
At a high learning rate that one figure is a noisy sample: the test accuracy of ``W`` moves
by points from one evaluation to the next. ``--tail E`` adds a steadier figure: the mean test
accuracy over ``E`` evaluations spread evenly over the second half of training (iterations
``steps/2 + i*(steps - steps/2)/E``, ``i = 1..E``, the last one the end), each of the model
``finalize()`` would give at that iteration (``Simulation.finalized_W``), as ``acc_W_tail``
and a second table.
``--lr`` and ``--seed`` take lists: one command runs the whole grid.

Variants (``--variants``, comma separated; every algorithm's and period rule's named
configurations, ``ssdmpi/algos/registry.py``; ``k`` applies to those whose algorithm takes
``--delay``)::

    ssgd                    synchronous SGD (the reference of each row; no k)
    step/global-momentum    ssd --comm step --local-update global-momentum
    step/glu-paper          ssd --comm step --local-update glu-paper (local lr N * lr)
    step/sgd                ssd --comm step --local-update sgd       (local lr N * lr)
    period/delta-own        ssd --comm period --period-rule delta-own
    period/delta-merge      ssd --comm period --period-rule delta-merge (its default merge delay);
                            period/delta-merge:d=D with --merge-delay D (skipped where D > k: a
                            rule's setting by its bench tag, where the run takes it)
    period/replay           ssd --comm period --period-rule replay --local-update global-momentum
    odsgd                   ssd --comm step with k = 1 (no k)
    localsgd                blocking periodic averaging, local momentum
    asgd                    --algo asgd --servers 1 --asgd-order round-robin (no k): N workers
                            plus one parameter server, the server applying the N pushes of
                            an iteration in worker order (``ASGDSimulation``); like ssgd it
                            has no k, so it has one column per row

Outputs: Markdown tables on stdout, one per k (rows model x lr x N; columns the variants;
a cell is ``accuracy% [difference to ssgd of the row, points]``, with several seeds the mean
over the seeds, the difference paired by seed and averaged, and the range over the seeds:
``mean [mean difference] (min..max)``); with ``--out DIR`` also
``DIR/results.csv`` (one row per configuration, appended as each finishes, so an
interrupted sweep keeps what it did; ``--resume`` skips configurations already there)
and ``DIR/results.md`` (the table) and ``DIR/result.json`` (every row, the command line and the
machine: ``ssdmpi/bench/result.py``), both rewritten after each configuration. ``--resume
--no-run`` rewrites these two from the rows already there and runs nothing (a cell with fewer
seeds than the sweep's says so).
"""

from __future__ import annotations

import csv
import functools
import io
import os
import sys
import time

from ssdmpi.algos import registry
from ssdmpi.bench import result as result_file
from ssdmpi.bench.flags import CommaList
from ssdmpi.errors import UserError
from ssdmpi.metrics import atomic_write
from ssdmpi.parsing import parse_list

MODELS = ("mlp", "lenet5")
# Every algorithm's named configurations (``ssdmpi/algos/registry.py``: a new rule adds ``period/<rule>``).
VARIANTS = registry.variants()
# Variants without a delay/period k: one configuration (k = 0) and one column per row.
NO_DELAY = tuple(v for v, s in VARIANTS.items() if not registry.ALGORITHMS[s["algo"]].takes("delay"))
BASELINE = next(v for v, s in VARIANTS.items() if registry.ALGORITHMS[s["algo"]].baseline)
DEFAULT_VARIANTS = registry.accuracy_defaults()
DEFAULT_EPOCHS = "mlp=3,lenet5=2"
# Settings that identify a result; --resume only reuses rows whose settings all match.
SETTINGS = ("dataset", "lr", "batch_size", "epochs", "warmup_steps", "optimizer", "momentum", "weight_decay",
            "train_subset", "seed", "tail")
FIELDS = ("model", "N", "variant", "k") + SETTINGS + ("steps", "acc_W", "acc_W_noflush", "acc_W_tail", "seconds")
# Fields a results.csv written before they existed lacks, and what such a row means by them.
ADDED_FIELDS = {"tail": "0", "acc_W_tail": "", "optimizer": registry.DEFAULT_OPTIMIZER}


def add_arguments(parser) -> None:
    parser.add_argument("--models", default="mlp,lenet5", metavar="M1,M2",
                        help="models (mlp = 784-256-10, lenet5; default %(default)s)")
    parser.add_argument("--ranks", default="2,4", metavar="N1,N2", help="simulated workers N (default %(default)s)")
    parser.add_argument("--delays", default="2,5,10", metavar="K1,K2", help="delays/periods k (default %(default)s)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), metavar="V1,V2",
                        help=f"variants, from {', '.join(VARIANTS)} (default %(default)s)")
    parser.add_argument("--dataset", default="fashion-mnist", help="dataset name (default %(default)s)")
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
    parser.add_argument("--batch-size", type=int, default=32, help="batch per worker B (default %(default)s)")
    parser.add_argument("--epochs", default=DEFAULT_EPOCHS, metavar="E|M=E,...",
                        help="epochs, one number or per model (default %(default)s); fractions allowed")
    parser.add_argument("--warmup-steps", type=int, default=200, help="SSGD iterations before the delay stage "
                        "(default %(default)s)")
    parser.add_argument("--train-subset", type=int, default=None, metavar="N",
                        help="train on a fixed random subset of N training samples (default: all)")
    parser.add_argument("--seed", action=CommaList, default="0", metavar="S1,S2",
                        help="model-initialisation and data-order seeds (default %(default)s)")
    parser.add_argument("--tail", type=int, default=0, metavar="E",
                        help="also report the mean test accuracy of W over E evaluations spread over the second "
                             "half of training, a steadier figure than the final one at a high lr (default "
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


def parse(args) -> tuple[list[dict], dict]:
    """Check ``args``; return ``(configurations, epochs per model)``. ``UserError`` on nonsense."""
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if not models or bad:
        raise UserError(f"--models: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(MODELS)}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if not _known(v)]
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
    if args.warmup_steps < 0:
        raise UserError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    if args.tail < 0:
        raise UserError(f"--tail must be >= 0 (0: off), got {args.tail}")
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
                    tail=args.tail)
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
                            if (v in NO_DELAY and k != k_order[0]) or not _runs_at(v, k, args.optimizer):
                                continue
                            configs.append(dict(model=model, N=n, variant=v, k=0 if v in NO_DELAY else k,
                                                epochs=epochs[model], lr=lr, seed=seed, **settings))
    return configs, epochs


def _own_setting(variant: str) -> dict:
    """What ``BASE:TAG=V[:TAG=V...]`` adds to the variant ``BASE``: settings of its period rule, each named
    once by the setting's bench tag (``period/delta-merge:d=2``: ``merge_delay`` 2), checked; ``{}`` for a
    plain name of ``VARIANTS``. ``ValueError`` or ``UserError`` when it is neither."""
    base, _, param = variant.partition(":")
    if base not in VARIANTS:
        raise ValueError(variant)
    if not param:
        return {}
    rule = registry.RULES.get(VARIANTS[base].get("period_rule"))
    out = {}
    for part in param.split(":"):
        tag, _, value = part.partition("=")
        found = [s for s in (rule.settings if rule is not None else ())
                 if s.bench_tag and s.bench_tag.split("{")[0] == tag]
        if not found or found[0].name in out:
            raise ValueError(variant)
        s = found[0]
        s.validate(s.type(value))
        out[s.name] = s.type(value)
    return out


def _known(variant: str) -> bool:
    """A name of ``VARIANTS``, or one with a setting of its rule (``_own_setting``)."""
    try:
        _own_setting(variant)
    except (ValueError, UserError):
        return False
    return True


def _runs_at(variant: str, k: int, optimizer: str | None = None) -> bool:
    """``ssdmpi train`` takes ``variant`` at period ``k`` with ``optimizer`` (``period/delta-merge:d=3`` does not
    at ``k = 2``)."""
    try:
        registry.resolve({**variant_settings(variant, k), "warmup_steps": 0, "optimizer": optimizer})
    except UserError:
        return False
    return True


def variant_settings(variant: str, k: int) -> dict:
    """``AlgoConfig`` keywords of ``variant`` at period/delay ``k`` (none for ``NO_DELAY`` variants)."""
    base = variant.partition(":")[0]
    algo = dict(VARIANTS[base])
    if base not in NO_DELAY:
        algo["delay"] = k
    return {**algo, **_own_setting(variant)}


def _key(row: dict) -> tuple:
    """What identifies a result: the configuration and every setting, as strings (CSV round trip)."""
    return tuple(_fmt(row[f]) for f in ("model", "N", "variant", "k") + SETTINGS)


def _fmt(value) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


# --- one configuration -----------------------------------------------------------------

def run_config(cfg: dict, data_path: str | None = None) -> dict:
    """Simulate one configuration; return its CSV row (``acc_W`` after finalize, in percent).

    It runs with one BLAS thread, whatever the caller's limits: a matrix product split over more
    threads sums in another order, and at a high learning rate that rounding changes the final
    accuracy by points, so the table would depend on the machine's cores and ``--jobs``."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _simulate_config(cfg, data_path)


def _simulate_config(cfg: dict, data_path: str | None) -> dict:
    import numpy as np

    from ssdmpi.algos import AlgoConfig
    from ssdmpi.data import ShardedLoader, load_dataset
    from ssdmpi.nn import build_model
    from ssdmpi.verify.reference import simulate

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
    algo = variant_settings(cfg["variant"], cfg["k"])
    optimizer = cfg.get("optimizer") or registry.DEFAULT_OPTIMIZER
    momentum = {} if cfg["momentum"] in ("", None) else {"momentum": cfg["momentum"]}
    config = AlgoConfig(lr=cfg["lr"], optimizer=optimizer, weight_decay=cfg["weight_decay"],
                        warmup_steps=cfg["warmup_steps"], **momentum, **algo)
    at = set(tail_iterations(steps, cfg["tail"]))
    tail = []

    def evaluate(sim):
        if sim.t in at and sim.t < steps:
            tail.append(sim.accuracy(sim.finalized_W(), ds.test_x, ds.test_y)[0])

    start = time.perf_counter()
    sim = simulate(config, factory, loaders, steps, world_size=n + algo.get("servers", 0), callback=evaluate)
    acc_noflush, _ = sim.accuracy(sim.W, ds.test_x, ds.test_y)
    sim.finalize()
    acc, _ = sim.accuracy(sim.W, ds.test_x, ds.test_y)
    if at:
        tail.append(acc)                                  # the last evaluation is the end of training
    row = dict(cfg, optimizer=optimizer, steps=steps, acc_W=round(100 * acc, 2),
               acc_W_noflush=round(100 * acc_noflush, 2),
               acc_W_tail=round(100 * sum(tail) / len(tail), 2) if tail else "",
               seconds=round(time.perf_counter() - start, 1))
    return {f: row[f] for f in FIELDS}


def tail_iterations(steps: int, evals: int) -> list[int]:
    """The ``evals`` iterations of ``--tail`` (after that many iterations), spread evenly over the second
    half of ``steps``; the last is ``steps`` (the end of training). Fewer when the half is shorter."""
    half = steps // 2
    return sorted({half + (i * (steps - half)) // evals for i in range(1, evals + 1)} - {half}) if evals else []


# --- the table -------------------------------------------------------------------------

def table(rows: list[dict], models, lrs, ranks, variants, k: int, seeds: int = 1, field: str = "acc_W") -> str:
    """Markdown for one ``k``: rows model x lr x N, a column per variant (``NO_DELAY`` ones at k = 0),
    of the rows' ``field`` (``acc_W``, or ``acc_W_tail``: rows without it count as not run).

    A cell over the seeds run: ``mean [mean difference to ssgd, paired by seed] (min..max)``;
    one seed: ``acc [difference]``; the bracket is left out where the row's ssgd did not run
    for any of the cell's seeds, and the cell is '—' where nothing ran. A cell with fewer of
    the sweep's ``seeds`` than that says how many it has (``2 of 3 seeds``)."""
    acc = {}
    for r in rows:
        if r.get(field, "") == "":
            continue
        key = (r["model"], float(r["lr"]), int(r["N"]), r["variant"], int(r["k"]))
        acc.setdefault(key, {})[int(r["seed"])] = float(r[field])
    head = ["model", "lr", "N"] + [v if v in NO_DELAY else f"{v} k={k}" for v in variants]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in models:
        for lr in lrs:
            for n in ranks:
                ref = acc.get((model, lr, n, BASELINE, 0), {})
                cells = [model, f"{lr:g}", str(n)]
                for v in variants:
                    runs = acc.get((model, lr, n, v, 0 if v in NO_DELAY else k), {})
                    cells.append(_cell(runs, ref, seeds))
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(runs: dict, ref: dict, seeds: int = 1) -> str:
    """``{seed: acc}`` and the row's ssgd ``{seed: acc}`` -> the table cell (see ``table``)."""
    if not runs:
        return "—"
    values = list(runs.values())
    text = f"{sum(values) / len(values):.2f}"
    paired = [runs[s] - ref[s] for s in runs if s in ref]
    if paired:
        text += f" [{sum(paired) / len(paired):+.2f}]"
    spread = [f"{min(values):.2f}..{max(values):.2f}"] if len(values) > 1 else []
    if len(values) < seeds:
        spread.append(f"{len(values)} of {seeds} seeds")
    if spread:
        text += f" ({', '.join(spread)})"
    return text


def with_diffs(rows: list[dict]) -> list[dict]:
    """Each row plus ``diff_vs_ssgd`` and ``diff_tail_vs_ssgd`` (points: ``acc_W`` and ``acc_W_tail``
    against the ssgd of the same model, lr, N and seed; '' when that did not run or has no such figure)."""
    def key(r):
        return (r["model"], float(r.get("lr", 0)), int(r["N"]), int(r.get("seed", 0)))

    def diff(r, field):
        base = ref.get(key(r), {}).get(field, "")
        return "" if base == "" or r.get(field, "") == "" else round(float(r[field]) - float(base), 2)

    ref = {key(r): r for r in rows if r["variant"] == BASELINE}
    return [dict(r, diff_vs_ssgd=diff(r, "acc_W"), diff_tail_vs_ssgd=diff(r, "acc_W_tail")) for r in rows]


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


def _report(args, rows, models, lrs, ranks, variants, delays, epochs, seeds, pending: int) -> str:
    settings = (f"dataset {args.dataset}, batch {args.batch_size} per worker, constant lr, "
                f"optimizer {args.optimizer}"
                + (f", momentum {args.momentum}" if args.momentum is not None else "")
                + f", weight decay {args.weight_decay}, warm-up {args.warmup_steps} "
                f"iterations, epochs {', '.join(f'{m} {e:g}' for m, e in epochs.items())}, "
                f"train subset {args.train_subset or 'all'}, seeds {', '.join(map(str, seeds))}")
    base = registry.BASELINE
    what = (f"mean over the seeds [difference to {base} of the row, paired by seed, mean] (min..max over the seeds)"
            if len(seeds) > 1 else f"[difference to {base} of the row, points]")
    text = [f"Final test accuracy (%) of W after finalize, {what}; reference simulator.", ""]
    tables = [("acc_W", "")]
    if args.tail:
        text += [f"Tail tables: the mean test accuracy (%) of the model finalize would give at {args.tail} "
                 f"iterations spread evenly over the second half of training, the last one the end; {what}.", ""]
        tables.append(("acc_W_tail", f" (tail: mean over {args.tail} evaluations in the second half)"))
    text += [settings, ""]
    with_k = [v for v in variants if v not in NO_DELAY]
    for field, title in tables:
        for k in (delays if with_k else delays[:1]):
            cols = [v for v in variants if v in NO_DELAY or _runs_at(v, k)]
            text += [(f"### k = {k}" if with_k else "### every variant without k") + title, "",
                     table(rows, models, lrs, ranks, cols, k, len(seeds), field), ""]
    if pending:
        text += [f"({pending} configuration(s) not run yet: '—')", ""]
    return "\n".join(text)


def run(args) -> int:
    configs, epochs = parse(args)
    models = list(epochs)
    ranks = _int_list(args.ranks, "ranks", 1)
    delays = _int_list(args.delays, "delays", 1)
    lrs = parse_list(args.lr, "--lr", float)
    seeds = parse_list(args.seed, "--seed", int)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    report = functools.partial(_report, args, models=models, lrs=lrs, ranks=ranks, variants=variants,
                               delays=delays, epochs=epochs, seeds=seeds)
    done = []
    if args.out:
        previous = _prepare_out(args.out, args.resume)
        wanted = {_key(c) for c in configs}
        done = [r for r in previous if _key(r) in wanted]
        have = {_key(r) for r in done}
        configs = [c for c in configs if _key(c) not in have]
        if done:
            print(f"resume: {len(done)} configuration(s) already in {args.out}/results.csv", file=sys.stderr)
    if args.no_run:
        rows = with_diffs(done)
        _write_results(args.out, report(rows, pending=len(configs)), rows)
        print(report(rows, pending=len(configs)))
        return 0
    from ssdmpi.data import load_dataset
    load_dataset(args.dataset, args.data_path)      # fail early (and, with fork, load once for all jobs)
    rows = list(done)
    total = len(configs)

    def record(row):
        rows.append(row)
        print(f"[{len(rows) - len(done)}/{total}] {row['model']} lr={row['lr']:g} N={row['N']} {row['variant']}"
              f"{'' if row['variant'] in NO_DELAY else ' k=' + str(row['k'])} seed={row['seed']}: "
              f"{row['acc_W']:.2f}% ({row['seconds']} s)", file=sys.stderr, flush=True)
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

