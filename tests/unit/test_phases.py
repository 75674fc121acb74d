"""The step breakdown (ssdmpi/phases.py): the record fields, the algorithm's accounting, the summary
line, and ``bench train``'s bounds and breakdown table and figure."""

import json
import time

import numpy as np
import pytest

from ssdmpi.comm.stats import CommStats
from ssdmpi.phases import BREAKDOWN


def test_step_record_breakdown_sums_to_the_step_time_and_splits_the_wait():
    from ssdmpi.run.loop import step_record

    # Two ranks, 10 steps each: rank-step totals of each phase.
    sums = {"steps": 20, "bad": 0, "loss": 20.0, "wall": 20 * 0.5, "my_steps": 10, "my_wall": 5.0,
            "inflight_s": 20 * 1.0, "wait_s": 20 * 0.25, "progress_s": 20 * 0.05, "bytes_sent": 0.0,
            "fb_s": 20 * 0.1, "update_s": 20 * 0.08, "data_s": 20 * 0.01, "sync_s": 20 * 0.03}
    r = step_record(sums, 64)
    assert r["step_s"] == pytest.approx(0.5)
    assert r["blocked_s"] == pytest.approx(0.20) and r["progress_s"] == pytest.approx(0.05)
    assert (r["fb_s"], r["update_s"], r["data_s"]) == pytest.approx((0.1, 0.08, 0.01))
    assert r["sync_s"] == pytest.approx(0.03)
    assert r["other_s"] == pytest.approx(0.5 - 0.1 - 0.08 - 0.01 - 0.25 - 0.03)
    assert sum(r[k] for k in BREAKDOWN) == pytest.approx(r["step_s"])
    assert r["compute_s"] == pytest.approx(0.25)


class SleepyComm:
    """One rank whose allreduce takes ``delay`` seconds, recorded as exposed wait, and whose
    ``progress()`` (called by the model between layers) takes ``poke`` seconds. Like the real
    Communicator's ``blocking`` strategy, ``allreduce_start`` (called by the overlapped ssgd
    during the backward pass) runs the whole allreduce, and its ``wait()`` records it."""

    size, rank, moved_by_caller = 1, 0, True    # like --progress test: the caller moves requests along

    def __init__(self, delay, poke, bucket_bytes=None):
        self.stats, self.delay, self.poke, self.bucket_bytes = CommStats(), delay, poke, bucket_bytes

    def allreduce(self, buf, average=True):
        return self.allreduce_start(buf, average).wait()

    def allreduce_start(self, buf, average=True):
        return SleptHandle(self, buf, slept(self.delay))

    def progress(self):
        self.stats.add_exposed(slept(self.poke))


def slept(seconds: float) -> float:
    """Sleep ``seconds``; the time it really took (more on a loaded machine)."""
    t0 = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - t0


class SleptHandle:
    def __init__(self, comm, buf, seconds):
        self.comm, self.buf, self.seconds = comm, buf, seconds

    def wait(self):
        self.comm.stats.record(self.buf.nbytes, self.seconds, self.seconds, 0.0)
        return self.buf


@pytest.mark.parametrize("bucket_bytes,buckets", [(None, 1), (8, 2)], ids=["blocking", "overlapped"])
def test_the_algorithm_counts_neither_communication_nor_progress_calls_as_fb_or_update(bucket_bytes, buckets):
    """ssgd steps on a fake communicator whose allreduce and progress() calls sleep: the sleeps
    land in the Communicator's stats, not in fb_s or update_s, and the phases cover the step --
    also when the allreduce is posted in two buckets inside the backward pass."""
    from ssdmpi.algos import AlgoConfig, build_algorithm
    from ssdmpi.nn import build_model

    model = build_model("mlp", (6,), 3, widths=(5,), dtype=np.float64, seed=0)
    comm = SleepyComm(delay=0.05, poke=0.01, bucket_bytes=bucket_bytes)
    algo = build_algorithm(AlgoConfig(algo="ssgd", lr=0.05), model, comm)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 6)), rng.integers(0, 3, 4)
    start = time.perf_counter()
    for _ in range(3):
        algo.step(x, y)
    wall = time.perf_counter() - start
    st = comm.stats.snapshot()
    assert st["progress_s"] > 0 and st["wait_s"] >= 3 * buckets * 0.05 + st["progress_s"]
    assert st["allreduce_count"] == 3 * buckets
    ph = algo.phases
    # The model is tiny: everything but the sleeps is well under the sleeps' time.
    assert 0 < ph.fb_s < 0.05 and 0 < ph.update_s < 0.05
    assert ph.fb_s + ph.update_s + st["wait_s"] == pytest.approx(wall, rel=0.05)


