"""``ssdmpi bench stability``: the largest stable ``eta*h`` of each period rule in a linear model.

The map and the scan are ``ssdmpi/algos/stability.py`` (its docstring states the model); each rule's
and algorithm's map is its spec's (``registry.linear_maps()``), and ``damp`` is the stability page's own
model. Each runs at every ``k`` of ``--delays`` and every combination of the values of its settings
that its map takes (a flag each, named as the training flag, with a list of values: the settings'
``sweep`` by default); ``damp`` at every factor of ``--damping``. A combination the rule does not
allow at a ``k`` (a merge delay longer than the period) is left out.

Output: a Markdown table, one row per (rule, its settings' values), one column per ``k``; each cell the
threshold. ``--json FILE`` writes every threshold with the scan's range and step.
"""

from __future__ import annotations

import itertools

from ssdmpi.algos import registry
from ssdmpi.bench import result as result_file
from ssdmpi.bench.flags import CommaList, add_json, emit_json, parse_choices
from ssdmpi.errors import UserError
from ssdmpi.parsing import parse_list

DAMP = "damp"     # the model of the stability page that is no rule (ssdmpi.algos.stability.DAMP)


def models() -> dict:
    """``{name: LinearMap}``: every rule's and algorithm's, and ``damp``."""
    from ssdmpi.algos.stability import DAMP as damp

    return {**registry.linear_maps(), DAMP: damp}


def _swept() -> dict:
    """``{setting name: Setting}`` of every setting a rule's map takes (each a flag of this command)."""
    return {s.name: s for name in registry.linear_maps() for s in registry.swept(name)}


# --- the command -------------------------------------------------------------------------

def add_arguments(parser) -> None:
    names = [*registry.linear_maps(), DAMP]
    shown = ",".join(n for n, m in registry.linear_maps().items() if m.default)
    parser.add_argument("--rules", action=CommaList, default=shown, metavar="R1,R2",
                        help=f"rules, from {', '.join(names)} (default %(default)s)")
    parser.add_argument("--delays", action=CommaList, default="2,5,10,20", metavar="K1,K2",
                        help="periods k (default %(default)s)")
    for s in _swept().values():
        parser.add_argument(f"--{s.flag}", dest=s.name, action=CommaList, default=s.sweep, metavar="V1,V2",
                            help=f"values of --{s.flag} ({s.help.split(':')[0]}; default %(default)s)")
    parser.add_argument("--damping", action=CommaList, default="0.5", metavar="A1,A2",
                        help="own-displacement factors a of the model damp (default %(default)s)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks N (default %(default)s)")
    parser.add_argument("--momentum", type=float, default=registry.SETTINGS["momentum"].default,
                        help="momentum mu (default %(default)s, as ssdmpi train)")
    add_json(parser, "every threshold")


def rows(rules, periods, values: dict, dampings, N: int, mu: float) -> list[dict]:
    """One dict per (rule, k, its settings' values) with its ``threshold``; ``values``: the values of each
    swept setting (``{name: [v1, v2]}``)."""
    from ssdmpi.algos.stability import threshold  # NumPy: not at import (``ssdmpi --help`` stays fast)

    maps, out = models(), []
    for rule in rules:
        linear = maps[rule]
        names = [s.name for s in registry.swept(rule)] if rule != DAMP else ["damping"]
        grid = list(itertools.product(*(values[n] if rule != DAMP else dampings for n in names)))
        for k in (periods if linear.period else [1]):
            for combo in grid:
                own = dict(zip(names, combo))
                try:
                    value = threshold(linear, k, N, mu, **own)
                except ValueError:          # not allowed at this k (a merge delay longer than the period)
                    continue
                label = ", ".join([rule] + [f"{registry.SETTINGS[n].flag if n in registry.SETTINGS else n} {v:g}"
                                            for n, v in own.items()])
                out.append({"rule": rule, "label": label, "k": k if linear.period else "", **own, "N": N, "mu": mu,
                            "threshold": round(value, 4)})
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
    rules = parse_choices(args.rules, "--rules", list(models()))
    periods = parse_list(args.delays, "--delays", int, minimum=1)
    values = {}
    for name, s in _swept().items():
        values[name] = parse_list(getattr(args, name), f"--{s.flag}", s.type)
        for v in values[name]:
            s.validate(v)                  # the training flag's own check
    dampings = parse_list(args.damping, "--damping", float, minimum=0)
    if args.ranks < 2:
        raise UserError(f"--ranks must be >= 2 (a spread needs two ranks), got {args.ranks}")
    registry.SETTINGS["momentum"].validate(args.momentum)
    results = rows(rules, periods, values, dampings, args.ranks, args.momentum)
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
