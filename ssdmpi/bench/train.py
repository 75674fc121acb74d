"""``ssdmpi bench train``: the same training job under several algorithms, on a throttled network.

Each variant is a whole ``ssdmpi train`` run on ``--ranks`` ranks (default 2), launched as
a subprocess::

    bin/ssdmpi-netns --rate 1gbit -- mpiexec -n 2 python -m ssdmpi train --run-dir OUT/runs/NAME ...

(``--net none``: plain ``mpiexec`` over shared memory; ``--nodes N``: on a namespaced cluster of
N nodes, ``--ranks-per-node`` ranks each, every node's NIC limited to ``--net`` --
``bin/ssdmpi-cluster run --nodes N --ranks-per-node R --nic RATE -- python -m ssdmpi train ...``,
``ssdmpi.bench.launch``). ``asgd:S`` runs its ``S`` servers on ranks of their own, after
the ``--ranks`` workers (with ``--nodes``: on ``S`` more nodes, one rank each, so a server
has a NIC of its own, as a parameter server would). Variants run one after another in
the order given and, with ``--repeats R``, the whole list is repeated R times (interleaved,
so slow drift of a shared machine hits every variant alike); tables use each variant's
median over repeats. Then every run directory is parsed (``ssdmpi.plot.load_run``) and
the results are written:

- ``OUT/results.md`` and ``OUT/results.csv``: one row per variant (columns in ``COLUMNS``);
- ``OUT/result.json``: the same rows, the settings, the command line and the machine
  (``ssdmpi/bench/result.py``; what ``ssdmpi bench report`` renders ``BENCHMARKS.md`` from);
- ``OUT/figures/*.png``: ``ssdmpi plot`` of all runs;
- ``OUT/logs/NAME.log``: each run's stdout and stderr.

``OUT`` is ``--out`` (default ``runs/bench-train-<timestamp>``). The defaults run the
communication-bound case of ``BENCHMARKS.md`` (wide-mlp on Fashion-MNIST, 2 ranks, 1 Gbit/s).

Definitions (per rank, delay-stage steps only; the warm-up is SSGD for every algorithm):

- samples/s: the trainer's logged ``samples_per_s``, harmonic mean over logged intervals
  (every interval covers the same number of samples, so this is total samples / total time);
- compute / in-flight / exposed wait, bytes sent: per-step means as the trainer logs them
  (``ssdmpi/metrics.py``), weighted by the steps each record covers (a ``--comm period``
  run sends one allreduce every k steps, so its per-step bytes are 1/k of ssgd's);
- mean staleness (asgd): the servers' version minus the version each applied gradient was
  computed on, mean over the delay-stage updates (``staleness_mean``, weighted by steps);
- speedup: samples/s over ssgd's (the first ssgd variant ``ssdmpi train`` runs; blank without one);
- train s: wall-clock seconds spent in training steps (the trainer's ``train_s``: the
  evaluations and checkpoints, identical bookkeeping for every algorithm, are left out);
- the second table (``BREAKDOWN_COLUMNS``): the step breakdown per step, mean over ranks
  (``ssdmpi/phases.py``: forward+backward, update, data, exposed wait, progress calls, other;
  ``phases / step`` is the timed phases' share of the step time), the allreduce's time in
  flight, and the bounds: from ssgd's own measured compute ``c`` and the rest of its step
  ``T`` (``c + T`` is ssgd's step), the schedule's speedup with perfect overlap (``(c + T) /
  max(c, T/k)`` for ssd period k) and with ``bench model``'s contention model (the variant's
  own compute and in-flight allreduce times as ``c_busy``, ``T_busy``); ``of bound`` is the
  measured speedup over the bound (``add_bounds``);
- target accuracy: ssgd's final test accuracy minus ``--target-drop`` (0.5 point);
  time to target: training seconds at the first evaluation reaching it; ``tta/ssgd``: that
  time over ssgd's TOTAL training seconds (the issue's "at most 0.6x ssgd's wall time").

Never overwrites: a run directory that already exists is an error unless ``--reuse``,
which parses it instead of training again (to rebuild tables after a change).
"""