def test_summary_prints_the_breakdown_line():
    from ssdmpi.metrics import summary_text

    s = {"algo": "ssd", "step_s": 0.5, "compute_s": 0.25, "fb_s": 0.1, "update_s": 0.08, "data_s": 0.01,
         "blocked_s": 0.2, "progress_s": 0.05, "sync_s": 0.04, "other_s": 0.02}
    text = summary_text(s)
    assert ("step 500.00 ms = forward+backward 100.00, update 80.00, data 10.00, exposed wait 200.00, "
            "progress calls 50.00, sync points 40.00, other 20.00 ms") in text
    assert "step " not in summary_text({"algo": "ssd"}).split("\n", 2)[-1]


class NoEvals:
    """A run without evaluations; ``settings``: its config, ``summary``: its summary."""

    def __init__(self, settings=None, summary=None):
        self.settings, self.summary = dict(settings or {}), dict(summary or {})

    def setting(self, name, default=None):
        return self.settings.get(name, default)

    def time_to_accuracy(self, target):
        return None


def _metrics(sps, compute, inflight, wait, step, run=None, **phases):
    m = {"samples_per_s": sps, "compute_s": compute, "inflight_s": inflight, "wait_s": wait, "bytes_sent": 1.0,
         "step_s": step, "final_acc": 0.8, "wall_s": 10.0, "run": run or NoEvals()}
    m.update({k: phases.get(k, 0.0) for k in BREAKDOWN})
    return m


