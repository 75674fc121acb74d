"""The tables of the training benchmarks (``bench train``, ``bench peers``): Markdown, CSV and the
result file (``ssdmpi/bench/result.py``) of their rows (``ssdmpi/bench/rows.py``).

``COLUMNS``: the first table, one row per variant; ``BREAKDOWN_COLUMNS``: the second, where each
variant's step goes and how close it is to its schedule's bound (``ssdmpi/bench/bounds.py``). Headers
name the baseline the others are compared with (``registry.BASELINE``).
"""

from __future__ import annotations

import csv
import io

from ssdmpi.algos import registry
from ssdmpi.bench import result as result_file

BASE = registry.BASELINE

# (column key, header) in table order.
COLUMNS = (
    ("name", "variant"),
    ("algo", "algo"),
    ("comm", "comm"),
    ("k", "k"),
    ("samples_per_s", "samples/s"),
    ("speedup", f"speedup vs {BASE}"),
    ("compute_ms", "compute ms/step"),
    ("inflight_ms", "in-flight ms/step"),
    ("wait_ms", "exposed wait ms/step"),
    ("mb_per_step", "MB sent/step"),
    ("final_acc", "final test acc %"),
    ("acc_delta", f"acc - {BASE} (points)"),
    ("wall_s", "train s"),
    ("tta_s", "time to target s"),
    ("tta_ratio", f"tta / {BASE} wall"),
    ("staleness", "mean staleness"),
    ("status", "status"),
)


# A language model's runs: tokens/s and validation loss in place of samples/s and test accuracy.
LANGUAGE_MODEL_COLUMNS = {
    "samples_per_s": ("tokens_per_s", "tokens/s"),
    "final_acc": ("final_loss", "final val loss"),
    "acc_delta": ("loss_delta_pct", f"val loss vs {BASE} %"),
}


def columns_for(rows, columns=COLUMNS) -> tuple:
    """``columns``, with ``LANGUAGE_MODEL_COLUMNS`` swapped in when the rows are a language model's runs
    (any row has a validation loss)."""
    if not any(row.get("final_loss") is not None for row in rows):
        return columns
    return tuple(LANGUAGE_MODEL_COLUMNS.get(key, (key, header)) for key, header in columns)


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
    ("speedup", f"speedup vs {BASE}"),
    ("window", "overlap steps d"),
    ("bound", "overlap bound"),
    ("of_bound", "of bound"),
    ("model_bound", "contention model"),
    ("of_model", "of model"),
    ("period_bound", "bound at d = k"),
    ("of_period_bound", "of it"),
)


def breakdown_table(rows, base_note: str = "") -> str:
    """The step-breakdown-and-bounds table (``BREAKDOWN_COLUMNS``) as Markdown."""
    lines = ["| " + " | ".join(h for _, h in BREAKDOWN_COLUMNS) + " |",
             "|" + "|".join("---" if k == "name" else "---:" for k, _ in BREAKDOWN_COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(k, row.get(k)) for k, _ in BREAKDOWN_COLUMNS) + " |")
    return (base_note + "\n" if base_note else "") + "\n".join(lines) + "\n"


def _fmt(key, value) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        if key in ("speedup", "tta_ratio", "bound", "model_bound", "period_bound", "x_ddp", "tta_x_ddp"):
            return f"{value:.2f}x"
        if key in ("of_bound", "of_model", "of_period_bound", "sum_ratio", "of_overlap_bound"):
            return f"{value:.3f}"
        if key == "final_loss":
            return f"{value:.4f}"
        if key == "tokens_per_s":
            return f"{value:.0f}"
        if key in ("acc_delta", "acc_vs_ddp", "loss_delta_pct", "loss_vs_ddp"):
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
