"""The speedup bounds of the training benchmarks' second table: how close each variant's measured
speedup over the baseline (``registry.BASELINE``) is to what its schedule allows.

From the baseline's own measured compute ``c`` and the rest of its step ``T`` (``c + T`` is its
step), each variant's communication pattern (its spec's ``pattern``, in ``ssdmpi bench model``'s
terms: ``ssdmpi/bench/model/alphabeta.py``) gives its speedup with perfect overlap and with ``bench
model``'s contention model (the variant's own compute and in-flight allreduce times as ``c_busy``,
``T_busy``); ``of bound`` is the measured speedup over the bound (``add_bounds``). Patterns the
step model has no formula for (parameter servers) get none.
"""

from __future__ import annotations

from types import SimpleNamespace

from ssdmpi.algos import registry
from ssdmpi.bench.model.alphabeta import PATTERNS, kind_label, predict_step
from ssdmpi.bench.variants import AUTO

BASE = registry.BASELINE
PERIOD = "period"      # the pattern of one allreduce per period, overlapped (``alphabeta.PATTERNS``)


def _pattern(v):
    """``(kind, k)`` of ``bench model``'s step model for a variant (the algorithm's ``pattern``), or None
    (no model for it: a peer's, or a pattern ``predict_step`` has no formula for)."""
    if not v.by_ssdmpi:
        return None
    pattern = v.spec.pattern(SimpleNamespace(**{**v.settings, "comm": v.comm, "delay": v.k, "servers": v.servers}))
    return pattern if pattern is not None and PATTERNS[pattern[0]].allreduce != "servers" else None


def baseline_c_and_T(compute, step) -> tuple | None:
    """The baseline's measured compute ``c`` and communication ``T`` per step from its compute and step
    times (any one unit): ``T`` is the rest of its step (``c + T`` is its measured step); None when a
    time is missing.

    Not the allreduces' summed time in flight: the baseline's bucket allreduces overlap its backward pass
    and each other, so their times in flight add up to more than the step itself.
    """
    if not compute or not step:
        return None
    return compute, max(step - compute, 0.0)


def add_bounds(rows, variants, base) -> None:
    """Add each row's bounds from the baseline's own measured compute ``c`` and communication ``T`` per
    step (``baseline_c_and_T``):

    - ``bound``: the schedule's speedup over the baseline with perfect overlap (``bench model``'s
      ``predict_step`` without contention): for ssd period k with merge delay d (``run_window``),
      ``k (c + T) / (k c + max(0, T - d c))``, ``(c + T) / max(c, T/k)`` at ``d = k``;
    - ``model_bound``: the same with the contention model of ``bench model``: the variant's own
      compute per step as ``c_busy`` and its own allreduce time in flight as ``T_busy``;
    - ``of_bound`` / ``of_model``: the measured speedup over each (1.0: at the bound);
    - ``period_bound`` / ``of_period_bound`` (a period run whose merge delay exposes part of the
      allreduce, ``d c < T``): the bound with a whole period of hiding, ``(c + T) / max(c, T/k)``, and
      the speedup over it: what the merge delay costs.
    """
    c_and_T = baseline_c_and_T(base.get("compute_s"), base.get("step_s")) if base else None
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
        if k == AUTO:       # bounded at the k its repeats chose, when they chose one
            k = _agreed(row.get("k_chosen"))
            if k is None:
                continue
        window = _agreed(row.get("windows")) if kind == PERIOD else None
        if kind == PERIOD and window is None:     # repeats that overlapped differently, or unknown
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
        if kind == PERIOD:
            whole = (c + T) / predict_step(kind, c, T, k)   # a whole period of hiding (d = k)
            if whole > row["bound"]:                        # the merge delay exposes part of the allreduce
                row["period_bound"], row["of_period_bound"] = whole, row["speedup"] / whole


def _agreed(values):
    """The one value every repeat gave; None when there is none, or several."""
    distinct = set(values or [None])
    return distinct.pop() if len(distinct) == 1 else None


def run_window(run):
    """The steps of a period a period run's allreduce may overlap: its rule's merge delay ``d`` (the setting
    its ``--delay auto`` chooses, ``RuleSpec.auto_chooses``: given, or what auto chose), its ``k`` for a
    rule that merges at the next period's end (one without a merge delay of its own, or a run from before
    the period rules)."""
    rule = registry.RULES.get(run.setting(registry.RULE_SELECTOR))
    chosen = run.summary.get("delay_auto") or {}
    if rule is None or rule.auto_chooses is None:
        return run.setting("delay") if run.setting("delay") != AUTO else chosen.get("delay")
    return run.setting(rule.auto_chooses) or chosen.get(rule.auto_chooses)


def bound_note(rows) -> str:
    """One line naming the baseline's measured ``c`` and ``T`` the bounds come from."""
    for row in rows:
        spec = registry.find(row.get("algo"))
        c_and_T = baseline_c_and_T(row.get("compute_ms"), row.get("step_ms"))
        if spec and spec.baseline and c_and_T is not None:
            c, T = c_and_T
            return (f"Bounds from {BASE}'s measured compute c = {c:.1f} ms and communication T = {T:.1f} ms "
                    f"per step, the rest of its step "
                    f"({kind_label(PERIOD)} k with merge delay d: k (c + T) / (k c + max(0, T - d c)), which is "
                    f"(c + T) / max(c, T/k) at d = k; contention model: ssdmpi bench model's, with each "
                    f"variant's own compute and allreduce-in-flight times).")
    return ""
