"""``ssdmpi bench model``: the alpha-beta fit, the step-time formulas, the report, and a real 2-rank run."""

import json

import pytest

from tests.conftest import run_cli

MB = 1_000_000


def test_fit_recovers_a_known_line_and_rejects_a_single_size():
    from ssdmpi.bench.model.alphabeta import fit_alpha_beta
    from ssdmpi.errors import UserError

    sizes = [1 * MB, 4 * MB, 16 * MB]
    a, b = fit_alpha_beta(sizes, [2e-4 + s * 8e-9 for s in sizes])
    assert a == pytest.approx(2e-4, rel=1e-9) and b == pytest.approx(8e-9, rel=1e-9)
    # noisy points: least squares, not interpolation of two of them
    a, b = fit_alpha_beta([0, 1, 2, 3], [0.1, 0.9, 2.1, 2.9])
    assert (a, b) == (pytest.approx(0.06), pytest.approx(0.96))
    with pytest.raises(UserError, match="two distinct"):
        fit_alpha_beta([MB, MB], [1.0, 1.1])


def test_ring_allreduce_volume_grows_as_2_n_minus_1_over_n():
    from ssdmpi.bench.model.alphabeta import ring_allreduce_time

    assert ring_allreduce_time(8 * MB, 1, 1e-5, 1e-9) == 0.0
    assert ring_allreduce_time(8 * MB, 2, 1e-5, 1e-9) == pytest.approx(2e-5 + 8 * MB * 1e-9)
    # 4 ranks: 6 latency hops, 1.5 x the bytes; many ranks: approaches 2 x the bytes
    assert ring_allreduce_time(8 * MB, 4, 1e-5, 1e-9) == pytest.approx(6e-5 + 1.5 * 8 * MB * 1e-9)
    assert ring_allreduce_time(8 * MB, 1000, 0.0, 1e-9) == pytest.approx(2 * 8 * MB * 1e-9, rel=1e-3)


@pytest.mark.parametrize("kind, k, expected", [
    ("none", 1, 0.10),
    ("blocking", 1, 0.10 + 0.40),     # compute, then a blocking allreduce
    ("averaging", 5, 0.10 + 0.40 / 5),  # a blocking allreduce every 5 steps
    ("step", 1, 0.40),                # each allreduce hides behind one step: communication-bound
    ("period", 2, 0.20),              # behind 2 steps: still communication-bound, half the volume
    ("period", 5, 0.10),              # behind 5 steps: fully hidden, compute-bound
])
def test_step_time_formulas(kind, k, expected):
    from ssdmpi.bench.model.alphabeta import predict_step

    assert predict_step(kind, 0.10, 0.40, k) == pytest.approx(expected)


def test_overlap_with_compute_slowed_by_communication():
    """c_busy = 2c: the compute runs at half speed while the allreduce is in flight."""
    from ssdmpi.bench.model.alphabeta import predict_step

    c, T = 0.10, 0.40
    # k = 5: a period does 0.5 s of compute; 0.4 s of it at half speed (0.2 s done), then 0.3 s alone
    assert predict_step("period", c, T, 5, compute_busy=2 * c) == pytest.approx((0.4 + 0.3) / 5)
    # k = 2: 0.2 s of compute, all done at half speed within the 0.4 s allreduce: communication-bound
    assert predict_step("period", c, T, 2, compute_busy=2 * c) == pytest.approx(0.4 / 2)
    # step = period with k = 1; blocking patterns do not overlap, so c_busy does not matter
    assert predict_step("step", c, T, compute_busy=2 * c) == predict_step("period", c, T, 1, compute_busy=2 * c)
    assert predict_step("blocking", c, T, compute_busy=2 * c) == pytest.approx(c + T)
    # a faster compute_busy than c is measurement noise, never a prediction faster than perfect overlap
    assert predict_step("period", c, T, 5, compute_busy=0.5 * c) == pytest.approx(c)


def test_overlap_with_communication_slowed_by_compute():
    """T_busy = 1.5 T: the allreduce runs at 2/3 speed while compute runs."""
    from ssdmpi.bench.model.alphabeta import predict_step

    c, T = 0.10, 0.40
    # k = 2, c_busy = c: the compute (0.2 s) finishes first; by then 1/3 of the allreduce is done
    # (0.2 s of its 0.6 s busy time); the remaining 2/3 of T = 0.267 s runs alone.
    assert predict_step("period", c, T, 2, allreduce_busy=1.5 * T) == pytest.approx((0.2 + 0.4 * 2 / 3) / 2)
    # k = 10: the allreduce (0.6 s) finishes first, the compute (1.0 s) was not slowed: P = k c
    assert predict_step("period", c, T, 10, allreduce_busy=1.5 * T) == pytest.approx(c)
    # both slowed, allreduce first: 0.6 s overlapped (0.3 s of compute done), then 0.7 s alone
    assert predict_step("period", c, T, 10, compute_busy=2 * c, allreduce_busy=1.5 * T) == \
        pytest.approx((0.6 + 0.7) / 10)
    # the two cases meet where the allreduce and the compute end together (T_busy = k c_busy)
    assert predict_step("period", c, T, 3, compute_busy=2 * c, allreduce_busy=0.6) == pytest.approx(0.6 / 3)


