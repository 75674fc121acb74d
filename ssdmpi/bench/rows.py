"""The rows of the training benchmarks' tables (``bench train``, ``bench peers``): each finished run's
numbers, their medians over repeats, and each variant against the baseline (``registry.BASELINE``).

Definitions (per rank, delay-stage steps only; the warm-up is SSGD for every algorithm):

- samples/s: the trainer's logged ``samples_per_s``, harmonic mean over logged intervals
  (every interval covers the same number of samples, so this is total samples / total time);
- compute / in-flight / exposed wait, bytes sent: per-step means as the trainer logs them
  (``ssdmpi/metrics.py``), weighted by the steps each record covers (a ``--comm period``
  run sends one allreduce every k steps, so its per-step bytes are 1/k of ssgd's);
- mean staleness (parameter servers): the servers' version minus the version each applied
  gradient was computed on, mean over the delay-stage updates (``staleness_mean``, weighted by steps);
- speedup: samples/s over the baseline's (the first baseline variant ``ssdmpi train`` runs; blank
  without one);
- train s: wall-clock seconds spent in training steps (the trainer's ``train_s``: the
  evaluations and checkpoints, identical bookkeeping for every algorithm, are left out);
- the step breakdown per step, mean over ranks (``ssdmpi/phases.py``: forward+backward, update,
  data, exposed wait, progress calls, other; ``sum_ratio``: the timed phases' share of the step
  time), and the bounds of ``ssdmpi/bench/bounds.py``;
- target accuracy: the baseline's final test accuracy minus ``--target-drop`` (0.5 point);
  time to target: training seconds at the first evaluation reaching it; ``tta_ratio``: that
  time over the baseline's TOTAL training seconds;
- a language model's runs: tokens/s (the trainer's ``tokens_per_s``, as samples/s), the final
  validation loss of W (nats per token) and its difference to the baseline's in percent of it
  (``loss_delta_pct``); the target is the baseline's final loss plus ``--target-rise`` (1%) of it.

Runs are read by ``ssdmpi/rundir.py`` (``load_run``; its ``Run`` has the per-run numbers).
"""

from __future__ import annotations

from ssdmpi.bench.bounds import add_bounds, run_window
from ssdmpi.bench.stats import median
from ssdmpi.bench.variants import AUTO
from ssdmpi.phases import BREAKDOWN
from ssdmpi.rundir import get, number, per_step_means

# Per-step means read from the runs' step records (ssdmpi/metrics.py; the breakdown: ssdmpi/phases.py).
PER_STEP = ("compute_s", "inflight_s", "wait_s", "bytes_sent", "step_s", *BREAKDOWN)


def _per_step_means(run):
    """Per-step means of the ``PER_STEP`` fields over steady-state records, each record weighted
    by the steps it covers (``ssdmpi.rundir.per_step_means``)."""
    return per_step_means(run, PER_STEP)


def _staleness(run):
    """The mean staleness over the delay-stage records, weighted by the steps each covers (None for a
    run that logs none: one without parameter servers)."""
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
    """The raw per-run numbers of one parsed run (``ssdmpi.rundir.Run``), before comparison."""
    means = _per_step_means(run)
    wall = None
    if run.evals:
        wall = number(get(run.evals[-1], "train_time"))
    if wall is None:
        wall = number(get(run.summary, "train_time"))
    return {"samples_per_s": run.throughput(), "tokens_per_s": run.throughput("tokens_per_s"), **means,
            "staleness": _staleness(run), "final_acc": run.final_accuracy(), "final_loss": run.final_val_loss(),
            "wall_s": wall, "run": run}


MEDIANS = ("samples_per_s", "tokens_per_s", *PER_STEP, "final_acc", "final_loss", "wall_s", "staleness")


def summarise(variants, runs_by_variant: dict, target_drop: float = 0.005, target_rise: float = 0.01) -> list:
    """Table rows (dicts keyed like ``COLUMNS``), medians over repeats, compared with the baseline.

    ``runs_by_variant``: variant name -> list of ``run_metrics`` dicts (or a status string
    such as "failed (exit 1)" when no repeat produced a readable run). ``target_drop``: the target
    accuracy's distance below the baseline's (a fraction); ``target_rise``: a language model's target
    loss above the baseline's (a fraction of it).
    """
    rows, base = [], None
    for v in variants:
        results = runs_by_variant.get(v.name)
        row = {"name": v.name, "algo": v.algo, "comm": v.comm or "", "k": v.k if v.k is not None else ""}
        if not isinstance(results, list) or not results:
            row["status"] = results if isinstance(results, str) else "not run"
            rows.append(row)
            continue
        m = {key: median([r.get(key) for r in results]) for key in MEDIANS}
        m["runs"] = [r["run"] for r in results]
        if v.k == AUTO:       # the k each repeat's run chose (--delay auto)
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
    target_loss = base["final_loss"] * (1 + target_rise) if base and base["final_loss"] is not None else None
    for row in rows:
        m = row.pop("_m", None)
        if m is None:
            continue
        row["samples_per_s"] = m["samples_per_s"]
        row["tokens_per_s"] = m["tokens_per_s"]
        row["final_loss"] = m["final_loss"]
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
            if base["final_loss"] and m["final_loss"] is not None:
                row["loss_delta_pct"] = 100 * (m["final_loss"] / base["final_loss"] - 1)
        if target_loss is not None:
            row["tta_s"] = median([run.time_to_val_loss(target_loss) for run in m["runs"]])
        elif target is not None:
            row["tta_s"] = median([run.time_to_accuracy(target) for run in m["runs"]])
        if row.get("tta_s") is not None and base["wall_s"]:
            row["tta_ratio"] = row["tta_s"] / base["wall_s"]
    add_bounds(rows, variants, base)
    return rows


def breakdown_ms(m: dict) -> dict:
    """A row's breakdown columns (ms per step) from its per-step means; ``sum_ratio``: the timed
    phases (all but ``other``) over the step time (1.0: the timers cover the whole step)."""
    row = {f"{k[:-2]}_ms": None if m.get(k) is None else 1e3 * m[k] for k in ("step_s", *BREAKDOWN)}
    if m.get("step_s") and all(m.get(k) is not None for k in BREAKDOWN):
        row["sum_ratio"] = sum(m[k] for k in BREAKDOWN if k != "other_s") / m["step_s"]
    return row
