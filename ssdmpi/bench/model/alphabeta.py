"""The alpha-beta model of step time: pure functions, no MPI (``ssdmpi bench model``).

The model (per rank, per step; ``S`` = gradient bytes, ``T = T_N(S)`` the allreduce time), one
formula per communication pattern (``PATTERNS``; each algorithm's spec names its own, ``pattern``)::

    blocking      (ssgd)                 t = c + T        blocking allreduce every step
    averaging:K   (localsgd, period k)   t = c + T / k    blocking allreduce every k steps
    period:K      (ssd --comm period)    t = P / k        one allreduce per period of k steps,
                                                          overlapped with the next k steps (below)
    step          (ssd --comm step,      the same, k = 1  each allreduce overlaps ONE step
                   odsgd)

The period ``P`` must do ``k c`` of compute and one allreduce, which may overlap only the
first ``d`` steps of it (the window: a period rule's merge delay, ``--merge-delay d``;
``d = k`` for a rule that merges at the next period's end). While both run, the compute
runs at speed ``c / c_busy`` and the allreduce at ``T / T_busy``; whichever finishes first
leaves the other to run alone::

    T_busy <= d c_busy  (allreduce first):  P = T_busy + k c - T_busy * c / c_busy
    otherwise           (window first):     P = d c_busy + T - T * d c_busy / T_busy + (k - d) c

With perfect overlap (``c_busy = c``, ``T_busy = T``) this is ``P = k c + max(0, T - d c)``;
at ``d = k``, ``P / k = max(c, T/k)``, and the speedup of ssd period over ssgd is
``(c + T) / max(c, T/k) <= 1 + T/c``, reached at ``k >= T/c``. A shorter window exposes
``T - d c`` once per period when the allreduce outlasts it. ``T_busy`` enters the predictions
as its measured ratio to the measured alone time, applied to the fitted ``T``.

Allreduce time, ring algorithm on ``N`` ranks (per-hop latency ``alpha``, per-byte time on
a rank's link ``beta``; each rank sends ``2 (N-1)/N * S`` bytes in ``2 (N-1)`` messages)::

    T_N(S) = 2 (N-1) alpha + 2 (N-1)/N * S * beta

servers:P (asgd): ``P`` parameter servers and ``K`` workers (``ps_step_time``; ``u``: a server's
momentum update of the whole buffer, ``u / P`` for its slice; 0 unless given). A worker
pushes its ``P`` gradient slices (``S`` bytes in all, through its own NIC) and pulls the
fresh slices, each after its push has arrived and been applied, so push and pull do not
overlap; a server's NIC carries ``K`` pushes in and ``K`` pulls out of ``S / P`` bytes per
step, and the server takes the pushes one at a time. With a NIC per rank (``--nodes``)::

    t = max( c + 2 alpha + 2 S beta + u/P ,   K (alpha + S/P beta + u/P) )
              the worker's own cycle            a server's NIC: K pushes in (and K pulls
                                                out, the other direction) per step

and on one shared link (a single namespace: every byte of every rank passes ONE qdisc,
whose per-byte time is ``beta / 2`` in the units of the 2-rank fit below, and the ``2 K S``
bytes of a step queue on it)::

    t = max( c + 2 alpha + S beta + u/P ,   K S beta )

Fit: at ``N = 2`` this is ``T_2(S) = 2 alpha + S beta = a + b S``; least squares of the
measured times at ``--fit-sizes`` gives ``a, b`` (so ``alpha = a/2``, ``beta = b``). Every
other measured point (held-out sizes, all step loops) is a prediction the fit never saw.
With ``--fit-from FILE`` (``fit_link``) the link comes from an earlier run's JSON instead --
e.g. fitted on 2 nodes, predicting 4 -- and every point of this run is held out; only its
compute time ``c`` is this run's (an input, as always).

Planning table (``--plan-ranks`` x ``--plan-gbits``): ``beta = 8 / (eta * B)`` for a link of
``B`` bit/s per rank, ``alpha`` from the fit, ``c`` and the overlap slowdowns
``c_busy / c``, ``T_busy / T`` measured (or ``--plan-compute-ms``, e.g. a GPU's step time,
then with perfect overlap). ``eta`` is the link efficiency: on a throttled namespace
(``--net R``) it is measured, ``eta = 2 * 8 / (b R)`` -- the factor 2 because both ranks' traffic shares the ONE
``tbf`` qdisc of the loopback, whereas on a real network each rank has its own link
(on a namespaced cluster, ``--nodes`` with one rank per node, each has: ``eta = 8 / (b R)``);
``--plan-efficiency`` overrides it (and must be given for ``--net none``, default 0.9).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ssdmpi.algos import registry
from ssdmpi.errors import UserError


def fit_alpha_beta(sizes, times) -> tuple:
    """Least-squares line ``t = a + b * size`` through the points; returns ``(a, b)``.

    ``sizes`` in bytes, ``times`` in seconds; needs at least two distinct sizes.
    """
    import numpy as np

    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(times, dtype=np.float64)
    if x.size < 2 or np.unique(x).size < 2:
        raise UserError("the alpha-beta fit needs at least two distinct --fit-sizes")
    design = np.stack([np.ones_like(x), x], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(a), float(b)


def ring_allreduce_time(nbytes: float, ranks: int, alpha: float, beta: float) -> float:
    """``T_N(S) = 2 (N-1) alpha + 2 (N-1)/N * S * beta`` seconds (0 for one rank)."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * nbytes * beta


