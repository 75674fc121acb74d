"""``ssdmpi bench model``: an alpha-beta model of step time, checked against measurements.

What it measures (all ranks together, rank 0 prints; ``--ranks`` >= 2, default 2):

1. allreduce time vs size on this network (the Communicator's blocking allreduce of a
   float32 buffer; median of ``--reps``), at the ``--fit-sizes`` and at the held-out
   ``--check-sizes`` plus the model's own gradient size;
2. step loops of the real model (``--model``, random batches of ``--batch-size``): the
   same step (forward, backward, an SGD update of the flat weights) with no communication
   (that is ``c``, the compute time per step), and with each variant's communication
   pattern: ``ssgd`` (blocking allreduce of the gradient every step), ``localsgd k``
   (blocking allreduce of the weights every k steps), ``step`` (nonblocking allreduce of
   each step's gradient, waited one step later: ``ssd --comm step`` / ``odsgd``) and
   ``period k`` (gradients accumulated over k steps, one nonblocking allreduce per period,
   waited at the end of the next period: ``ssd --comm period``). Variants are interleaved
   and repeated ``--repeats`` times; each time per step is the slowest rank's, median over
   repeats;
3. overlap, in every repeat: compute steps run while an allreduce of the gradient size is
   in flight, giving ``c_busy`` (a compute step that ended before the allreduce completed)
   and ``T_busy`` (the allreduce's in-flight time while compute ran). On a GPU, or with
   spare cores, ``c_busy = c`` and ``T_busy = T``; on a CPU whose cores all compute, the
   communication (an MPI library busy-polling the network, the kernel copying TCP data,
   the reduction) and the compute take cycles from each other, and both grow.

The model (per rank, per step; ``S`` = gradient bytes, ``T = T_N(S)`` the allreduce time)::

    ssgd                      t = c + T           blocking allreduce every step
    localsgd, period k        t = c + T / k       blocking allreduce every k steps
    ssd --comm period, k      t = P / k           one allreduce per period of k steps,
                                                  overlapped with the next k steps (below)
    ssd --comm step (odsgd)   the same, k = 1     each allreduce overlaps ONE step

The period ``P`` must do ``k c`` of compute and one allreduce. While both run, the compute
runs at speed ``c / c_busy`` and the allreduce at ``T / T_busy``; whichever finishes first
leaves the other to run alone::

    T_busy <= k c_busy  (allreduce first):  P = T_busy + k c - T_busy * c / c_busy
    otherwise           (compute first):    P = k c_busy + T - T * k c_busy / T_busy

With perfect overlap (``c_busy = c``, ``T_busy = T``) this is ``P / k = max(c, T/k)``, and
the speedup of ssd period over ssgd is ``(c + T) / max(c, T/k) <= 1 + T/c``, reached at
``k >= T/c``. ``T_busy`` enters the predictions as its measured ratio to the measured alone
time, applied to the fitted ``T``.

Allreduce time, ring algorithm on ``N`` ranks (per-hop latency ``alpha``, per-byte time on
a rank's link ``beta``; each rank sends ``2 (N-1)/N * S`` bytes in ``2 (N-1)`` messages)::

    T_N(S) = 2 (N-1) alpha + 2 (N-1)/N * S * beta

Fit: at ``N = 2`` this is ``T_2(S) = 2 alpha + S beta = a + b S``; least squares of the
measured times at ``--fit-sizes`` gives ``a, b`` (so ``alpha = a/2``, ``beta = b``). Every
other measured point (held-out sizes, all step loops) is a prediction the fit never saw.

Planning table (``--plan-ranks`` x ``--plan-gbits``): ``beta = 8 / (eta * B)`` for a link of
``B`` bit/s per rank, ``alpha`` from the fit, ``c`` and the overlap slowdowns
``c_busy / c``, ``T_busy / T`` measured (or ``--plan-compute-ms``, e.g. a GPU's step time,
then with perfect overlap). ``eta`` is the link efficiency: on a throttled namespace
(``--net R``) it is measured, ``eta = 2 * 8 / (b R)`` -- the factor 2 because both ranks' traffic shares the ONE
``tbf`` qdisc of the loopback, whereas on a real network each rank has its own link;
``--plan-efficiency`` overrides it (and must be given for ``--net none``, default 0.9).

Run it as ``ssdmpi bench model --net 1gbit`` (it relaunches itself as
``bin/ssdmpi-netns --rate 1gbit -- mpiexec -n 2 python -m ssdmpi bench model ...``) or
under your own launcher: ``bin/ssdmpi-netns --rate 1gbit -- mpiexec -n 2 ssdmpi bench model
--net 1gbit`` (then ``--net`` only tells the model the nominal rate).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from ssdmpi.errors import UserError

MB = 1_000_000


# ----------------------------------------------------------------------------- the model

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


def predict_step(kind: str, compute: float, allreduce: float, k: int = 1, compute_busy: float | None = None,
                 allreduce_busy: float | None = None) -> float:
    """Predicted seconds per step of a communication pattern (see the module docstring).

    ``kind``: ``none`` | ``ssgd`` | ``localsgd`` | ``step`` | ``period``. ``compute_busy`` /
    ``allreduce_busy``: a compute step's / the allreduce's seconds while the other runs too
    (default: unchanged, i.e. perfect overlap). Values faster than alone count as alone.
    """
    if kind == "none":
        return compute
    if kind == "ssgd":
        return compute + allreduce
    if kind == "localsgd":
        return compute + allreduce / k
    if kind in ("step", "period"):
        k = 1 if kind == "step" else k
        c_busy = max(compute, compute_busy or compute)
        t_busy = max(allreduce, allreduce_busy or allreduce)
        work = k * compute
        if t_busy <= k * c_busy:
            # the allreduce finishes first, having slowed t_busy of compute to r_c = c/c_busy
            period = t_busy + work - t_busy * compute / c_busy
        else:
            # the compute finishes first (after k c_busy), the allreduce then runs alone
            period = k * c_busy + allreduce - allreduce * k * c_busy / t_busy
        return period / k
    raise ValueError(f"unknown communication pattern {kind!r}")


@dataclass(frozen=True)
class Pattern:
    """A communication pattern measured by a step loop."""

    kind: str
    k: int = 1

    @property
    def name(self) -> str:
        if self.kind in ("none", "ssgd"):
            return {"none": "compute only", "ssgd": "ssgd"}[self.kind]
        if self.kind == "step":
            return "ssd step (odsgd)" if self.k == 1 else f"ssd step k={self.k}"
        return f"{'ssd period' if self.kind == 'period' else 'localsgd'} k={self.k}"


def parse_pattern(spec: str) -> Pattern:
    """``ssgd`` | ``step`` | ``period:K`` | ``localsgd:K`` -> ``Pattern``."""
    parts = spec.strip().split(":")
    try:
        if parts in (["ssgd"], ["step"], ["none"]):
            return Pattern(parts[0])
        if parts[0] in ("period", "localsgd") and len(parts) == 2 and int(parts[1]) >= 1:
            return Pattern(parts[0], int(parts[1]))
    except ValueError:
        pass
    raise UserError(f"--patterns: {spec!r} is not understood; use ssgd, step, period:K or localsgd:K")


def percent_error(predicted, measured):
    """100 * (predicted - measured) / measured (None if either is missing)."""
    if predicted is None or not measured:
        return None
    return 100.0 * (predicted - measured) / measured


# ----------------------------------------------------------------------------- measurement

def _positive_numbers(text: str, flag: str, what: str = "numbers") -> list:
    """``"1,4,16"`` -> ``[1.0, 4.0, 16.0]``; anything else is a one-line ``UserError`` naming ``flag``."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise UserError(f"{flag} must be comma-separated positive {what}; got {text!r}")
    return values


