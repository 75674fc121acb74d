"""``ssdmpi bench engine``: runs end to end on tiny settings and reports what it promises.

The real measurement (batch 128, many repeats) is for people, not CI; here the
point is that the harness runs both engines, interleaves them, and reports
medians, the ratio and peak memory. ``measure`` runs in-process (PyTorch takes
seconds to import, once); one CLI run checks the text report and exit codes.
"""

import json

import pytest

from ssdmpi.verify.torch_ref import torch_available

HAVE_TORCH, WHY = torch_available()
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason=f"PyTorch (the benchmark peer) unavailable: {WHY}")


@needs_torch
@pytest.mark.parametrize("model", ["mlp", "lenet5", "resnet20", "gpt"])
def test_measure_reports_medians_ratio_and_memory(model):
    from ssdmpi.bench.engine import measure

    report = measure(model, batch=4 if model != "gpt" else 2, repeats=2, warmup=1, memory=model != "resnet20")
    if model == "gpt":      # batch 2 x 128 tokens
        assert report["tokens_per_step"] == 256 and report["target_ratio"] == 1.3
        assert report["memory_ratio_target"] == 1.5 and report["memory_ratio_target_met"] is None
        report["batch"] = 4
    json.dumps(report)                                   # JSON-ready
    assert report["model"] == model and report["batch"] == 4 and report["repeats"] == 2
    assert report["ssdmpi_median_s"] > 0 and report["torch_median_s"] > 0
    assert report["ratio"] == pytest.approx(report["ssdmpi_median_s"] / report["torch_median_s"])
    assert report["target_met"] is None                  # targets apply at the default batch only
    assert "1 thread" in report["threads"] or "env" in report["threads"]
    if model != "resnet20":
        assert 0 < report["peak_memory_bytes"] < 2**30
        # PyTorch's allocator held at least its parameters and their gradients (float32)
        assert 2 * 4 * report["num_params"] <= report["torch_peak_memory_bytes"] < 2**30
        assert report["memory_ratio"] == pytest.approx(report["peak_memory_bytes"] / report["torch_peak_memory_bytes"])
    else:
        assert "peak_memory_bytes" not in report and "torch_peak_memory_bytes" not in report
    assert report["num_params"] == {"mlp": 669706, "lenet5": 61706, "resnet20": 269722, "gpt": 1853568}[model]


@needs_torch
def test_cli_text_report(cli):
    result = cli(["bench", "engine", "--model", "mlp", "--batch-size", "4", "--repeats", "1", "--warmup", "0"],
                 timeout=300)
    assert result.returncode == 0, result.stderr
    for needle in ("engine benchmark: mlp", "ssdmpi  median", "torch   median", "ratio ssdmpi/torch",
                   "peak memory of one ssdmpi step"):
        assert needle in result.stdout, result.stdout


@needs_torch
def test_cli_text_report_of_gpt(cli):
    result = cli(["bench", "engine", "--model", "gpt", "--batch-size", "1", "--repeats", "1", "--warmup", "0"],
                 timeout=300)
    assert result.returncode == 0, result.stderr
    for needle in ("engine benchmark: gpt", "1,853,568 parameters, batch 1 x 128 tokens", "ratio ssdmpi/torch",
                   "peak memory of one ssdmpi step", "peak memory of one torch step (its allocator, torch.profiler)",
                   "(target <= 1.5: n/a at this batch size)"):
        assert needle in result.stdout, result.stdout
    assert "profiler_start" not in result.stderr


@pytest.mark.parametrize("missed", ["target_met", "memory_target_met", "memory_ratio_target_met"])
def test_check_exits_1_on_any_missed_target(monkeypatch, missed):
    from ssdmpi.bench import engine
    from ssdmpi.cli import build_parser

    measured = {"model": "gpt", "batch": 32, "target_met": True, "memory_target_met": None,
                "memory_ratio_target_met": True, missed: False}
    monkeypatch.setattr(engine, "measure", lambda *a, **k: dict(measured))
    args = build_parser().parse_args(["bench", "engine", "--model", "gpt", "--check", "--json", "-"])
    assert args.run(args) == 1
    args = build_parser().parse_args(["bench", "engine", "--model", "gpt", "--json", "-"])
    assert args.run(args) == 0


@needs_torch
def test_json_flag_prints_one_object(capsys):
    from ssdmpi.cli import build_parser

    args = build_parser().parse_args(["bench", "engine", "--model", "lenet5", "--batch-size", "2", "--repeats", "1",
                                      "--warmup", "0", "--no-memory", "--json", "-"])
    assert args.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "lenet5" and report["batch"] == 2


def test_bad_arguments_exit_2(cli):
    result = cli(["bench", "engine", "--model", "mlp", "--batch-size", "0"], timeout=300)
    assert result.returncode == 2 and "must be at least 1" in result.stderr
    result = cli(["bench", "engine", "--model", "vgg"], timeout=300)
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_missing_torch_is_a_user_error(monkeypatch):
    from ssdmpi.bench import engine
    from ssdmpi.errors import UserError
    from ssdmpi.verify import torch_ref

    monkeypatch.setattr(torch_ref, "torch_available", lambda: (False, "PyTorch not importable (test)"))
    with pytest.raises(UserError, match="compares against PyTorch, which is missing"):
        engine.measure("mlp", batch=2, repeats=1)