def test_speedup_of_period_is_bounded_by_one_plus_t_over_c():
    from ssdmpi.bench.model.alphabeta import predict_step

    c, T = 0.1, 0.4
    speedups = [predict_step("blocking", c, T) / predict_step("period", c, T, k) for k in (1, 2, 4, 8, 16)]
    assert speedups == sorted(speedups) and speedups[-1] == pytest.approx(1 + T / c)


def synthetic_measurement(c=0.05, a=3e-4, b=8e-9, grad_bytes=80 * MB):
    """What ``measure`` returns when the machine behaves exactly like the model."""
    from ssdmpi.bench.model.alphabeta import Pattern, predict_step

    fit, check = [1 * MB, 4 * MB, 16 * MB], [2 * MB, 8 * MB, grad_bytes]
    T = a + b * grad_bytes
    patterns = [Pattern("none"), Pattern("blocking"), Pattern("step"), Pattern("period", 2), Pattern("period", 5),
                Pattern("averaging", 5)]
    return {"model": "wide-mlp", "num_params": grad_bytes // 4, "grad_bytes": grad_bytes, "batch_size": 64,
            "ranks": 2, "fit_bytes": fit, "check_bytes": check,
            "allreduce_s": {str(n): a + b * n for n in fit + check},
            "step_s": {p.name: predict_step(p.kind, c, T, p.k) for p in patterns},
            "compute_busy_s": c, "allreduce_busy_s": a + b * grad_bytes,
            "patterns": [[p.kind, p.k] for p in patterns]}


def test_analysis_predicts_held_out_points_of_a_machine_that_follows_the_model():
    from ssdmpi.bench.model.alphabeta import analyse

    measured = synthetic_measurement()
    result = analyse(measured, rate_bps=1e9)
    held_out = [s for s in result["sizes"] if not s["fitted"]]
    assert len(held_out) == 3 and all(abs(s["error_pct"]) < 1e-6 for s in held_out)
    errors = [s["error_pct"] for s in result["steps"] if s["kind"] != "none"]
    assert len(errors) == 5 and all(abs(e) < 1e-6 for e in errors)
    period5 = next(s for s in result["steps"] if s["pattern"] == "ssd period k=5")
    T = 3e-4 + 8e-9 * 80 * MB   # 640.3 ms: the allreduce takes longer than 5 steps of compute
    assert period5["predicted_s"] == pytest.approx(T / 5)
    assert period5["predicted_speedup"] == pytest.approx((0.05 + T) / (T / 5))
    # 2 ranks on the loopback's one 1 Gbit/s qdisc: b = 8 ns/B means 2 x 1 Gbit/s per rank...
    assert result["efficiency"] == 1.0   # ...capped: the link cannot be more than fully used
    assert result["effective_gbit"] == pytest.approx(1.0)


def test_planning_table_scales_with_ranks_and_bandwidth():
    from ssdmpi.bench.model.alphabeta import analyse

    result = analyse(synthetic_measurement(b=16e-9), rate_bps=1e9, plan_ranks=(2, 8), plan_gbits=(1, 100))
    assert result["efficiency"] == pytest.approx(1.0)
    plan = {(p["ranks"], p["gbit"]): p for p in result["plan"]}
    # 8 ranks send 2*7/8 = 1.75 x the bytes of 2 ranks over the same link
    bytes_time = lambda p, n: p["allreduce_s"] - 2 * (n - 1) * result["alpha_s"]   # noqa: E731
    assert bytes_time(plan[8, 1], 8) == pytest.approx(1.75 * bytes_time(plan[2, 1], 2))
    assert plan[2, 100]["speedup"] < plan[2, 1]["speedup"]   # a faster network leaves less to hide
    assert all(p["speedup"] >= 1.0 for p in result["plan"])


def test_planning_table_also_predicts_the_default_merge_delay():
    """With c = 50 ms and no overlap slowdown, k = 5, d = 1 exposes T - c once per period: a step of
    (5 c + T - c) / 5 where T > c; where one step hides T it is c, as with the whole period."""
    from ssdmpi.bench.model.alphabeta import analyse
    from ssdmpi.bench.model.report import report

    measured = synthetic_measurement(b=16e-9)
    result = analyse(measured, rate_bps=1e9, plan_ranks=(2,), plan_gbits=(1, 100))
    slow, fast = result["plan"]
    T = slow["allreduce_s"]                                   # 80 MB at 1 Gbit/s: about 0.64 s
    assert T > 0.6 and slow["ssd_d1_s"] == pytest.approx((5 * 0.05 + T - 0.05) / 5)
    assert slow["speedup_d1"] == pytest.approx((0.05 + T) / slow["ssd_d1_s"])
    assert slow["speedup_d1"] < slow["speedup"]
    assert fast["allreduce_s"] < 0.05
    assert fast["ssd_d1_s"] == pytest.approx(0.05) and fast["ssd_period_s"] == pytest.approx(0.05)
    assert "| d = 1 ms/step | d = 1 speedup |" in report(measured, result, "1gbit")