def _sizes(text: str, flag: str) -> list:
    return _positive_numbers(text, flag, "sizes in MB like 1,4,16")


def _time_allreduce(comm, nbytes: int, reps: int) -> float:
    """Median seconds of the slowest rank's blocking allreduce of ``nbytes`` (float32)."""
    import numpy as np

    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    comm.allreduce(buf, average=False)   # first touch, connection set-up
    times = []
    for _ in range(reps):
        comm.control.Barrier()
        start = time.perf_counter()
        comm.allreduce(buf, average=False)
        times.append(comm.control.allreduce(time.perf_counter() - start, op=comm.MPI.MAX))
    return statistics.median(times)


def _compute(model, x, labels) -> None:
    """One compute step: forward, backward, and an SGD update of the flat weights.

    A tiny learning rate keeps the weights sane over any number of steps; the update is
    done in place, as the optimizers do (two passes over the flat buffers).
    """
    model.loss_and_grad(x, labels)
    model.grads *= 1e-6
    model.params -= model.grads


def _step_loop(comm, model, x, labels, pattern: Pattern, steps: int, warm: int) -> float:
    """Seconds per step (slowest rank) of ``steps`` steps after ``warm`` unmeasured ones."""
    import numpy as np

    params, grads = model.params, model.grads
    inflight = np.empty_like(grads)
    acc = np.zeros_like(grads)
    handle = None
    start = None
    for i in range(warm + steps):
        if i == warm:
            comm.control.Barrier()
            start = time.perf_counter()
        _compute(model, x, labels)
        if pattern.kind == "ssgd":
            comm.allreduce(grads, average=False)
        elif pattern.kind == "step":
            if handle is not None:
                handle.wait()
            np.copyto(inflight, grads)
            handle = comm.allreduce_start(inflight, average=False)
        elif pattern.kind == "period":
            acc += grads
            if (i + 1) % pattern.k == 0:
                if handle is not None:
                    handle.wait()
                np.copyto(inflight, acc)
                acc.fill(0)
                handle = comm.allreduce_start(inflight, average=False)
        if pattern.kind == "localsgd" and (i + 1) % pattern.k == 0:
            comm.allreduce(params, average=True)
    elapsed = time.perf_counter() - start
    if handle is not None:
        handle.wait()
    return comm.control.allreduce(elapsed / steps, op=comm.MPI.MAX)