@dataclass(frozen=True)
class CommPattern:
    """How a communication pattern communicates: ``allreduce`` None (compute only), ``"blocking"``,
    ``"overlapped"`` (with the next steps' compute) or ``"servers"`` (pushes to and pulls from parameter
    servers); ``periodic``: once every k steps, not every step (``servers``: k is the servers)."""

    allreduce: str | None
    periodic: bool = False


NONE = "none"                  # compute only: the step loop that measures ``c``
COMPUTE_ONLY = "compute only"  # its name in tables
# The patterns ``--patterns`` names; an algorithm's ``pattern`` (``ssdmpi/spec.py``) is one of them.
PATTERNS = {
    NONE: CommPattern(None),
    "blocking": CommPattern("blocking"),
    "step": CommPattern("overlapped"),
    "period": CommPattern("overlapped", periodic=True),
    "averaging": CommPattern("blocking", periodic=True),
    "servers": CommPattern("servers", periodic=True),
}
BLOCKING, PERIOD = "blocking", "period"    # the baseline's pattern, and the one the planning table plans


def producers(kind: str) -> list:
    """``[(spec, {setting: choice})]``: the algorithms whose ``pattern`` is ``kind``, in the registry's
    order, with the choices of their bench settings that give it (``ssd`` with ``comm: step``)."""
    out = []
    for spec in registry.ALGORITHMS.values():
        names = [n for n in spec.bench if registry.SETTINGS[n].choices]
        for combo in itertools.product(*(registry.SETTINGS[n].choices for n in names)):
            given = dict(zip(names, combo))
            pattern = spec.pattern(registry.Run(given))
            if pattern is not None and pattern[0] == kind:
                out.append((spec, given))
    return out


def kind_label(kind: str, flags: bool = False) -> str:
    """The algorithms a pattern stands for, from their specs: ``ssgd``, ``ssd period``, ``ssd step (odsgd)``;
    ``flags``: as a command line names the first (``ssd --comm period``). The kind itself when no
    algorithm has it."""
    found = producers(kind)
    if not found:
        return kind
    (spec, given), rest = found[0], [s.name for s, _ in found[1:]]
    parts = [f"--{registry.SETTINGS[n].flag} {v}" if flags else str(v) for n, v in given.items()]
    return " ".join([spec.name, *parts]) + (f" ({', '.join(rest)})" if rest and not flags else "")


def window_setting():
    """The setting that gives the default period rule's overlap window (its merge delay: what ``--delay
    auto`` chooses with k), or None for a rule that merges at the next period's end."""
    name = registry.RULES[registry.DEFAULT_RULE].auto_chooses
    return registry.SETTINGS[name] if name else None