from __future__ import annotations

import csv
import io
import os
import shlex
import sys
import time
from argparse import ArgumentTypeError
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from ssdmpi.algos import registry
from ssdmpi.bench import result as result_file
from ssdmpi.bench.flags import deprecated_alias
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
from ssdmpi.bench.model.alphabeta import PATTERNS, predict_step
from ssdmpi.bench.stats import median
from ssdmpi.errors import UserError
from ssdmpi.metrics import atomic_write
from ssdmpi.parsing import parse_list
from ssdmpi.phases import BREAKDOWN

# Per-step means read from the runs' step records (ssdmpi/metrics.py; the breakdown: ssdmpi/phases.py).
PER_STEP = ("compute_s", "inflight_s", "wait_s", "bytes_sent", "step_s", *BREAKDOWN)

# (column key, header) in table order.
COLUMNS = (
    ("name", "variant"),
    ("algo", "algo"),
    ("comm", "comm"),
    ("k", "k"),
    ("samples_per_s", "samples/s"),
    ("speedup", "speedup vs ssgd"),
    ("compute_ms", "compute ms/step"),
    ("inflight_ms", "in-flight ms/step"),
    ("wait_ms", "exposed wait ms/step"),
    ("mb_per_step", "MB sent/step"),
    ("final_acc", "final test acc %"),
    ("acc_delta", "acc - ssgd (points)"),
    ("wall_s", "train s"),
    ("tta_s", "time to target s"),
    ("tta_ratio", "tta / ssgd wall"),
    ("staleness", "mean staleness"),
    ("status", "status"),
)


@dataclass
class Variant:
    """One training configuration: a name, its algorithm and the settings its ``ssdmpi train`` flags give
    (``bench train`` variant ``ssd:period:5`` is ``ssd`` with ``comm: period, delay: 5``)."""

    name: str
    algo: str
    settings: dict = field(default_factory=dict)
    extra: tuple = ()              # more flags of its own (e.g. --progress thread)
    program: tuple = ("ssdmpi", "train")   # python -m PROGRAM (bench peers: its PyTorch peers)

    @property
    def spec(self):
        return registry.algorithm(self.algo)

    @property
    def by_ssdmpi(self) -> bool:
        """Trained by ``ssdmpi train`` (not by a peer that takes its flags)."""
        return self.program == ("ssdmpi", "train")

    @property
    def comm(self):
        return self.settings.get("comm")

    @property
    def k(self):
        """The delay k, given or fixed by the algorithm (``"auto"``: --delay auto), or None."""
        return self.settings.get("delay", self.spec.fixed.get("delay"))

    @property
    def servers(self):
        """asgd: parameter-server ranks, on top of the workers."""
        return self.settings.get("servers")

    def train_flags(self) -> list:
        return ["--algo", self.algo] + [part for name, value in self.settings.items()
                                        for part in (f"--{registry.SETTINGS[name].flag}", str(value))] \
            + list(self.extra)