def _overlapped(comm, model, x, labels, nbytes: int, reps: int) -> tuple:
    """Compute and an allreduce of ``nbytes`` at the same time: ``(c_busy, T_busy)``, the
    median seconds of a compute step that ran entirely while the allreduce was in flight,
    and the median in-flight time of the allreduce while compute ran (slowest rank each).

    ``c_busy`` is None when no step fitted inside an allreduce. ``T_busy`` is the
    Communicator's own in-flight time (exact with the thread strategy).
    """
    import numpy as np

    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    steps, flights = [], []
    for _ in range(reps):
        comm.control.Barrier()
        comm.stats.reset()
        handle = comm.allreduce_start(buf, average=False)
        while not handle.test():
            start = time.perf_counter()
            _compute(model, x, labels)
            elapsed = time.perf_counter() - start
            if not handle.test():
                steps.append(elapsed)
        handle.wait()
        flights.append(comm.stats.snapshot()["inflight_s"])
    mine = statistics.median(steps) if steps else float("nan")
    worst = comm.control.allreduce(mine, op=comm.MPI.MAX)
    t_busy = comm.control.allreduce(statistics.median(flights), op=comm.MPI.MAX)
    return (None if worst != worst else worst), t_busy   # NaN on any rank: no sample there


def measure(args, comm, log) -> dict:
    """Every measurement of the module docstring, identical on all ranks (collective)."""
    import numpy as np

    from ssdmpi.nn import build_model

    model = build_model(args.model, (1, 28, 28), 10, seed=args.seed)
    grad_bytes = int(model.grads.nbytes)
    rng = np.random.default_rng(args.seed + comm.rank)
    x = rng.standard_normal((args.batch_size, 1, 28, 28)).astype(model.dtype)
    labels = rng.integers(0, 10, args.batch_size)

    fit_bytes = [int(s * MB) for s in _sizes(args.fit_sizes, "--fit-sizes")]
    check_bytes = [int(s * MB) for s in _sizes(args.check_sizes, "--check-sizes")] + [grad_bytes]
    allreduce = {}
    for nbytes in fit_bytes + check_bytes:
        allreduce[nbytes] = _time_allreduce(comm, nbytes, args.reps)
        log(f"allreduce {nbytes / MB:8.2f} MB: {allreduce[nbytes] * 1e3:9.2f} ms")

    patterns = [Pattern("none")] + [parse_pattern(p) for p in args.patterns.split(",")]
    loops, busy, flights = {p: [] for p in patterns}, [], []
    for rep in range(args.repeats):
        # Measured in every repeat, next to c and the loops, so all of them see the same load.
        c_busy, t_busy = _overlapped(comm, model, x, labels, grad_bytes, 2)
        busy.append(c_busy)
        flights.append(t_busy)
        log(f"repeat {rep + 1}/{args.repeats} overlapped: compute "
            f"{'n/a' if c_busy is None else f'{c_busy * 1e3:.2f} ms/step'}, allreduce {t_busy * 1e3:.2f} ms")
        for p in patterns:
            steps = max(args.steps, 2 * p.k)
            steps += -steps % p.k                     # whole periods only
            warm = max(2, p.k + 1)                    # an allreduce already in flight when timing starts
            loops[p].append(_step_loop(comm, model, x, labels, p, steps, warm))
            log(f"repeat {rep + 1}/{args.repeats} {p.name:>18}: {loops[p][-1] * 1e3:9.2f} ms/step")
    busy = [b for b in busy if b is not None]
    compute_busy = statistics.median(busy) if busy else None
    allreduce_busy = statistics.median(flights)
    return {"model": args.model, "num_params": int(model.num_params), "grad_bytes": grad_bytes,
            "batch_size": args.batch_size, "ranks": comm.size,
            "fit_bytes": fit_bytes, "check_bytes": check_bytes,
            "allreduce_s": {str(n): t for n, t in allreduce.items()},
            "step_s": {p.name: statistics.median(v) for p, v in loops.items()}, "compute_busy_s": compute_busy,
            "allreduce_busy_s": allreduce_busy,
            "patterns": [[p.kind, p.k] for p in patterns]}


