"""The Markdown of ``ssdmpi bench accuracy``: a table per ``k`` (rows model x lr x N, a column per variant,
each against the baseline of its row) and the report around them.
"""

from __future__ import annotations

from ssdmpi.algos import registry
from ssdmpi.bench.accuracy.configs import BASELINE, NO_DELAY, runs_at

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


def report_text(args, rows, models, lrs, ranks, variants, delays, epochs, seeds, pending: int) -> str:
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
            cols = [v for v in variants if v in NO_DELAY or runs_at(v, k)]
            text += [(f"### k = {k}" if with_k else "### every variant without k") + title, "",
                     table(rows, models, lrs, ranks, cols, k, len(seeds), field), ""]
    if pending:
        text += [f"({pending} configuration(s) not run yet: '—')", ""]
    return "\n".join(text)