def predict_step(kind: str, compute: float, allreduce: float, k: int = 1, compute_busy: float | None = None,
                 allreduce_busy: float | None = None, window: int | None = None) -> float:
    """Predicted seconds per step of a communication pattern (see the module docstring).

    ``kind``: ``none`` | ``blocking`` | ``averaging`` | ``step`` | ``period`` (``PATTERNS``; ``servers``
    is ``ps_step_time``). ``compute_busy`` / ``allreduce_busy``: a compute step's / the allreduce's
    seconds while the other runs too (default: unchanged, i.e. perfect overlap). Values faster than
    alone count as alone. ``window``: the steps of a period the allreduce may overlap, ``1..k``
    (a period rule's merge delay ``d``; default ``k``).
    """
    pattern = PATTERNS.get(kind)
    if pattern is None or pattern.allreduce == "servers":
        raise ValueError(f"unknown communication pattern {kind!r}")
    k = k if pattern.periodic else 1
    d = k if window is None or not pattern.periodic else window
    if not 1 <= d <= k:
        raise ValueError(f"the overlap window must be 1..k={k} steps, got {window!r}")
    if pattern.allreduce is None:
        return compute
    if pattern.allreduce == "blocking":
        return compute + allreduce / k
    c_busy = max(compute, compute_busy or compute)
    t_busy = max(allreduce, allreduce_busy or allreduce)
    work = k * compute
    if t_busy <= d * c_busy:
        # the allreduce finishes first, having slowed t_busy of compute to r_c = c/c_busy
        period = t_busy + work - t_busy * compute / c_busy
    else:
        # the window's d steps finish first (after d c_busy), the allreduce then runs alone, then the
        # period's other k - d steps
        period = d * c_busy + allreduce - allreduce * d * c_busy / t_busy + (k - d) * compute
    return period / k


def ps_step_time(compute: float, nbytes: float, workers: int, servers: int, alpha: float, beta: float,
                 shared_link: bool = False, server_update: float = 0.0) -> float:
    """Predicted seconds per step of a worker of parameter servers (the module docstring's PS formulas).

    ``nbytes``: the gradient (= weights) bytes; ``beta``: seconds per byte of one rank's link
    (the fit's); ``shared_link``: all ranks share one link (one namespace's qdisc) instead of
    a NIC each; ``server_update``: seconds of one server's update of the WHOLE buffer.
    """
    if workers < 1 or servers < 1:
        raise ValueError("the servers pattern needs at least one worker and one server")
    update = server_update / servers
    if shared_link:
        return max(compute + 2 * alpha + nbytes * beta + update, workers * nbytes * beta)
    worker = compute + 2 * alpha + 2 * nbytes * beta + update
    server = workers * (alpha + nbytes / servers * beta + update)
    return max(worker, server)


@dataclass(frozen=True)
class Pattern:
    """A communication pattern measured by a step loop: ``kind`` (a name of ``PATTERNS``) and its ``k``
    (the period; for ``servers``, the servers). ``name``: its name in tables, from the algorithms that
    have it (``ssgd``, ``ssd period k=5``, ``asgd 1 server``)."""

    kind: str
    k: int = 1

    @property
    def comm(self) -> CommPattern:
        return PATTERNS[self.kind]

    @property
    def name(self) -> str:
        if self.kind == NONE:
            return COMPUTE_ONLY
        label = kind_label(self.kind)
        if self.comm.allreduce == "servers":
            return f"{label} {self.k} server{'s' if self.k > 1 else ''}"
        return f"{label} k={self.k}" if self.comm.periodic else label


def _form(kind: str, name: str | None = None) -> str:
    """How ``--patterns`` writes ``kind`` (or algorithm ``name``, which stands for it): ``period:K``."""
    comm = PATTERNS[kind]
    return (name or kind) + (":S" if comm.allreduce == "servers" else ":K" if comm.periodic else "")


def _aliases() -> dict:
    """``{algorithm: kind}`` for each algorithm whose pattern is one kind whatever its settings."""
    kinds = {}
    for kind in PATTERNS:
        for spec, _ in producers(kind):
            kinds.setdefault(spec.name, set()).add(kind)
    return {name: found.pop() for name, found in kinds.items() if len(found) == 1}