# ----------------------------------------------------------------------------- analysis

def parse_rate(net: str):
    """Bits per second of a tc rate like ``1gbit``, ``100mbit``, ``500kbit`` (None for ``none``)."""
    if net == "none":
        return None
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, scale in units.items():
        if net.lower().endswith(unit):
            try:
                value = float(net[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * scale
            break
    raise UserError(f"--net {net!r}: give a tc rate such as 1gbit or 100mbit, or 'none'")


def analyse(measured: dict, rate_bps=None, efficiency=None, plan_ranks=(2, 4, 8, 16, 32),
            plan_gbits=(1, 10, 25, 100), plan_compute_s=None, plan_k: int = 5) -> dict:
    """Fit on the fit sizes, predict everything else; returns tables as lists of dicts."""
    ranks = measured["ranks"]
    times = {int(n): t for n, t in measured["allreduce_s"].items()}
    a, b = fit_alpha_beta(measured["fit_bytes"], [times[n] for n in measured["fit_bytes"]])
    # Generalise the N-rank fit: T_N = 2(N-1) alpha + 2(N-1)/N S beta.
    alpha = a / (2 * (ranks - 1))
    beta = b / (2 * (ranks - 1) / ranks)
    predict_T = lambda nbytes: ring_allreduce_time(nbytes, ranks, alpha, beta)   # noqa: E731

    sizes = [{"bytes": n, "fitted": n in measured["fit_bytes"], "measured_s": times[n],
              "predicted_s": predict_T(n), "error_pct": percent_error(predict_T(n), times[n])}
             for n in sorted(times)]

    c = measured["step_s"]["compute only"]
    c_busy = measured.get("compute_busy_s") or c
    T = predict_T(measured["grad_bytes"])
    # The overlapped allreduce is measured at the gradient size: keep its ratio to the alone time.
    T_busy = T * measured["allreduce_busy_s"] / times[measured["grad_bytes"]] \
        if measured.get("allreduce_busy_s") else T
    ssgd_measured = measured["step_s"].get("ssgd")
    ssgd_predicted = predict_step("ssgd", c, T)
    steps = []
    for kind, k in measured["patterns"]:
        name = Pattern(kind, k).name
        pred = predict_step(kind, c, T, k, c_busy, T_busy)
        meas = measured["step_s"][name]
        steps.append({"pattern": name, "kind": kind, "k": k, "measured_s": meas, "predicted_s": pred,
                      "error_pct": None if kind == "none" else percent_error(pred, meas),
                      "measured_speedup": ssgd_measured / meas if ssgd_measured else None,
                      "predicted_speedup": ssgd_predicted / pred})

    if efficiency is None:
        # Both ranks share the loopback's one tbf qdisc: per-rank link efficiency is twice what
        # a single shared link would suggest (see the module docstring).
        efficiency = min(1.0, 2 * 8 / (b * rate_bps)) if rate_bps else 0.9
    c_plan = c if plan_compute_s is None else plan_compute_s
    # A measured c keeps its measured interference; a given one (e.g. a GPU's) overlaps perfectly.
    slowdown = c_busy / c if plan_compute_s is None else 1.0
    comm_slowdown = T_busy / T if plan_compute_s is None else 1.0
    plan = []
    for n in plan_ranks:
        for gbit in plan_gbits:
            beta_link = 8 / (efficiency * gbit * 1e9)
            T_n = ring_allreduce_time(measured["grad_bytes"], n, alpha, beta_link)
            t_ssgd = predict_step("ssgd", c_plan, T_n)
            t_ssd = predict_step("period", c_plan, T_n, plan_k, c_plan * slowdown, T_n * comm_slowdown)
            plan.append({"ranks": n, "gbit": gbit, "allreduce_s": T_n, "ssgd_s": t_ssgd, "ssd_period_s": t_ssd,
                         "speedup": t_ssgd / t_ssd, "best_k": max(1, int(-(-T_n // c_plan)))})
    return {"alpha_s": alpha, "beta_s_per_byte": beta, "fit_a_s": a, "fit_b_s_per_byte": b,
            "effective_gbit": 8 / b / 1e9 if b > 0 else None, "efficiency": efficiency,
            "compute_s": c, "compute_busy_s": c_busy, "allreduce_model_s": T, "allreduce_busy_s": T_busy, "plan_compute_s": c_plan, "plan_k": plan_k,
            "sizes": sizes, "steps": steps, "plan": plan}


def _pct(v) -> str:
    return "" if v is None else f"{round(v, 1) + 0.0:+.1f}%"   # + 0.0: no "-0.0%"


def report(measured: dict, result: dict, net: str) -> str:
    """The Markdown report printed by rank 0."""
    m, r = measured, result
    out = [f"## Alpha-beta model: {m['model']} ({m['num_params']:,} parameters, {m['grad_bytes'] / MB:.1f} MB "
           f"of float32 gradients), batch {m['batch_size']}/rank, {m['ranks']} ranks, network {net}", ""]
    fit_mb = ", ".join(f"{n / MB:g}" for n in m["fit_bytes"])
    out += [f"Fit on {fit_mb} MB: T_2(S) = {r['fit_a_s'] * 1e3:.3f} ms + S / ({r['effective_gbit']:.3f} Gbit/s)"
            if r["effective_gbit"] else f"Fit on {fit_mb} MB: a = {r['fit_a_s']:.3g} s, b = {r['fit_b_s_per_byte']:.3g} s/B",
            f"(per-hop alpha = {r['alpha_s'] * 1e6:.1f} us, beta = {r['beta_s_per_byte'] * 1e9:.3f} ns/byte); "
            f"compute c = {r['compute_s'] * 1e3:.2f} ms/step ({r['compute_busy_s'] * 1e3:.2f} ms while an allreduce "
            f"is in flight); model allreduce T = {r['allreduce_model_s'] * 1e3:.2f} ms "
            f"({r['allreduce_busy_s'] * 1e3:.2f} ms while compute runs) "
            f"(T/c = {r['allreduce_model_s'] / r['compute_s']:.2f})", ""]
    out += ["| allreduce size (MB) | role | measured ms | predicted ms | error |", "|---:|---|---:|---:|---:|"]
    for s in r["sizes"]:
        role = "fit" if s["fitted"] else ("held out (model size)" if s["bytes"] == m["grad_bytes"] else "held out")
        out.append(f"| {s['bytes'] / MB:.2f} | {role} | {s['measured_s'] * 1e3:.2f} | {s['predicted_s'] * 1e3:.2f} | "
                   f"{'' if s['fitted'] else _pct(s['error_pct'])} |")
    out += ["", "| step pattern | measured ms/step | predicted ms/step | error | measured speedup vs ssgd | "
                "predicted speedup |", "|---|---:|---:|---:|---:|---:|"]
    for s in r["steps"]:
        ms = "" if s["measured_speedup"] is None else f"{s['measured_speedup']:.2f}x"
        out.append(f"| {s['pattern']} | {s['measured_s'] * 1e3:.2f} | {s['predicted_s'] * 1e3:.2f} | "
                   f"{'(input c)' if s['kind'] == 'none' else _pct(s['error_pct'])} | {ms} | "
                   f"{s['predicted_speedup']:.2f}x |")
    out += ["", f"Planning: predicted speedup of ssd --comm period k={r['plan_k']} over ssgd for this model, "
                f"c = {r['plan_compute_s'] * 1e3:.2f} ms/step, link efficiency {r['efficiency']:.2f} "
                f"(best k = ceil(T/c))", "",
            "| ranks | link Gbit/s | allreduce ms | ssgd ms/step | ssd period ms/step | speedup | best k |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for p in r["plan"]:
        out.append(f"| {p['ranks']} | {p['gbit']:g} | {p['allreduce_s'] * 1e3:.1f} | {p['ssgd_s'] * 1e3:.1f} | "
                   f"{p['ssd_period_s'] * 1e3:.1f} | {p['speedup']:.2f}x | {p['best_k']} |")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- command

def add_arguments(parser) -> None:
    parser.add_argument("--net", default="1gbit", metavar="RATE|none",
                        help="network: a tc rate (1gbit, 100mbit) for a throttled namespace, or 'none' "
                             "(shared memory); when not already under mpiexec, the command relaunches "
                             "itself there (default 1gbit)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks when relaunching itself (default 2)")
    parser.add_argument("--model", default="wide-mlp", help="model whose step and gradient are measured")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    parser.add_argument("--fit-sizes", default="4,16,64", metavar="MB,...", help="allreduce sizes the fit uses")
    parser.add_argument("--check-sizes", default="2,8,32", metavar="MB,...",
                        help="held-out allreduce sizes (the model's gradient size is always added)")
    parser.add_argument("--patterns", default="ssgd,step,period:2,period:5,period:10,localsgd:5",
                        metavar="P,...", help="step loops to measure: ssgd, step, period:K, localsgd:K")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per loop (at least 2 periods)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per allreduce size (median)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved repeats of the step loops (median)")
    parser.add_argument("--progress", default="auto", help="allreduce progress strategy (see ssdmpi train)")
    parser.add_argument("--plan-ranks", default="2,4,8,16,32", metavar="N,...")
    parser.add_argument("--plan-gbits", default="1,10,25,100", metavar="G,...", help="link bandwidths, Gbit/s")
    parser.add_argument("--plan-k", type=int, default=5, help="k of the planning table (default 5)")
    parser.add_argument("--plan-compute-ms", type=float, default=None, help="compute per step for planning")
    parser.add_argument("--plan-efficiency", type=float, default=None, help="link efficiency (0, 1] for planning")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write measurements and predictions as JSON")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds, when relaunching (default 1800)")


def _validate(args) -> None:
    for name in ("ranks", "batch_size", "steps", "reps", "repeats", "plan_k"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.ranks < 2:
        raise UserError("--ranks must be at least 2: the model is fitted to a real allreduce")
    parse_rate(args.net)
    _sizes(args.fit_sizes, "--fit-sizes")
    _sizes(args.check_sizes, "--check-sizes")
    for p in args.patterns.split(","):
        parse_pattern(p)
    for flag, text in (("--plan-ranks", args.plan_ranks), ("--plan-gbits", args.plan_gbits)):
        _positive_numbers(text, flag)
    if args.plan_efficiency is not None and not 0 < args.plan_efficiency <= 1:
        raise UserError(f"--plan-efficiency must be in (0, 1], got {args.plan_efficiency}")
    if args.plan_compute_ms is not None and args.plan_compute_ms <= 0:
        raise UserError(f"--plan-compute-ms must be > 0, got {args.plan_compute_ms}")
    if len(set(fit := _sizes(args.fit_sizes, "--fit-sizes"))) < 2:
        raise UserError(f"--fit-sizes needs at least two distinct sizes, got {fit}")


def _under_launcher() -> bool:
    """Started by an MPI launcher or by srun (a Slurm batch script's own shell has SLURM_PROCID too,
    but no numeric SLURM_STEP_ID)."""
    if any(name in os.environ for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")):
        return True
    return "SLURM_PROCID" in os.environ and os.environ.get("SLURM_STEP_ID", "").isdigit()


def _relaunch(args) -> int:
    """Run this command again under ``[ssdmpi-netns --rate R --] mpiexec -n RANKS``."""
    from ssdmpi.bench.train import NETNS, ROOT, _mpiexec, check_network

    check_network(args.net)
    flags = []
    for action in ("net", "model", "batch_size", "fit_sizes", "check_sizes", "patterns", "steps", "reps",
                   "repeats", "progress", "plan_ranks", "plan_gbits", "plan_k", "plan_compute_ms",
                   "plan_efficiency", "seed", "json"):
        value = getattr(args, action)
        if value is not None:
            flags += [f"--{action.replace('_', '-')}", str(value)]
    cmd = [_mpiexec(), "-n", str(args.ranks), sys.executable, "-m", "ssdmpi", "bench", "model"] + flags
    if args.net != "none":
        cmd = [str(NETNS), "--rate", args.net, "--"] + cmd
    print(f"[bench model] {shlex.join(cmd)}", file=sys.stderr, flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    try:
        return subprocess.run(cmd, env=env, cwd=ROOT, timeout=args.timeout).returncode
    except subprocess.TimeoutExpired:
        raise UserError(f"bench model did not finish within --timeout {args.timeout:g} s")


def run(args) -> int:
    _validate(args)
    if not _under_launcher():
        return _relaunch(args)
    from ssdmpi.comm import communicator as communicator_module

    comm = communicator_module.Communicator(progress=args.progress)
    if comm.size < 2:
        comm.free()
        raise UserError("bench model needs at least 2 ranks (mpiexec -n 2 ...)", collective=True)
    say = (lambda text: print(f"[bench model] {text}", file=sys.stderr, flush=True)) if comm.rank == 0 \
        else (lambda text: None)
    say(f"{comm.size} ranks, progress {comm.strategy}, network {args.net}")
    try:
        measured = measure(args, comm, say)
    finally:
        comm.free()
    if comm.rank == 0:
        result = analyse(measured, rate_bps=parse_rate(args.net), efficiency=args.plan_efficiency,
                         plan_ranks=[int(float(v)) for v in args.plan_ranks.split(",") if v.strip()],
                         plan_gbits=[float(v) for v in args.plan_gbits.split(",") if v.strip()],
                         plan_compute_s=None if args.plan_compute_ms is None else args.plan_compute_ms / 1e3,
                         plan_k=args.plan_k)
        print(report(measured, result, args.net), end="", flush=True)
        if args.json:
            tmp = f"{args.json}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"net": args.net, "progress": args.progress, "measured": measured, "model": result}, f,
                          indent=2)
            os.replace(tmp, args.json)
    return 0
