"""How the training benchmarks run (``bench train``, ``bench peers``): their shared flags, one launch per
variant and repeat, and each finished run parsed.

Each variant is a whole ``ssdmpi train`` run on ``--ranks`` ranks (default 2), launched as a
subprocess::

    bin/ssdmpi-netns --rate 1gbit -- mpiexec -n 2 python -m ssdmpi train --run-dir OUT/runs/NAME ...

(``--net none``: plain ``mpiexec`` over shared memory; ``--nodes N``: on a namespaced cluster of
N nodes, ``--ranks-per-node`` ranks each, every node's NIC limited to ``--net`` --
``bin/ssdmpi-cluster run --nodes N --ranks-per-node R --nic RATE -- python -m ssdmpi train ...``,
``ssdmpi.bench.launch``). A variant with parameter servers (``Variant.servers``) runs them on ranks
of their own, after the ``--ranks`` workers (with ``--nodes``: on that many more nodes, one rank
each, so a server has a NIC of its own). Variants run one after another in the order given and,
with ``--repeats R``, the whole list is repeated R times (interleaved, so slow drift of a shared
machine hits every variant alike). Each run's stdout and stderr go to ``OUT/logs/NAME.log``; each
finished run is read by ``ssdmpi/rundir.py`` and measured by ``ssdmpi/bench/rows.py``
(``run_metrics``).

Never overwrites: a run directory that already exists is an error unless ``--reuse``, which
parses it instead of training again (to rebuild tables after a change).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from ssdmpi import rundir
from ssdmpi.algos import registry
from ssdmpi.bench.launch import (
    NETNS,
    add_node_arguments,
    check_cluster,
    check_network,
    cluster_command,
    cluster_env,
    mpiexec,
    node_ranks,
    run_bounded,
)
from ssdmpi.bench.rows import run_metrics
from ssdmpi.bench.variants import Variant
from ssdmpi.data.names import TEXT_DATASETS
from ssdmpi.errors import UserError

# The job every run trains when neither a flag nor ``--preset`` says otherwise.
RUN_DEFAULTS = {"dataset": "fashion-mnist", "model": "wide-mlp", "epochs": 3, "batch_size": 32, "lr": 0.05,
                "warmup_steps": 20}


def add_run_arguments(parser, kind: str) -> None:
    """The flags of ``bench train`` that say how and where every run goes (all but the variants);
    ``bench KIND`` shares them."""
    parser.add_argument("--out", metavar="DIR",
                        help=f"results directory (runs/, logs/, tables, figures); "
                             f"default runs/bench-{kind}-<timestamp>")
    parser.add_argument("--net", default="1gbit", metavar="RATE|none",
                        help="network rate inside a private namespace (tc tbf), e.g. 1gbit, 100mbit; "
                             "'none': shared memory, no namespace (default %(default)s)")
    parser.add_argument("--ranks", type=int, default=None,
                        help="MPI ranks per run (default 2; parameter servers come on top)")
    add_node_arguments(parser)
    parser.add_argument("--preset", metavar="NAME",
                        help="start every run from 'ssdmpi train --preset NAME' (e.g. text-gpt); the flags below "
                             "left out take the preset's values instead of their defaults")
    parser.add_argument("--dataset", default=None,
                        help=f"dataset of every run (default {RUN_DEFAULTS['dataset']})")
    parser.add_argument("--train-subset", type=int, default=None, metavar="N",
                        help="train on the first N training images only (written once to OUT/data/ as HDF5; "
                             "the whole test split is kept), for short epochs; image datasets only")
    parser.add_argument("--model", default=None,
                        help=f"model of every run (default {RUN_DEFAULTS['model']}: 20 M parameters, "
                             "communication-bound at 1 Gbit/s)")
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"epochs per run (default {RUN_DEFAULTS['epochs']})")
    parser.add_argument("--steps", type=int, default=None, help="iterations per run (overrides --epochs)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"per rank (default {RUN_DEFAULTS['batch_size']})")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"global learning rate (default {RUN_DEFAULTS['lr']})")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help=f"SSGD warm-up iterations (default {RUN_DEFAULTS['warmup_steps']})")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run (default %(default)s)")
    parser.add_argument("--train-args", default="", metavar="'FLAGS'",
                        help="more 'ssdmpi train' flags for every run, quoted, e.g. '--log-every 5'")
    parser.add_argument("--repeats", type=int, default=1,
                        help="repeat the variant list R times, interleaved (default %(default)s)")
    parser.add_argument("--target-drop", type=float, default=0.5, metavar="POINTS",
                        help=f"target accuracy = {registry.BASELINE}'s final minus this many points "
                             "(default %(default)s)")
    parser.add_argument("--target-rise", type=float, default=1.0, metavar="PERCENT",
                        help=f"a language model's target validation loss = {registry.BASELINE}'s final plus this "
                             "many percent of it (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=3600, metavar="SEC", help="per run (default %(default)s)")
    parser.add_argument("--reuse", action="store_true", help="parse existing run directories instead of re-running")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")


def check_run_arguments(args) -> None:
    """``UserError`` (one line) for a bad ``add_run_arguments`` flag; resolves ``args.ranks``."""
    args.ranks = node_ranks(args, 2)
    _settle_job(args)
    if args.ranks < 1:
        raise UserError(f"--ranks must be >= 1, got {args.ranks}")
    if args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")
    if args.epochs < 1 or (args.steps is not None and args.steps < 1):
        raise UserError("--epochs and --steps must be positive")
    if args.train_subset is not None and args.train_subset < 1:
        raise UserError(f"--train-subset must be a positive number of images, got {args.train_subset}")
    if args.train_subset is not None and args.dataset in TEXT_DATASETS:
        raise UserError(f"--train-subset takes an image dataset, not the text dataset {args.dataset}; "
                        "shorten a language model's runs with --steps")
    if args.target_rise < 0:
        raise UserError(f"--target-rise must be >= 0 percent, got {args.target_rise}")
    if args.timeout <= 0:
        raise UserError(f"--timeout must be > 0, got {args.timeout}")
    if not args.net or (args.net != "none" and not args.net[0].isdigit()):
        raise UserError(f"--net {args.net!r}: give a tc rate such as 1gbit or 100mbit, or 'none'")
    try:
        shlex.split(args.train_args or "")
    except ValueError as exc:
        raise UserError(f"--train-args: {exc}") from None


def _settle_job(args) -> None:
    """Fill the job flags left out (None) from ``--preset``'s settings, then from ``RUN_DEFAULTS``, so that
    ``args`` names the job every run trains (a preset's ``steps`` counts only where neither ``--steps``
    nor ``--epochs`` is given)."""
    preset = {}
    if getattr(args, "preset", None):
        from ssdmpi.config.files import load_preset

        preset = load_preset(args.preset)                      # UserError for an unknown name
    if args.steps is None and args.epochs is None and preset.get("steps") is not None:
        args.steps = int(preset["steps"])
    for name, default in RUN_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, preset.get(name, default))


def check_variants(args, variants) -> None:
    """``UserError`` for a variant listed twice, or one that does not fit ``--nodes``."""
    _check_nodes(args, variants)
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise UserError(f"--variants lists a variant twice: {', '.join(names)}")


def _check_nodes(args, variants) -> None:
    """``--nodes`` with parameter servers: a server takes a node of its own, so one rank per node."""
    served = [v for v in variants if v.servers]
    if args.nodes and (args.ranks_per_node or 1) > 1 and served:
        raise UserError(f"{served[0].algo} with --nodes puts each server on a node of its own: use "
                        "--ranks-per-node 1")


def _where(args) -> str:
    """Where the ranks run, for the table header and figure titles."""
    if args.nodes:
        return f"{args.nodes} nodes x {args.ranks_per_node or 1} rank(s), NIC {args.net}"
    return f"{args.ranks} ranks, net {args.net}"


def settings_line(args, kind: str = "train") -> str:
    """One line naming the job every variant of ``ssdmpi bench KIND`` ran (the tables' header)."""
    return f"ssdmpi bench {kind}: {setup_line(args)}"


def setup_line(args) -> str:
    """What every run of a benchmark trains, and where (the tables' header)."""
    dataset = args.dataset + (f" (first {args.train_subset} training images)" if args.train_subset else "")
    preset = f"preset {args.preset}: " if getattr(args, "preset", None) else ""
    return (f"{preset}{args.model} on {dataset}, {_where(args)}, batch {args.batch_size}/rank, lr {args.lr}, "
            f"{f'{args.steps} steps' if args.steps else f'{args.epochs} epochs'}, warm-up {args.warmup_steps}")


def write_figures(args, results: dict) -> None:
    """``ssdmpi plot``'s figures of every readable run into ``OUT/figures``."""
    from ssdmpi.plot import make_figures

    runs = [r["run"] for rs in results.values() if isinstance(rs, list) for r in rs]
    if runs:
        make_figures(runs, Path(args.out) / "figures", title=f"{args.model}, {_where(args)}")


def subset_path(args) -> Path:
    """Where ``--train-subset N`` keeps its HDF5 file: ``OUT/data/DATASET-trainN.h5``."""
    return Path(args.out) / "data" / f"{args.dataset}-train{args.train_subset}.h5"


def write_subset(args) -> Path:
    """The first ``--train-subset`` training images of ``--dataset`` and its whole test split,
    as an HDF5 dataset (``ssdmpi/data/hdf5.py`` layout); reused when it already exists.

    Short epochs keep a benchmark short while evaluating every epoch on the full test split,
    so time-to-accuracy has several points.
    """
    import dataclasses

    from ssdmpi.data.datasets import load_raw
    from ssdmpi.data.hdf5 import write_hdf5

    path = subset_path(args)
    if path.exists():
        return path
    raw = load_raw(args.dataset)
    n = args.train_subset
    if n > len(raw.train_labels):
        raise UserError(f"--train-subset {n} exceeds the {len(raw.train_labels)} training images of {args.dataset}")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_hdf5(str(path), dataclasses.replace(raw, name=f"{raw.name}-train{n}", train_images=raw.train_images[:n],
                                              train_labels=raw.train_labels[:n]))
    return path


def launch_command(variant: Variant, run_dir: Path, args) -> list:
    """The argv of one run (see the module docstring)."""
    data = ["--dataset", args.dataset] if not args.train_subset else \
        ["--dataset", "hdf5", "--data-path", str(subset_path(args))]
    preset = ["--preset", args.preset] if getattr(args, "preset", None) else []
    train = [sys.executable, "-m", *variant.program, "--run-dir", str(run_dir), *preset,
             *data, "--model", args.model, "--batch-size", str(args.batch_size),
             "--lr", str(args.lr), "--warmup-steps", str(args.warmup_steps), "--seed", str(args.seed),
             "--no-progress-bar"]
    train += ["--steps", str(args.steps)] if args.steps else ["--epochs", str(args.epochs)]
    train += variant.train_flags() + shlex.split(args.train_args or "")
    if getattr(args, "nodes", None):
        return _cluster_launch(variant, train, args)
    cmd = [mpiexec(), "-n", str(args.ranks + (variant.servers or 0))] + train
    if args.net != "none":
        cmd = [str(NETNS), "--rate", args.net, "--"] + cmd
    return cmd


def _cluster_launch(variant: Variant, train: list, args) -> list:
    """``train`` on ``--nodes`` nodes x ``--ranks-per-node`` (plus one node per parameter server)."""
    per_node = args.ranks_per_node or 1
    return cluster_command(train, args.nodes + (variant.servers or 0), per_node, args.net)


def reused(args, run_dir: Path) -> bool:
    """Whether ``--reuse`` parses the run in ``run_dir`` instead of running it (it has its metrics)."""
    return bool(args.reuse) and rundir.has_metrics(run_dir)


def run_jobs(args, variants) -> list:
    """``(variant, repeat, run directory)`` for each run of the benchmark, in launch order."""
    runs = Path(args.out) / "runs"
    return [(v, rep, runs / (v.name if args.repeats == 1 else f"{v.name}-r{rep}"))
            for rep in range(args.repeats) for v in variants]


def run_variants(args, variants, kind: str):
    """Run every variant ``--repeats`` times, interleaved, each into ``OUT/runs/NAME[-rREP]`` with its
    log in ``OUT/logs`` (``--reuse``: parse what is there), and parse them; ``(results, failures)``
    with ``results`` as ``summarise`` takes it. ``--dry-run``: print the commands, run nothing,
    return None. Sets ``args.out`` (default ``runs/bench-KIND-<timestamp>``, made absolute)."""
    if not args.out:
        args.out = time.strftime(f"runs/bench-{kind}-%Y%m%d-%H%M%S")
    # Runs are launched from the repository root: make the output path independent of that.
    args.out = str(Path(args.out).resolve())
    out = Path(args.out)
    jobs = run_jobs(args, variants)
    if args.dry_run:
        for v, _, run_dir in jobs:
            print(shlex.join(launch_command(v, run_dir, args)))
        return None
    if not args.reuse:
        check_cluster() if args.nodes else check_network(args.net)
        existing = [str(d) for _, _, d in jobs if d.exists()]
        if existing:
            raise UserError(f"{existing[0]} already exists; choose a new --out, remove it, or pass --reuse")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    if args.train_subset and not args.reuse:
        write_subset(args)

    results, failures = {}, 0
    env = cluster_env() if args.nodes else dict(os.environ)    # one namespace: as users launch
    for v, _rep, run_dir in jobs:
        status = None
        if not reused(args, run_dir):
            cmd = launch_command(v, run_dir, args)
            print(f"[bench {kind}] {run_dir.name}: {shlex.join(cmd)}", flush=True)
            start = time.monotonic()
            log = out / "logs" / f"{run_dir.name}.log"
            with open(log, "w") as f:
                rc = run_bounded(cmd, env, args.timeout, stdout=f, cluster=bool(args.nodes))
            print(f"[bench {kind}] {run_dir.name}: exit {rc} after {time.monotonic() - start:.0f}s (log {log})",
                  flush=True)
            if rc != 0:
                status = f"failed (exit {rc}, see logs/{log.name})"
                failures += 1
        if status is None:
            try:
                results.setdefault(v.name, []).append(run_metrics(rundir.load_run(run_dir)))
                continue
            except UserError as exc:
                status = f"unreadable: {exc}"
                failures += 1
        if not results.get(v.name):
            results[v.name] = status
    return results, failures
