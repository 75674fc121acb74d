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
@pytest.mark.parametrize("model", ["mlp", "lenet5", "resnet20"])
def test_measure_reports_medians_ratio_and_memory(model):
    from ssdmpi.bench.engine import measure

    report = measure(model, batch=4, repeats=2, warmup=1, memory=model != "resnet20")
    json.dumps(report)                                   # JSON-ready
    assert report["model"] == model and report["batch"] == 4 and report["repeats"] == 2
    assert report["ssdmpi_median_s"] > 0 and report["torch_median_s"] > 0
    assert report["ratio"] == pytest.approx(report["ssdmpi_median_s"] / report["torch_median_s"])
    assert report["target_met"] is None                  # targets apply at the default batch only
    assert "1 thread" in report["threads"] or "env" in report["threads"]
    if model != "resnet20":
        assert 0 < report["peak_memory_bytes"] < 2**30
    else:
        assert "peak_memory_bytes" not in report
    assert report["num_params"] == {"mlp": 669706, "lenet5": 61706, "resnet20": 269722}[model]


@needs_torch
def test_cli_text_report(cli):
    result = cli(["bench", "engine", "--model", "mlp", "--batch-size", "4", "--repeats", "1", "--warmup", "0"],
                 timeout=300)
    assert result.returncode == 0, result.stderr
    for needle in ("engine benchmark: mlp", "ssdmpi  median", "torch   median", "ratio ssdmpi/torch",
                   "peak memory of one ssdmpi step"):
        assert needle in result.stdout, result.stdout


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
