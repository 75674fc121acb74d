"""The Markdown report of ``ssdmpi bench model`` (printed by rank 0)."""

from __future__ import annotations

from ssdmpi.algos import registry
from ssdmpi.bench.model.alphabeta import BLOCKING, NONE, PERIOD, Pattern, kind_label, window_setting
from ssdmpi.bench.model.measure import MB


def _pct(v) -> str:
    return "" if v is None else f"{round(v, 1) + 0.0:+.1f}%"   # + 0.0: no "-0.0%"


def report(measured: dict, result: dict, net: str) -> str:
    """The Markdown report printed by rank 0."""
    m, r = measured, result
    out = [f"## Alpha-beta model: {m['model']} ({m['num_params']:,} parameters, {m['grad_bytes'] / MB:.1f} MB "
           f"of float32 gradients), batch {m['batch_size']}/rank, {m['ranks']} ranks, network {net}", ""]
    fit_mb = ", ".join(f"{n / MB:g}" for n in m["fit_bytes"]) + " MB"
    if r.get("fit_from_file"):
        # Every measured point of this run is held out: the link comes from an earlier run.
        fit_mb = (f"an earlier run on {r['fit_ranks']} ranks (--fit-from: its alpha, beta and overlap slowdowns; "
                  "every point below is held out)")
    out += [f"Fit on {fit_mb}: T_2(S) = {r['fit_a_s'] * 1e3:.3f} ms + S / ({r['effective_gbit']:.3f} Gbit/s)"
            if r["effective_gbit"]
            else f"Fit on {fit_mb}: a = {r['fit_a_s']:.3g} s, b = {r['fit_b_s_per_byte']:.3g} s/B",
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
    base = Pattern(BLOCKING).name
    out += ["", f"| step pattern | measured ms/step | predicted ms/step | error | measured speedup vs {base} | "
                "predicted speedup |", "|---|---:|---:|---:|---:|---:|"]
    for s in r["steps"]:
        ms = "" if s["measured_speedup"] is None else f"{s['measured_speedup']:.2f}x"
        out.append(f"| {s['pattern']} | {s['measured_s'] * 1e3:.2f} | {s['predicted_s'] * 1e3:.2f} | "
                   f"{'(input c)' if s['kind'] == NONE else _pct(s['error_pct'])} | {ms} | "
                   f"{s['predicted_speedup']:.2f}x |")
    window = window_setting()
    flag = f"--{window.flag}" if window is not None else "d"
    out += ["", f"Planning: predicted speedup of {kind_label(PERIOD, flags=True)} k={r['plan_k']} over "
                f"{registry.BASELINE} for this model, "
                f"c = {r['plan_compute_s'] * 1e3:.2f} ms/step, link efficiency {r['efficiency']:.2f} "
                f"(best k = ceil(T/c)): the allreduce hidden behind the whole period (as {flag} "
                f"{r['plan_k']}; --delay auto chooses k and d to hide it) and behind one step (the default "
                f"{flag} {window.default if window is not None else 1})", "",
            f"| ranks | link Gbit/s | allreduce ms | {base} ms/step | {kind_label(PERIOD)} ms/step | speedup "
            "| d = 1 ms/step | d = 1 speedup | best k |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in r["plan"]:
        out.append(f"| {p['ranks']} | {p['gbit']:g} | {p['allreduce_s'] * 1e3:.1f} | {p['ssgd_s'] * 1e3:.1f} | "
                   f"{p['ssd_period_s'] * 1e3:.1f} | {p['speedup']:.2f}x | {p['ssd_d1_s'] * 1e3:.1f} | "
                   f"{p['speedup_d1']:.2f}x | {p['best_k']} |")
    return "\n".join(out) + "\n"