def parse_variant(text: str) -> Variant:
    """``NAME[:V1[:V2]]`` -> ``Variant``: an algorithm and the values of its ``bench`` settings, in
    order (``ssd:period:5``, ``localsgd:5``, ``asgd:2``; those past ``bench_required`` may be left
    out: their defaults), then, after
    ``auto``, the ``--delay-max`` (``ssd:period:auto:8``) or a setting by its tag (``d2``). The name
    joins the algorithm and each value's tag: ``ssd-period-k5``, ``ssd-period-kauto-max8``."""
    name, *parts = text.strip().split(":")
    spec, given = registry.find(name), {}
    try:
        if spec is None:
            raise ValueError(text)
        required = len(spec.bench) if spec.bench_required is None else spec.bench_required
        if not required <= len(parts) <= len(spec.bench) + 1:
            raise ValueError(text)
        for i, part in enumerate(parts):
            key = spec.bench[i] if i < len(spec.bench) else "delay_max" if given.get("delay") == "auto" \
                else _tagged(spec, part)
            s = registry.SETTINGS[key]
            part = part.removeprefix(s.bench_tag.split("{")[0]) if key not in spec.bench + ("delay_max",) else part
            given[key] = s.type(part) if s.type else part
        registry.resolve({"algo": name, "warmup_steps": None, **given})    # what the run would refuse
    except (ValueError, UserError, ArgumentTypeError):
        raise UserError(f"--variants: {text!r} is not understood; use ssgd, odsgd, ssd:period:K, ssd:step:K, "
                        "localsgd:K or asgd:S (K a positive integer; ssd:period also takes auto or auto:M, M the "
                        f"--delay-max{_rule_tags()}; S servers)") from None
    settings = {k: given.get(k, registry.SETTINGS[k].default) for k in spec.bench} | given
    tags = [registry.SETTINGS[k].bench_tag.format(v) for k, v in settings.items()]
    return Variant("-".join([name] + tags), name, settings)


def _rule_tags() -> str:
    """``, and ssd:period:K:dD (--merge-delay D with --period-rule delta-merge)``: each rule's own settings
    a variant may add by their tags."""
    tags = [f"ssd:period:K:{s.bench_tag.format(s.metavar or 'V')} (--{s.flag} {s.metavar or 'V'} with "
            f"--period-rule {rule})" for rule, spec in registry.RULES.items() for s in spec.settings if s.bench_tag]
    return "".join(f", and {t}" for t in tags)


def _tagged(spec, part: str) -> str:
    """The setting of ``spec`` whose ``bench_tag`` prefixes ``part`` (``d2``: ``d{}``)."""
    for setting in spec.settings:
        key = setting.name
        prefix = (registry.SETTINGS[key].bench_tag or "{").split("{")[0]
        if prefix and key not in spec.bench and part.startswith(prefix):
            return key
    raise ValueError(part)