def test_report_lists_measured_points_next_to_predictions():
    from ssdmpi.bench.model.alphabeta import analyse
    from ssdmpi.bench.model.report import report

    measured = synthetic_measurement()
    text = report(measured, analyse(measured, rate_bps=1e9), "1gbit")
    assert "| 8.00 | held out | " in text and "| 80.00 | held out (model size) |" in text
    assert "| ssd period k=5 | 128.06 | 128.06 | +0.0% | 5.39x | 5.39x |" in text
    assert "| 1.00 | fit |" in text
    assert "| ranks | link Gbit/s |" in text


def test_patterns_are_named_by_kind_or_by_the_algorithm_that_has_one():
    """The kinds are no algorithm's name; an algorithm's name stands for its spec's ``pattern``, and a
    pattern's table name comes from the algorithms that have it."""
    from ssdmpi.algos import registry
    from ssdmpi.bench.model.alphabeta import PATTERNS, Pattern, parse_pattern
    from ssdmpi.errors import UserError

    assert not set(PATTERNS) & set(registry.ALGORITHMS)
    assert parse_pattern("blocking") == parse_pattern("ssgd") == Pattern("blocking")
    assert parse_pattern("averaging:5") == parse_pattern("localsgd:5") == Pattern("averaging", 5)
    assert parse_pattern("step") == parse_pattern("odsgd") == Pattern("step")
    assert parse_pattern("servers:2") == parse_pattern("asgd:2") == Pattern("servers", 2)
    with pytest.raises(UserError, match="--patterns: 'ssd' is not understood"):   # two patterns: say which
        parse_pattern("ssd")
    assert [Pattern(*p).name for p in (("none",), ("blocking",), ("step",), ("period", 5), ("averaging", 5),
                                      ("servers", 1))] == \
        ["compute only", "ssgd", "ssd step (odsgd)", "ssd period k=5", "localsgd k=5", "asgd 1 server"]
    kinds = {registry.ALGORITHMS["ssd"].pattern(registry.Run(comm=c))[0] for c in ("step", "period")}
    kinds |= {spec.pattern(registry.Run())[0] for name, spec in registry.ALGORITHMS.items() if name != "ssd"}
    assert kinds == set(PATTERNS) - {"none"}


@pytest.mark.parametrize("flags, message", [
    (["--ranks", "1"], "--ranks"),
    (["--net", "fast"], "--net"),
    (["--fit-sizes", "4,4"], "two distinct"),
    (["--fit-sizes", "1,-4"], "--fit-sizes"),
    (["--patterns", "period:0"], "--patterns"),
    (["--plan-efficiency", "1.5"], "--plan-efficiency"),
])
def test_bad_arguments_are_one_line_errors(flags, message):
    result = run_cli(["bench", "model", *flags])
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ssdmpi: error:") and message in lines[0], result.stderr


def test_a_real_two_rank_run_on_shared_memory(tmp_path):
    """End to end: relaunches itself under mpiexec -n 2, measures, fits, reports (small sizes, mlp)."""
    out = tmp_path / "model.json"
    result = run_cli(["bench", "model", "--net", "none", "--model", "mlp", "--batch-size", "16",
                      "--fit-sizes", "0.05,0.2", "--check-sizes", "0.1", "--patterns", "ssgd,period:2",
                      "--steps", "4", "--allreduce-repeats", "2", "--plan-ranks", "2,4", "--plan-gbits", "10",
                      "--json", str(out)], timeout=240)
    assert result.returncode == 0, result.stderr
    assert "| ssd period k=2 |" in result.stdout and "held out (model size)" in result.stdout
    data = json.loads(out.read_text())
    assert data["measured"]["ranks"] == 2
    assert data["format"] == "ssdmpi-bench-result/1" and data["benchmark"] == "model"
    assert data["command"].startswith("ssdmpi bench model --net none --model mlp")
    assert set(data["measured"]["step_s"]) == {"compute only", "ssgd", "ssd period k=2"}
    assert all(t > 0 for t in data["measured"]["allreduce_s"].values())
    assert len(data["model"]["plan"]) == 2


def test_a_slurm_batch_shell_is_not_a_launcher_but_an_srun_step_is(monkeypatch):
    from ssdmpi.bench.launch import under_launcher as _under_launcher

    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    assert not _under_launcher()
    monkeypatch.setenv("SLURM_PROCID", "0")         # set in the batch script's own shell too
    assert not _under_launcher()
    monkeypatch.setenv("SLURM_STEP_ID", "0")        # only an srun step has a numeric step id
    assert _under_launcher()
    monkeypatch.delenv("SLURM_STEP_ID")
    monkeypatch.setenv("PMI_RANK", "1")
    assert _under_launcher()
