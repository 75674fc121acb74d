"""``ssdmpi bench stability``: the largest stable ``eta*h`` of each period rule in a linear model.

The map and the scan are ``ssdmpi/algos/stability.py`` (its docstring states the model and
the rules). Each rule runs at every ``k`` of ``--delays`` and, for ``delta-merge``, every
merge delay ``d <= k`` of ``--merge-delays`` with every momentum merge of ``--merge-momentum``
(``damp``: every factor of ``--damping``).

Output: a Markdown table, one row per (rule, d, momentum merge or a), one column per ``k``; each
cell the threshold. ``--json FILE`` writes every threshold with the scan's range and step.
"""

from __future__ import annotations

from ssdmpi.algos import registry
from ssdmpi.bench import result as result_file
from ssdmpi.bench.flags import CommaList, add_json, emit_json, parse_choices
from ssdmpi.errors import UserError
from ssdmpi.parsing import parse_list

RULES = ("ssgd", "localsgd", "delta-own", "delta-merge", "damp", "replay")   # ssdmpi.algos.stability.RULES
DEFAULT_RULES = "ssgd,localsgd,delta-own,delta-merge"


# --- the command -------------------------------------------------------------------------

def add_arguments(parser) -> None:
    parser.add_argument("--rules", action=CommaList, default=DEFAULT_RULES, metavar="R1,R2",
                        help=f"rules, from {', '.join(RULES)} (default %(default)s)")
    parser.add_argument("--delays", action=CommaList, default="2,5,10,20", metavar="K1,K2",
                        help="periods k (default %(default)s)")
    parser.add_argument("--merge-delays", action=CommaList, default="1,2,3,5", metavar="D1,D2",
                        help="merge delays d of the rule delta-merge, each at every k >= d (default %(default)s)")
    parser.add_argument("--merge-momentum", action=CommaList, default="0,1", metavar="A1,A2",
                        help="momentum merges a of the rule delta-merge (--merge-momentum; default %(default)s)")
    parser.add_argument("--damping", action=CommaList, default="0.5", metavar="A1,A2",
                        help="own-displacement factors a of the rule damp (default %(default)s)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks N (default %(default)s)")
    parser.add_argument("--momentum", type=float, default=registry.SETTINGS["momentum"].default,
                        help="momentum mu (default %(default)s, as ssdmpi train)")
    add_json(parser, "every threshold")


def rows(rules, periods, delays, dampings, N: int, mu: float, merges=(0.0,)) -> list[dict]:
    """One dict per (rule, k, d, a, momentum merge) with its ``threshold``."""
    from ssdmpi.algos.stability import RULES, threshold  # NumPy: not at import (``ssdmpi --help`` stays fast)

    out = []
    for rule in rules:
        spec = RULES[rule]
        for k in (periods if spec.period else [1]):
            if spec.merge_delay == "own":
                params = [(d, None, m if spec.merge_momentum else None) for d in delays if d <= k
                          for m in (merges if spec.merge_momentum else [None])]
            elif spec.damping:
                params = [(None, a, None) for a in dampings]
            else:
                params = [(None, None, None)]
            for d, a, m in params:
                value = threshold(rule, k, d, N, mu, 0.5 if a is None else a, merge_momentum=m or 0.0)
                label = (rule + (f", d = {d}" if d is not None else "") + (f", a = {a}" if a is not None else "")
                         + (f", momentum merge {m:g}" if m is not None else ""))
                out.append({"rule": rule, "label": label, "k": k if spec.period else "",
                            "d": {"own": d, "k": k}.get(spec.merge_delay, ""),
                            "a": "" if a is None else a, "merge_momentum": "" if m is None else m,
                            "N": N, "mu": mu, "threshold": round(value, 4)})
    return out


def table(results: list[dict], periods) -> str:
    """Markdown: a row per (rule, d or a), a column per k; '' where d > k."""
    head = ["rule"] + [f"k = {k}" for k in periods]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    labels = list(dict.fromkeys(r["label"] for r in results))
    for label in labels:
        cells = [label]
        for k in periods:
            hit = [r for r in results if r["label"] == label and (r["k"] in ("", k))]
            cells.append(f"{hit[0]['threshold']:.3g}" if hit else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args) -> int:
    rules = parse_choices(args.rules, "--rules", RULES)
    periods = parse_list(args.delays, "--delays", int, minimum=1)
    delays = parse_list(args.merge_delays, "--merge-delays", int, minimum=1)
    dampings = parse_list(args.damping, "--damping", float, minimum=0)
    merges = parse_list(args.merge_momentum, "--merge-momentum", float)
    for m in merges:
        registry.SETTINGS["merge_momentum"].validate(m)          # the training flag's own check: [0, 1]
    if args.ranks < 2:
        raise UserError(f"--ranks must be >= 2 (a spread needs two ranks), got {args.ranks}")
    if not 0 <= args.momentum < 1:
        raise UserError(f"--momentum must be in [0, 1), got {args.momentum}")
    results = rows(rules, periods, delays, dampings, args.ranks, args.momentum, merges)
    from ssdmpi.algos.stability import STEP, X_MAX, X_MIN

    if args.json:
        emit_json(args.json, result_file.dumps({**result_file.provenance("stability"), "x_min": X_MIN,
                                                "x_max": X_MAX, "step": STEP, "rows": results}))
        if args.json == "-":
            return 0
    print(f"Largest stable eta*h (linear model: {args.ranks} ranks, curvature h, momentum {args.momentum:g}, "
          f"no noise; scanned upward from {X_MIN:g} to {X_MAX:g} in steps of {STEP:.1%})\n")
    print(table(results, periods))
    return 0