def pattern_forms() -> str:
    """The forms ``--patterns`` takes, each with the algorithms it stands for (help texts, errors)."""
    kinds = [f"{_form(kind)} ({kind_label(kind, flags=True)}" + "".join(f", {s.name}" for s, _ in producers(kind)[1:])
             + ")" for kind, comm in PATTERNS.items() if comm.allreduce is not None]
    aliases = ", ".join(_form(kind, name) for name, kind in _aliases().items())
    return (f"{', '.join(kinds)}; K the period, S the servers (the last S ranks; 1 when left out); or an "
            f"algorithm: {aliases}")


def parse_pattern(spec: str) -> Pattern:
    """``blocking`` | ``step`` | ``period:K`` | ``averaging:K`` | ``servers[:S]`` (S servers), or an
    algorithm whose pattern is one of them (``localsgd:5`` is ``averaging:5``) -> ``Pattern``."""
    kind, *rest = spec.strip().split(":")
    kind = _aliases().get(kind, kind)
    pattern = PATTERNS.get(kind)
    try:
        if pattern is not None and not rest and (not pattern.periodic or pattern.allreduce == "servers"):
            return Pattern(kind)
        if pattern is not None and pattern.periodic and len(rest) == 1 and int(rest[0]) >= 1:
            return Pattern(kind, int(rest[0]))
    except ValueError:
        pass
    raise UserError(f"--patterns: {spec!r} is not understood; use {pattern_forms()}")


def percent_error(predicted, measured):
    """100 * (predicted - measured) / measured (None if either is missing)."""
    if predicted is None or not measured:
        return None
    return 100.0 * (predicted - measured) / measured



def fit_link(measured: dict, fit_from: dict | None = None) -> dict:
    """The link of the model: ``alpha``, ``beta`` (per hop, per byte of one rank's link), the
    2-rank line ``a + b S`` they came from, and the overlap slowdowns ``c_busy / c`` and
    ``T_busy / T``; fitted on this run's ``--fit-sizes``, or taken whole from ``fit_from``
    (an earlier run's ``model`` result, e.g. on 2 nodes), so that nothing of this run but
    its compute time ``c`` enters the predictions.
    """
    if fit_from is not None:
        keys = ("alpha_s", "beta_s_per_byte", "fit_a_s", "fit_b_s_per_byte", "compute_slowdown", "comm_slowdown",
                "fit_ranks")
        return {key: fit_from[key] for key in keys}
    ranks = measured["ranks"]
    times = {int(n): t for n, t in measured["allreduce_s"].items()}
    a, b = fit_alpha_beta(measured["fit_bytes"], [times[n] for n in measured["fit_bytes"]])
    c = measured["step_s"][COMPUTE_ONLY]
    # The overlapped allreduce is measured at the gradient size: keep its ratio to the alone time.
    busy = measured.get("allreduce_busy_s")
    # Generalise the N-rank fit: T_N = 2(N-1) alpha + 2(N-1)/N S beta.
    return {"alpha_s": a / (2 * (ranks - 1)), "beta_s_per_byte": b / (2 * (ranks - 1) / ranks),
            "fit_a_s": a, "fit_b_s_per_byte": b, "fit_ranks": ranks,
            "compute_slowdown": (measured.get("compute_busy_s") or c) / c,
            "comm_slowdown": busy / times[measured["grad_bytes"]] if busy else 1.0}


def _steps(measured: dict, link: dict, c: float, T: float, shared_link: bool) -> list:
    """The step-pattern table: measured vs predicted seconds per step and speedups."""
    ranks, alpha, beta = measured["ranks"], link["alpha_s"], link["beta_s_per_byte"]
    c_busy, T_busy = c * link["compute_slowdown"], T * link["comm_slowdown"]
    ssgd_measured = measured["step_s"].get(Pattern(BLOCKING).name)
    ssgd_predicted = predict_step(BLOCKING, c, T)
    steps = []
    for kind, k in measured["patterns"]:
        name = Pattern(kind, k).name
        if PATTERNS[kind].allreduce == "servers":
            pred = ps_step_time(c, measured["grad_bytes"], ranks - k, k, alpha, beta, shared_link)
        else:
            pred = predict_step(kind, c, T, k, c_busy, T_busy)
        meas = measured["step_s"][name]
        steps.append({"pattern": name, "kind": kind, "k": k, "measured_s": meas, "predicted_s": pred,
                      "error_pct": None if PATTERNS[kind].allreduce is None else percent_error(pred, meas),
                      "measured_speedup": ssgd_measured / meas if ssgd_measured else None,
                      "predicted_speedup": ssgd_predicted / pred})
    return steps