def default_variants(ks) -> list:
    """ssgd, then ssd period and step for every k, odsgd, and localsgd for every k."""
    return [parse_variant(v) for v in ["ssgd", *(f"ssd:period:{k}" for k in ks), *(f"ssd:step:{k}" for k in ks),
                                       "odsgd", *(f"localsgd:{k}" for k in ks)]]


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
    train = [sys.executable, "-m", *variant.program, "--run-dir", str(run_dir),
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
    """``train`` on ``--nodes`` nodes x ``--ranks-per-node`` (asgd: plus one node per server)."""
    per_node = args.ranks_per_node or 1
    return cluster_command(train, args.nodes + (variant.servers or 0), per_node, args.net)


# ----------------------------------------------------------------------------- results

def _per_step_means(run):
    """Per-step means of the ``PER_STEP`` fields over steady-state records, each record weighted
    by the steps it covers (``ssdmpi.plot.per_step_means``)."""
    from ssdmpi.plot import per_step_means

    return per_step_means(run, PER_STEP)


def _staleness(run):
    """asgd's mean staleness over the delay-stage records, weighted by the steps each covers
    (None for the other algorithms, which log none)."""
    from ssdmpi.plot import get, number

    steady = {id(r) for r in run.steady_steps()}
    total = steps = 0.0
    prev = 0.0
    for r in run.steps:
        step, value = number(get(r, "step")), number(get(r, "staleness_mean"))
        n, prev = (step - prev if step is not None else 0), (step if step is not None else prev)
        if value is not None and n > 0 and id(r) in steady:
            total, steps = total + value * n, steps + n
    return total / steps if steps else None


def run_metrics(run) -> dict:
    """The raw per-run numbers of one parsed run (``ssdmpi.plot.Run``), before comparison."""
    from ssdmpi.plot import get, number

    means = _per_step_means(run)
    wall = None
    if run.evals:
        wall = number(get(run.evals[-1], "train_time"))
    if wall is None:
        wall = number(get(run.summary, "train_time"))
    return {"samples_per_s": run.throughput(), **means, "staleness": _staleness(run),
            "final_acc": run.final_accuracy(), "wall_s": wall, "run": run}


def summarise(variants, runs_by_variant: dict, target_drop: float = 0.005) -> list:
    """Table rows (dicts keyed like ``COLUMNS``), medians over repeats, compared with ssgd.

    ``runs_by_variant``: variant name -> list of ``run_metrics`` dicts (or a status string
    such as "failed (exit 1)" when no repeat produced a readable run).
    """
    rows, base = [], None
    for v in variants:
        results = runs_by_variant.get(v.name)
        row = {"name": v.name, "algo": v.algo, "comm": v.comm or "", "k": v.k if v.k is not None else ""}
        if not isinstance(results, list) or not results:
            row["status"] = results if isinstance(results, str) else "not run"
            rows.append(row)
            continue
        m = {key: median([r.get(key) for r in results]) for key in
             ("samples_per_s", *PER_STEP, "final_acc", "wall_s", "staleness")}
        m["runs"] = [r["run"] for r in results]
        if v.k == "auto":       # the k each repeat's run chose (--delay auto)
            row["k_chosen"] = [(r["run"].summary.get("delay_auto") or {}).get("delay") for r in results]
            row["k"] = f"auto ({', '.join(str(k) for k in row['k_chosen'])})"
        if v.comm == "period":
            row["windows"] = [run_window(r["run"]) for r in results]
        row["status"] = "ok" if len(results) == 1 else f"ok (median of {len(results)})"
        row["_m"] = m
        rows.append(row)
        if v.spec.baseline and v.by_ssdmpi and base is None:
            base = m
    target = base["final_acc"] - target_drop if base and base["final_acc"] is not None else None
    for row in rows:
        m = row.pop("_m", None)
        if m is None:
            continue
        row["samples_per_s"] = m["samples_per_s"]
        row["compute_ms"] = None if m["compute_s"] is None else 1e3 * m["compute_s"]
        row["inflight_ms"] = None if m["inflight_s"] is None else 1e3 * m["inflight_s"]
        row["wait_ms"] = None if m["wait_s"] is None else 1e3 * m["wait_s"]
        row["mb_per_step"] = None if m["bytes_sent"] is None else m["bytes_sent"] / 1e6
        row["final_acc"] = None if m["final_acc"] is None else 100 * m["final_acc"]
        row["wall_s"] = m["wall_s"]
        row.update(breakdown_ms(m))
        row["staleness"] = m["staleness"]
        if base is not None:
            if base["samples_per_s"] and m["samples_per_s"]:
                row["speedup"] = m["samples_per_s"] / base["samples_per_s"]
            if base["final_acc"] is not None and m["final_acc"] is not None:
                row["acc_delta"] = 100 * (m["final_acc"] - base["final_acc"])
        if target is not None:
            row["tta_s"] = median([run.time_to_accuracy(target) for run in m["runs"]])
            if row["tta_s"] is not None and base["wall_s"]:
                row["tta_ratio"] = row["tta_s"] / base["wall_s"]
    add_bounds(rows, variants, base)
    return rows


# ----------------------------------------------------------------------------- step breakdown and bounds

# The second table: where each variant's step goes, and how close it is to its schedule's bound.
BREAKDOWN_COLUMNS = (
    ("name", "variant"),
    ("step_ms", "step ms"),
    ("fb_ms", "fwd+bwd ms"),
    ("update_ms", "update ms"),
    ("data_ms", "data ms"),
    ("blocked_ms", "exposed wait ms"),
    ("progress_ms", "progress ms"),
    ("sync_ms", "sync ms"),
    ("other_ms", "other ms"),
    ("sum_ratio", "phases / step"),
    ("allreduce_ms", "allreduce ms (in flight)"),
    ("speedup", "speedup vs ssgd"),
    ("window", "overlap steps d"),
    ("bound", "overlap bound"),
    ("of_bound", "of bound"),
    ("model_bound", "contention model"),
    ("of_model", "of model"),
    ("period_bound", "bound at d = k"),
    ("of_period_bound", "of it"),
)


def breakdown_ms(m: dict) -> dict:
    """A row's breakdown columns (ms per step) from its per-step means; ``sum_ratio``: the timed
    phases (all but ``other``) over the step time (1.0: the timers cover the whole step)."""
    row = {f"{k[:-2]}_ms": None if m.get(k) is None else 1e3 * m[k] for k in ("step_s", *BREAKDOWN)}
    if m.get("step_s") and all(m.get(k) is not None for k in BREAKDOWN):
        row["sum_ratio"] = sum(m[k] for k in BREAKDOWN if k != "other_s") / m["step_s"]
    return row


def _pattern(v: Variant):
    """``(kind, k)`` of ``bench model``'s step model for a variant (the algorithm's ``pattern``), or None
    (no model for it: a peer's)."""
    return v.spec.pattern(SimpleNamespace(comm=v.comm, delay=v.k)) if v.by_ssdmpi else None


def ssgd_c_and_T(compute, step) -> tuple | None:
    """ssgd's measured compute ``c`` and communication ``T`` per step from its compute and step times
    (any one unit): ``T`` is the rest of its step (``c + T`` is ssgd's measured step); None when a
    time is missing.

    Not the allreduces' summed time in flight: ssgd's bucket allreduces overlap its backward pass
    and each other, so their times in flight add up to more than the step itself.
    """
    if not compute or not step:
        return None
    return compute, max(step - compute, 0.0)


def add_bounds(rows, variants, base) -> None:
    """Add each row's bounds from ssgd's own measured compute ``c`` and communication ``T`` per step
    (``ssgd_c_and_T``):

    - ``bound``: the schedule's speedup over ssgd with perfect overlap (``bench model``'s
      ``predict_step`` without contention): for ssd period k with merge delay d (``run_window``),
      ``k (c + T) / (k c + max(0, T - d c))``, ``(c + T) / max(c, T/k)`` at ``d = k``;
    - ``model_bound``: the same with the contention model of ``bench model``: the variant's own
      compute per step as ``c_busy`` and its own allreduce time in flight as ``T_busy``;
    - ``of_bound`` / ``of_model``: the measured speedup over each (1.0: at the bound);
    - ``period_bound`` / ``of_period_bound`` (a period run whose merge delay exposes part of the
      allreduce, ``d c < T``): the bound with a whole period of hiding, ``(c + T) / max(c, T/k)``, and
      the speedup over it: what the merge delay costs.
    """
    c_and_T = ssgd_c_and_T(base.get("compute_s"), base.get("step_s")) if base else None
    if c_and_T is None:
        return
    c, T = c_and_T
    by_name = {v.name: v for v in variants}
    for row in rows:
        v = by_name.get(row["name"])
        pattern = _pattern(v) if v is not None else None
        if pattern is None or row.get("speedup") is None:
            continue
        kind, k = pattern
        if k == "auto":     # bounded at the k its repeats chose, when they chose one
            k = _agreed(row.get("k_chosen"))
            if k is None:
                continue
        window = _agreed(row.get("windows")) if kind == "period" else None
        if kind == "period" and window is None:     # repeats that overlapped differently, or unknown
            continue
        row["window"] = window
        row["bound"] = (c + T) / predict_step(kind, c, T, k, window=window)
        per_allreduce = k if PATTERNS[kind].periodic else 1     # a period run sends once every k steps
        c_busy = None if row.get("compute_ms") is None else row["compute_ms"] / 1e3
        t_busy = None if row.get("inflight_ms") is None else row["inflight_ms"] / 1e3 * per_allreduce
        row["allreduce_ms"] = None if t_busy is None else 1e3 * t_busy
        row["model_bound"] = (c + T) / predict_step(kind, c, T, k, c_busy, t_busy, window=window)
        row["of_bound"] = row["speedup"] / row["bound"]
        row["of_model"] = row["speedup"] / row["model_bound"]
        if kind == "period":
            whole = (c + T) / predict_step(kind, c, T, k)   # a whole period of hiding (d = k)
            if whole > row["bound"]:                        # the merge delay exposes part of the allreduce
                row["period_bound"], row["of_period_bound"] = whole, row["speedup"] / whole


def _agreed(values):
    """The one value every repeat gave; None when there is none, or several."""
    distinct = set(values or [None])
    return distinct.pop() if len(distinct) == 1 else None


def run_window(run):
    """The steps of a period an ssd period run's allreduce may overlap: its merge delay ``d``
    (``--merge-delay``, or what ``--delay auto`` chose), its ``k`` for a rule that merges at the next
    period's end (one without a merge delay of its own, or a run from before the period rules)."""
    rule = registry.RULES.get(run.setting("period_rule"))
    chosen = run.summary.get("delay_auto") or {}
    if rule is None or rule.auto_chooses != "merge_delay":
        return run.setting("delay") if run.setting("delay") != "auto" else chosen.get("delay")
    return run.setting("merge_delay") or chosen.get("merge_delay")


def breakdown_table(rows, base_note: str = "") -> str:
    """The step-breakdown-and-bounds table (``BREAKDOWN_COLUMNS``) as Markdown."""
    lines = ["| " + " | ".join(h for _, h in BREAKDOWN_COLUMNS) + " |",
             "|" + "|".join("---" if k == "name" else "---:" for k, _ in BREAKDOWN_COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(k, row.get(k)) for k, _ in BREAKDOWN_COLUMNS) + " |")
    return (base_note + "\n" if base_note else "") + "\n".join(lines) + "\n"


def bound_note(rows) -> str:
    """One line naming ssgd's measured ``c`` and ``T`` the bounds come from."""
    for row in rows:
        spec = registry.find(row.get("algo"))
        c_and_T = ssgd_c_and_T(row.get("compute_ms"), row.get("step_ms"))
        if spec and spec.baseline and c_and_T is not None:
            c, T = c_and_T
            return (f"Bounds from ssgd's measured compute c = {c:.1f} ms and communication T = {T:.1f} ms per "
                    f"step, the rest of its step "
                    f"(ssd period k with merge delay d: k (c + T) / (k c + max(0, T - d c)), which is "
                    f"(c + T) / max(c, T/k) at d = k; contention model: ssdmpi bench model's, with each "
                    f"variant's own compute and allreduce-in-flight times).")
    return ""


def _fmt(key, value) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        if key in ("speedup", "tta_ratio", "bound", "model_bound", "period_bound", "x_ddp", "tta_x_ddp"):
            return f"{value:.2f}x"
        if key in ("of_bound", "of_model", "of_period_bound", "sum_ratio", "of_overlap_bound"):
            return f"{value:.3f}"
        if key in ("acc_delta", "acc_vs_ddp"):
            return f"{value:+.2f}"
        if key in ("mb_per_step", "staleness"):
            return f"{value:.3f}"
        if key in ("final_acc", "compute_ms", "inflight_ms", "wait_ms", "wall_s", "tta_s") or key.endswith("_ms"):
            return f"{value:.2f}" if value < 100 else f"{value:.1f}"
        return f"{value:.1f}"
    return str(value)


def markdown_table(rows, columns=COLUMNS) -> str:
    """The rows as a GitHub Markdown table of ``columns`` (formatted numbers; blank where unknown)."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |",
             "|" + "|".join("---" if k in ("name", "algo", "comm", "status") else "---:" for k, _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(k, row.get(k)) for k, _ in columns) + " |")
    return "\n".join(lines) + "\n"


def csv_table(rows, tables=(COLUMNS, BREAKDOWN_COLUMNS)) -> str:
    """The rows as CSV with machine-friendly headers (the keys of each table's columns, in
    order, each once: by default ``COLUMNS``, then ``BREAKDOWN_COLUMNS``) and full precision."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    keys = []
    for columns in tables:
        keys += [k for k, _ in columns if k not in keys]
    writer.writerow(keys)
    for row in rows:
        writer.writerow(["" if row.get(k) is None else row.get(k) for k in keys])
    return buf.getvalue()


def result_json(rows, settings: str, benchmark: str = "train", tables=(COLUMNS, BREAKDOWN_COLUMNS),
                **extra) -> str:
    """The result file of ``ssdmpi bench BENCHMARK`` (``ssdmpi/bench/result.py``): ``settings`` (the
    table header's text), ``rows`` (one object per variant with the keys of ``tables``' columns,
    None where unknown) and any ``extra`` keys."""
    keys = []
    for columns in tables:
        keys += [k for k, _ in columns if k not in keys]
    return result_file.dumps({**result_file.provenance(benchmark), "settings": settings, **extra,
                              "rows": [{k: row.get(k) for k in keys} for row in rows]})


# ----------------------------------------------------------------------------- command

def _delays(text: str) -> list:
    return parse_list(text, "--delays", int, minimum=1, example="2,5,10")


def add_arguments(parser) -> None:
    add_run_arguments(parser, "train")
    delays = parser.add_argument("--delays", default="5", metavar="K1,K2",
                                 help="delays/periods k for the default variants (default %(default)s)")
    deprecated_alias(parser, "--k", delays)
    parser.add_argument("--variants", metavar="V1,V2",
                        help="explicit variants instead of the default list: ssgd, odsgd, ssd:period:K, "
                             "ssd:step:K, localsgd:K (ssd:period K may be auto: --delay auto, or auto:M: with "
                             f"--delay-max M{_rule_tags()}), asgd:S (S parameter servers, on ranks of their own)")


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
                        help="MPI ranks per run (default 2; asgd's servers come on top)")
    add_node_arguments(parser)
    parser.add_argument("--dataset", default="fashion-mnist", help="dataset of every run (default %(default)s)")
    parser.add_argument("--train-subset", type=int, default=None, metavar="N",
                        help="train on the first N training images only (written once to OUT/data/ as HDF5; "
                             "the whole test split is kept), for short epochs")
    parser.add_argument("--model", default="wide-mlp",
                        help="model of every run (default %(default)s: 20 M parameters, communication-bound at "
                             "1 Gbit/s)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (default %(default)s)")
    parser.add_argument("--steps", type=int, default=None, help="iterations per run (overrides --epochs)")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank (default %(default)s)")
    parser.add_argument("--lr", type=float, default=0.05, help="global learning rate (default %(default)s)")
    parser.add_argument("--warmup-steps", type=int, default=20, help="SSGD warm-up iterations (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run (default %(default)s)")
    parser.add_argument("--train-args", default="", metavar="'FLAGS'",
                        help="more 'ssdmpi train' flags for every run, quoted, e.g. '--log-every 5'")
    parser.add_argument("--repeats", type=int, default=1,
                        help="repeat the variant list R times, interleaved (default %(default)s)")
    parser.add_argument("--target-drop", type=float, default=0.5, metavar="POINTS",
                        help="target accuracy = ssgd's final minus this many points (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=3600, metavar="SEC", help="per run (default %(default)s)")
    parser.add_argument("--reuse", action="store_true", help="parse existing run directories instead of re-running")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")


def _validate(args) -> list:
    check_run_arguments(args)
    if args.variants:
        variants = [parse_variant(v) for v in args.variants.split(",")]
    else:
        variants = default_variants(_delays(args.delays))
    check_variants(args, variants)
    return variants


def check_run_arguments(args) -> None:
    """``UserError`` (one line) for a bad ``add_run_arguments`` flag; resolves ``args.ranks``."""
    args.ranks = node_ranks(args, 2)
    if args.ranks < 1:
        raise UserError(f"--ranks must be >= 1, got {args.ranks}")
    if args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")
    if args.epochs < 1 or (args.steps is not None and args.steps < 1):
        raise UserError("--epochs and --steps must be positive")
    if args.train_subset is not None and args.train_subset < 1:
        raise UserError(f"--train-subset must be a positive number of images, got {args.train_subset}")
    if args.timeout <= 0:
        raise UserError(f"--timeout must be > 0, got {args.timeout}")
    if not args.net or (args.net != "none" and not args.net[0].isdigit()):
        raise UserError(f"--net {args.net!r}: give a tc rate such as 1gbit or 100mbit, or 'none'")
    try:
        shlex.split(args.train_args or "")
    except ValueError as exc:
        raise UserError(f"--train-args: {exc}") from None


def check_variants(args, variants) -> None:
    """``UserError`` for a variant listed twice, or one that does not fit ``--nodes``."""
    _check_nodes(args, variants)
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise UserError(f"--variants lists a variant twice: {', '.join(names)}")


def _check_nodes(args, variants) -> None:
    """``--nodes`` with asgd: a server takes a node of its own, so one rank per node."""
    if args.nodes and (args.ranks_per_node or 1) > 1 and any(v.servers for v in variants):
        raise UserError("asgd with --nodes puts each server on a node of its own: use --ranks-per-node 1")


def _where(args) -> str:
    """Where the ranks run, for the table header and figure titles."""
    if args.nodes:
        return f"{args.nodes} nodes x {args.ranks_per_node or 1} rank(s), NIC {args.net}"
    return f"{args.ranks} ranks, net {args.net}"


def settings_line(args, kind: str = "train") -> str:
    """One line naming the job every variant of ``ssdmpi bench KIND`` ran (the tables' header)."""
    return f"ssdmpi bench {kind}: {setup_line(args)}"


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
    rows = summarise(variants, results, target_drop=args.target_drop / 100.0)
    md, text_csv = markdown_table(rows), csv_table(rows)
    md += "\n" + breakdown_table(rows, bound_note(rows))
    atomic_write(out / "results.md", f"<!-- {settings_line(args)} -->\n" + md)
    atomic_write(out / "results.csv", text_csv)
    atomic_write(out / "result.json", result_json(rows, settings_line(args), **earlier))
    write_figures(args, results)
    print(md, end="")
    print(f"[bench train] wrote {out / 'results.md'}, {out / 'results.csv'}, {out / 'result.json'}, "
          f"{out / 'figures'}/")
    return 1 if failures else 0


def setup_line(args) -> str:
    """What every run of a benchmark trains, and where (the tables' header)."""
    dataset = args.dataset + (f" (first {args.train_subset} training images)" if args.train_subset else "")
    return (f"{args.model} on {dataset}, {_where(args)}, batch {args.batch_size}/rank, lr {args.lr}, "
            f"{f'{args.steps} steps' if args.steps else f'{args.epochs} epochs'}, warm-up {args.warmup_steps}")


def write_figures(args, results: dict) -> None:
    """``ssdmpi plot``'s figures of every readable run into ``OUT/figures``."""
    from ssdmpi.plot import make_figures

    runs = [r["run"] for rs in results.values() if isinstance(rs, list) for r in rs]
    if runs:
        make_figures(runs, Path(args.out) / "figures", title=f"{args.model}, {_where(args)}")


def reused(args, run_dir: Path) -> bool:
    """Whether ``--reuse`` parses the run in ``run_dir`` instead of running it (it has its metrics)."""
    return bool(args.reuse) and (run_dir / "metrics.jsonl").exists()


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

    from ssdmpi.plot import load_run

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
                results.setdefault(v.name, []).append(run_metrics(load_run(run_dir)))
                continue
            except UserError as exc:
                status = f"unreadable: {exc}"
                failures += 1
        if not results.get(v.name):
            results[v.name] = status
    return results, failures