def test_bench_train_bounds_come_from_ssgds_own_c_and_T():
    """c = 85 ms, T = 1.29 s (ssgd's step 1375 ms), ssd period k=5 at 4.02x: bound (c+T)/max(c, T/k)
    = 1375/258 = 5.33x, so 0.754 of it; localsgd's (c+T)/(c+T/k); ssd step's (c+T)/max(c, T).
    ssgd's bucket allreduces overlap, so their summed time in flight (2.6 s here) exceeds its step:
    T is the rest of ssgd's step, not that sum."""
    from ssdmpi.bench.train import bound_note, breakdown_table, parse_variant, summarise

    c, T = 0.085, 1.29
    variants = [parse_variant(v) for v in ("ssgd", "ssd:period:5", "localsgd:5", "ssd:step:5")]
    ssgd = _metrics(46.5, c, 2.6, T, c + T, fb_s=0.06, update_s=0.02, data_s=0.005, blocked_s=T)
    period = _metrics(46.5 * 4.02, 0.1, 1.6 / 5, 0.02, 0.12, fb_s=0.07, update_s=0.02, data_s=0.005,
                      blocked_s=0.02, other_s=0.005, run=NoEvals({"period_rule": "delta-own", "delay": 5}))
    local = _metrics(46.5 * 2.0, 0.09, T / 5, T / 5, 0.09 + T / 5)
    step = _metrics(46.5 * 1.0, 0.1, 1.5, 1.4, 1.5)
    rows = summarise(variants, {"ssgd": [ssgd], "ssd-period-k5": [period], "localsgd-k5": [local],
                                "ssd-step-k5": [step]})
    by = {r["name"]: r for r in rows}
    assert by["ssgd"]["bound"] == pytest.approx(1.0) and by["ssgd"]["of_bound"] == pytest.approx(1.0)
    p = by["ssd-period-k5"]
    assert p["bound"] == pytest.approx((c + T) / (T / 5)) and p["bound"] == pytest.approx(5.33, abs=0.01)
    assert p["of_bound"] == pytest.approx(4.02 / p["bound"]) and p["of_bound"] == pytest.approx(0.754, abs=0.001)
    assert p["allreduce_ms"] == pytest.approx(1600.0)                         # per allreduce: k steps' worth
    # the alpha-beta model's period by hand: the allreduce (1.6 s while the compute runs too) outlasts the
    # 5 steps of busy compute (0.1 s each), then runs alone for the rest of its 1.29 s:
    # 5 x 0.1 + 1.29 x (1 - 5 x 0.1 / 1.6) = 1.386875 s per period, 0.277375 s per step
    assert p["model_bound"] == pytest.approx(1.375 / 0.277375) and p["model_bound"] == pytest.approx(4.957, abs=1e-3)
    assert p["model_bound"] < p["bound"]
    assert by["localsgd-k5"]["bound"] == pytest.approx((c + T) / (c + T / 5))
    assert by["ssd-step-k5"]["bound"] == pytest.approx((c + T) / T)
    assert p["step_ms"] == pytest.approx(120.0) and p["sum_ratio"] == pytest.approx(0.115 / 0.12)
    table = breakdown_table(rows, bound_note(rows))
    assert "c = 85.0 ms and communication T = 1290.0 ms per step, the rest of its step" in table
    assert "| ssd-period-k5 | 120.0 | 70.00 | 20.00 | 5.00 | 20.00 | 0.00 | 0.00 | 5.00 | 0.958 | 1600.0 | 4.02x " \
           "| 5 | 5.33x | 0.754 |" in table


def test_a_period_runs_bound_overlaps_only_its_merge_delay():
    """delta-merge merges d steps after the post: the allreduce hides behind d steps, and T - d c is
    exposed once per period. c = 85 ms, T = 1.29 s: at k = 5, d = 1 the period takes 5 c + (T - c) =
    1.63 s, a bound of 5 x 1.375 / 1.63 = 4.22x; d = 5 hides 425 ms of it: (c + T) / (T / 5) = 5.33x;
    --delay auto at the (k, d) its run chose, (23, 14): 14 c = 1.19 s < T, so 23 x 1.375 / (23 c + T - 14 c)
    = 15.39x, and (23, 16) hides it all (16 c >= T): c + T over c. ``period_bound``, the bound with a whole
    period of hiding, is there only where the window exposes part of the allreduce. A run from before the
    period rules (no period_rule) merged at the next period's end."""
    from ssdmpi.bench.train import parse_variant, summarise

    c, T = 0.085, 1.29
    names = ("ssgd", "ssd:period:5", "ssd:period:5:d5", "ssd:period:auto", "ssd:period:auto:32", "ssd:period:10")
    variants = [parse_variant(v) for v in names]
    runs = {"ssd-period-k5": {"period_rule": "delta-merge", "delay": 5, "merge_delay": 1},
            "ssd-period-k5-d5": {"period_rule": "delta-merge", "delay": 5, "merge_delay": 5},
            "ssd-period-kauto": {"period_rule": "delta-merge", "delay": "auto", "merge_delay": None},
            "ssd-period-kauto-max32": {"period_rule": "delta-merge", "delay": "auto", "merge_delay": None},
            "ssd-period-k10": {"delay": 10}}
    chose = {"ssd-period-kauto": (23, 14), "ssd-period-kauto-max32": (23, 16)}     # 16 c = 1.36 s >= T
    results = {"ssgd": [_metrics(46.5, c, 2.6, T, c + T)]}
    for name, settings in runs.items():
        k, d = chose.get(name, (None, None))
        run = NoEvals(settings, {"delay_auto": {"delay": k, "merge_delay": d}} if k else None)
        results[name] = [_metrics(46.5 * 4, 0.1, 0.3, 0.02, 0.12, run=run)]
    by = {r["name"]: r for r in summarise(variants, results)}
    assert by["ssd-period-k5"]["bound"] == pytest.approx(5 * 1.375 / 1.63) == pytest.approx(4.218, abs=1e-3)
    assert by["ssd-period-k5"]["of_bound"] == pytest.approx(4 / 4.218, abs=1e-3)
    assert by["ssd-period-k5"]["period_bound"] == pytest.approx(1.375 / (1.29 / 5))       # d = k: 5.33x
    assert by["ssd-period-k5"]["of_period_bound"] == pytest.approx(4 / 5.329, abs=1e-3)
    assert by["ssd-period-kauto"]["period_bound"] == pytest.approx(1.375 / c)     # max(c, T/23) = c
    assert by["ssd-period-kauto-max32"]["bound"] == pytest.approx(1.375 / c)     # all hidden: max(c, T/23)
    for name in ("ssd-period-k5-d5", "ssd-period-kauto-max32", "ssd-period-k10"):   # d = k, or d c >= T
        assert "period_bound" not in by[name]
    assert by["ssd-period-k5-d5"]["bound"] == pytest.approx(1.375 / (1.29 / 5))
    assert by["ssd-period-kauto"]["bound"] == pytest.approx(23 * 1.375 / (23 * c + T - 14 * c))
    assert by["ssd-period-kauto"]["bound"] == pytest.approx(15.39, abs=0.01)
    assert by["ssd-period-k10"]["bound"] == pytest.approx(1.375 / max(c, T / 10))
    assert [by[n]["windows"] for n in runs] == [[1], [5], [14], [16], [10]]