def analyse(measured: dict, rate_bps=None, efficiency=None, plan_ranks=(2, 4, 8, 16, 32),
            plan_gbits=(1, 10, 25, 100), plan_compute_s=None, plan_k: int = 5, fit_from: dict | None = None,
            shared_link: bool = True) -> dict:
    """Fit on the fit sizes (or take ``fit_from``'s link), predict everything else; tables as lists of dicts.

    ``shared_link``: the ranks share one throttled qdisc (``--net`` in one namespace); False
    with a NIC per rank (``--nodes``, one rank per node).
    """
    ranks = measured["ranks"]
    times = {int(n): t for n, t in measured["allreduce_s"].items()}
    link = fit_link(measured, fit_from)
    alpha, beta, b = link["alpha_s"], link["beta_s_per_byte"], link["fit_b_s_per_byte"]
    predict_T = lambda nbytes: ring_allreduce_time(nbytes, ranks, alpha, beta)   # noqa: E731
    fitted = set(measured["fit_bytes"]) if fit_from is None else set()
    sizes = [{"bytes": n, "fitted": n in fitted, "measured_s": times[n],
              "predicted_s": predict_T(n), "error_pct": percent_error(predict_T(n), times[n])}
             for n in sorted(times)]

    c = measured["step_s"][COMPUTE_ONLY]
    T = predict_T(measured["grad_bytes"])
    steps = _steps(measured, link, c, T, shared_link)
    if efficiency is None:
        # A shared qdisc carries both ranks' traffic: per-rank link efficiency is twice what
        # a single link would suggest (see the module docstring); a NIC per rank: once.
        share = 2 if shared_link else 1
        efficiency = min(1.0, share * 8 / (b * rate_bps)) if rate_bps else 0.9
    c_plan = c if plan_compute_s is None else plan_compute_s
    # A measured c keeps its measured interference; a given one (e.g. a GPU's) overlaps perfectly.
    slowdown = link["compute_slowdown"] if plan_compute_s is None else 1.0
    comm_slowdown = link["comm_slowdown"] if plan_compute_s is None else 1.0
    plan = []
    for n in plan_ranks:
        for gbit in plan_gbits:
            beta_link = 8 / (efficiency * gbit * 1e9)
            T_n = ring_allreduce_time(measured["grad_bytes"], n, alpha, beta_link)
            t_ssgd = predict_step(BLOCKING, c_plan, T_n)
            busy = (c_plan * slowdown, T_n * comm_slowdown)
            t_ssd = predict_step(PERIOD, c_plan, T_n, plan_k, *busy)
            t_one = predict_step(PERIOD, c_plan, T_n, plan_k, *busy, window=1)   # d = 1: the default merge delay
            plan.append({"ranks": n, "gbit": gbit, "allreduce_s": T_n, "ssgd_s": t_ssgd, "ssd_period_s": t_ssd,
                         "speedup": t_ssgd / t_ssd, "ssd_d1_s": t_one, "speedup_d1": t_ssgd / t_one,
                         "best_k": max(1, int(-(-T_n // c_plan)))})
    return {**link, "effective_gbit": 8 / b / 1e9 if b > 0 else None, "efficiency": efficiency,
            "fit_from_file": fit_from is not None, "shared_link": shared_link,
            "compute_s": c, "compute_busy_s": c * link["compute_slowdown"], "allreduce_model_s": T,
            "allreduce_busy_s": T * link["comm_slowdown"], "plan_compute_s": c_plan, "plan_k": plan_k,
            "sizes": sizes, "steps": steps, "plan": plan}
