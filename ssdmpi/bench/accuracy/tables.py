"""The Markdown of ``ssdmpi bench accuracy``: a table per ``k`` (rows model x lr x N, a column per variant,
each against the baseline of its row) and the report around them.

An image model's figure is its test accuracy (%, higher is better), compared in points; a language model's is
its validation loss (nats per token, lower is better), compared relative to the baseline's, in percent.
"""

from __future__ import annotations

from ssdmpi.algos import registry
from ssdmpi.bench.accuracy.configs import BASELINE, LANGUAGE_MODELS, NO_DELAY, gpt_sizes, gpt_text, runs_at

# The figures compared relative to the baseline's (percent) rather than in points.
RELATIVE = ("val_loss", "val_loss_tail")

# --- the table -------------------------------------------------------------------------

def table(rows: list[dict], models, lrs, ranks, variants, k: int, seeds: int = 1, field: str = "acc_W") -> str:
    """Markdown for one ``k``: rows model x lr x N, a column per variant (``NO_DELAY`` ones at k = 0),
    of the rows' ``field`` (``acc_W``, ``acc_W_tail``, a language model's ``val_loss`` or ``val_loss_tail``:
    rows without it count as not run).

    A cell over the seeds run: ``mean [mean difference to ssgd, paired by seed] (min..max)``;
    one seed: ``acc [difference]``; a ``RELATIVE`` field's difference is ``100 * (value - ssgd's) /
    ssgd's``, in percent (``2.0154 [+0.43%]``); the bracket is left out where the row's ssgd did not run
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
                    cells.append(_cell(runs, ref, seeds, field in RELATIVE))
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(runs: dict, ref: dict, seeds: int = 1, relative: bool = False) -> str:
    """``{seed: figure}`` and the row's ssgd ``{seed: figure}`` -> the table cell (see ``table``)."""
    if not runs:
        return "—"
    values = list(runs.values())
    digits = 4 if relative else 2
    text = f"{sum(values) / len(values):.{digits}f}"
    paired = [relative_difference(runs[s], ref[s]) if relative else runs[s] - ref[s] for s in runs if s in ref]
    if paired:
        text += f" [{sum(paired) / len(paired):+.2f}{'%' if relative else ''}]"
    spread = [f"{min(values):.{digits}f}..{max(values):.{digits}f}"] if len(values) > 1 else []
    if len(values) < seeds:
        spread.append(f"{len(values)} of {seeds} seeds")
    if spread:
        text += f" ({', '.join(spread)})"
    return text


def relative_difference(value: float, reference: float) -> float:
    """``100 * (value - reference) / reference``: percent of the reference."""
    return 100.0 * (value - reference) / reference


def with_diffs(rows: list[dict]) -> list[dict]:
    """Each row plus ``diff_vs_ssgd`` and ``diff_tail_vs_ssgd`` (points: ``acc_W`` and ``acc_W_tail``
    against the ssgd of the same model, lr, N and seed), and ``val_loss_vs_ssgd_pct`` and
    ``val_loss_tail_vs_ssgd_pct`` (a language model's: ``val_loss`` and ``val_loss_tail`` relative to that
    ssgd's, percent); each '' when that did not run or has no such figure."""
    def key(r):
        return (r["model"], float(r.get("lr", 0)), int(r["N"]), int(r.get("seed", 0)))

    def diff(r, field):
        base = ref.get(key(r), {}).get(field, "")
        if base == "" or r.get(field, "") == "":
            return ""
        if field in RELATIVE:
            return round(relative_difference(float(r[field]), float(base)), 3)
        return round(float(r[field]) - float(base), 2)

    ref = {key(r): r for r in rows if r["variant"] == BASELINE}
    return [dict(r, diff_vs_ssgd=diff(r, "acc_W"), diff_tail_vs_ssgd=diff(r, "acc_W_tail"),
                 val_loss_vs_ssgd_pct=diff(r, "val_loss"), val_loss_tail_vs_ssgd_pct=diff(r, "val_loss_tail"))
            for r in rows]


def report_text(args, rows, models, lrs, ranks, variants, delays, epochs, seeds, pending: int) -> str:
    language = models[0] in LANGUAGE_MODELS                # a command's models are all of one kind
    warmup = str(args.warmup_steps)
    warmup = f"{warmup} of the iterations" if warmup.endswith("%") else f"{warmup} iterations"
    data = (f"gpt {gpt_text(gpt_sizes(args.gpt))}, validation windows {args.val_windows or 'all'}" if language
            else f"train subset {args.train_subset or 'all'}")
    settings = (f"dataset {args.dataset}, batch {args.batch_size} per worker, constant lr, "
                f"optimizer {args.optimizer}"
                + (f", momentum {args.momentum}" if args.momentum is not None else "")
                + f", weight decay {args.weight_decay}, warm-up {warmup}, "
                f"epochs {', '.join(f'{m} {e:g}' for m, e in epochs.items())}, "
                f"{data}, seeds {', '.join(map(str, seeds))}")
    base = registry.BASELINE
    unit = "percent of its loss" if language else "points"
    what = (f"mean over the seeds [difference to {base} of the row, paired by seed, mean, {unit}] (min..max over "
            "the seeds)" if len(seeds) > 1 else f"[difference to {base} of the row, {unit}]")
    figure, field = (("Final validation loss (nats per token, lower is better)", "val_loss") if language
                     else ("Final test accuracy (%)", "acc_W"))
    text = [f"{figure} of W after finalize, {what}; reference simulator.", ""]
    tables = [(field, "")]
    if args.tail:
        mean = "validation loss" if language else "test accuracy (%)"
        text += [f"Tail tables: the mean {mean} of the model finalize would give at {args.tail} "
                 f"iterations spread evenly over the second half of training, the last one the end; {what}.", ""]
        tables.append((f"{field}_tail", f" (tail: mean over {args.tail} evaluations in the second half)"))
    text += [settings, ""]
    with_k = [v for v in variants if v not in NO_DELAY]
    for field, title in tables:
        for k in (delays if with_k else delays[:1]):
            cols = [v for v in variants if v in NO_DELAY or runs_at(v, k)]
            text += [(f"### k = {k}" if with_k else "### every variant without k") + title, "",
                     table(rows, models, lrs, ranks, cols, k, len(seeds), field), ""]
    if pending:
        text += [f"({pending} configuration(s) not run yet: '—')", ""]
    return "\n".join(text)