def test_the_overlap_window_in_the_step_model():
    """predict_step's window d: the allreduce overlaps the first d of k steps (hand-computed periods)."""
    from ssdmpi.bench.model.alphabeta import predict_step

    c, T = 0.1, 0.45
    assert predict_step("period", c, T, 5, window=1) == pytest.approx((5 * c + T - c) / 5)          # 0.135
    assert predict_step("period", c, T, 5, window=4) == pytest.approx((5 * c + T - 4 * c) / 5)      # 0.105
    assert predict_step("period", c, T, 5, window=5) == pytest.approx(c) == predict_step("period", c, T, 5)
    # contention: the allreduce at 1.5x while it runs, compute at 2x: window first after 2 c_busy = 0.4 s,
    # having moved 0.4/0.675 of the allreduce; the rest alone, then 3 steps of compute
    assert predict_step("period", c, T, 5, 2 * c, 1.5 * T, window=2) == pytest.approx(
        (0.4 + T * (1 - 0.4 / 0.675) + 3 * c) / 5)
    with pytest.raises(ValueError, match="window"):
        predict_step("period", c, T, 5, window=6)


def test_breakdown_figure_is_drawn_from_step_records(tmp_path):
    pytest.importorskip("matplotlib")
    from ssdmpi.plot import load_run, make_figures

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    rec = {"kind": "step", "stage": "delay", "samples_per_s": 10.0, "step_s": 0.1,
           **{k: 0.1 / len(BREAKDOWN) for k in BREAKDOWN}}
    lines = [{"kind": "start", "config": {"algo": "ssd", "comm": "period", "delay": 5}},
             {**rec, "step": 5}, {**rec, "step": 10}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    written = make_figures([load_run(run_dir)], tmp_path / "fig")
    assert tmp_path / "fig" / "step_breakdown.png" in written


class SlowSync:
    """A communicator whose control allreduce (the sync point's) takes ``delay`` seconds."""

    def __init__(self, delay):
        self.stats, self.delay = CommStats(), delay

    def allreduce_scalars(self, values, op="sum"):
        time.sleep(self.delay)
        return {k: float(v) for k, v in values.items()}


def test_a_sync_points_time_is_counted_in_the_next_interval():
    """With a request in flight on a slow network the sync point's control allreduce waits behind
    the data: that time is training time. It is carried into the next interval's wall as sync_s
    (it used to fall between intervals, uncounted, which made ssd look faster than it was)."""
    from ssdmpi.run.loop import Interval

    class Stop:
        preempt = interrupt = 0

    from types import SimpleNamespace

    from ssdmpi.phases import Phases

    algo = SimpleNamespace(phases=Phases(), interval_staleness=dict)    # what the loop reads of an algorithm
    comm, interval = SlowSync(0.2), Interval()
    interval.add(1.0)
    first = interval.reduce(comm, Stop(), algo)
    interval.synced()
    interval.restart(comm, algo)
    interval.add(1.0)
    second = interval.reduce(comm, Stop(), algo)
    assert first["sync_s"] == 0.0 and second["sync_s"] >= 0.2
    assert second["wall"] >= second["sync_s"]


def test_the_record_logged_at_the_switch_is_not_steady_state(tmp_path):
    """The record at step T_w says 'delay' (the stage after its last step) but timed SSGD steps:
    it must not enter ssd's steady-state means (it made ssd look ~15% slower in bench train)."""
    from ssdmpi.plot import load_run

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    lines = [{"kind": "start", "config": {"algo": "ssd", "comm": "period", "delay": 5, "warmup_steps": 10}}]
    lines += [{"kind": "step", "step": s, "stage": "warmup" if s < 10 else "delay", "samples_per_s": 10.0}
              for s in (5, 10, 15, 20)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert [r["step"] for r in load_run(run_dir).steady_steps()] == [15, 20]


class ChoseK(NoEvals):
    """A run whose --delay auto chose ``k`` and ``d`` (default ``k``), as its summary.json records it."""

    def __init__(self, k, d=None):
        super().__init__({"period_rule": "delta-merge", "delay": "auto"},
                         {"delay_auto": {"delay": k, "merge_delay": k if d is None else d}})


def test_bench_train_bounds_an_auto_variant_at_the_k_its_run_chose():
    """ssgd next to ``ssd:period:auto``: the auto row's bound is the period bound at the k the run chose
    (here 10: (c+T)/max(c, T/10)); a row whose repeats chose different k gets none (and no crash)."""
    from ssdmpi.bench.train import parse_variant, summarise

    c, T = 0.085, 1.29
    variants = [parse_variant(v) for v in ("ssgd", "ssd:period:auto", "ssd:period:auto:8")]
    ssgd = _metrics(46.5, c, T, T, c + T)
    auto = dict(_metrics(46.5 * 6.0, 0.1, 0.2, 0.02, 0.13), run=ChoseK(10))
    mixed = [dict(_metrics(46.5 * 5.0, 0.1, 0.2, 0.02, 0.13), run=ChoseK(k)) for k in (7, 8)]
    rows = summarise(variants, {"ssgd": [ssgd], "ssd-period-kauto": [auto], "ssd-period-kauto-max8": mixed})
    by = {r["name"]: r for r in rows}
    assert by["ssd-period-kauto"]["k_chosen"] == [10] and by["ssd-period-kauto"]["k"] == "auto (10)"
    assert by["ssd-period-kauto"]["bound"] == pytest.approx((c + T) / (T / 10))
    assert by["ssd-period-kauto"]["of_bound"] == pytest.approx(6.0 / by["ssd-period-kauto"]["bound"])
    assert by["ssd-period-kauto-max8"]["k_chosen"] == [7, 8] and by["ssd-period-kauto-max8"]["k"] == "auto (7, 8)"
    assert by["ssd-period-kauto-max8"].get("bound") is None
