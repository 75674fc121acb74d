"""``ssdmpi bench train``: variants, launch commands, results tables from synthetic runs, bad input.

No real training here: run directories are written by the test (``write_run``) and the
command parses them with ``--reuse``.
"""

import csv
import io
import json

import pytest

from tests.conftest import run_cli
from tests.unit.test_plot import write_run


def test_variant_specs_and_their_train_flags():
    from ssdmpi.bench.variants import parse_variant

    v = parse_variant("ssd:period:5")
    assert (v.name, v.train_flags()) == ("ssd-period-k5", ["--algo", "ssd", "--comm", "period", "--delay", "5"])
    assert parse_variant("ssgd").train_flags() == ["--algo", "ssgd"]
    assert parse_variant("odsgd").train_flags() == ["--algo", "odsgd"]
    assert parse_variant("localsgd:10").train_flags() == ["--algo", "localsgd", "--delay", "10"]


def test_default_variants_cover_every_algorithm_for_every_k():
    from ssdmpi.bench.variants import default_variants

    names = [v.name for v in default_variants([2, 5])]
    assert names == ["ssgd", "ssd-period-k2", "ssd-period-k5", "ssd-step-k2", "ssd-step-k5", "odsgd",
                     "localsgd-k2", "localsgd-k5"]


def test_dry_run_prints_throttled_mpiexec_commands(tmp_path):
    result = run_cli(["bench", "train", "--out", str(tmp_path / "b"), "--variants", "ssgd,ssd:period:5",
                      "--epochs", "3", "--train-args", "--log-every 5", "--dry-run"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert "ssdmpi-netns --rate 1gbit -- " in lines[0] and "mpiexec -n 2 " in lines[0]
    assert "-m ssdmpi train --run-dir " + str(tmp_path / "b" / "runs" / "ssgd") in lines[0]
    assert "--epochs 3" in lines[0] and lines[0].endswith("--algo ssgd --log-every 5")
    assert lines[1].endswith("--algo ssd --comm period --delay 5 --log-every 5")
    assert not (tmp_path / "b").exists()   # a dry run writes nothing


def test_train_subset_writes_a_small_hdf5_dataset_with_the_whole_test_split(tmp_path):
    import argparse

    from ssdmpi.bench.runner import launch_command, write_subset
    from ssdmpi.bench.variants import parse_variant
    from ssdmpi.data.datasets import load_raw

    args = argparse.Namespace(out=str(tmp_path), dataset="digits", train_subset=100, model="mlp", batch_size=8,
                              lr=0.1, warmup_steps=5, seed=0, steps=None, epochs=2, train_args="", ranks=2,
                              net="none")
    path = write_subset(args)
    full, subset = load_raw("digits"), load_raw("hdf5", str(path))
    assert len(subset.train_labels) == 100 and (subset.train_images == full.train_images[:100]).all()
    assert (subset.test_labels == full.test_labels).all()
    cmd = launch_command(parse_variant("ssgd"), tmp_path / "runs" / "ssgd", args)
    assert cmd[cmd.index("--dataset") + 1] == "hdf5" and cmd[cmd.index("--data-path") + 1] == str(path)


def test_default_results_directory_is_timestamped_under_runs(tmp_path):
    result = run_cli(["bench", "train", "--variants", "ssgd", "--dry-run"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"--run-dir {tmp_path.resolve()}/runs/bench-train-" in result.stdout and "/runs/ssgd " in result.stdout


def test_relative_out_is_relative_to_the_callers_directory(tmp_path):
    # Runs are launched from the repository root; a relative --out must still land here.
    result = run_cli(["bench", "train", "--out", "mybench", "--variants", "ssgd", "--dry-run"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"--run-dir {tmp_path.resolve()}/mybench/runs/ssgd " in result.stdout


def test_net_none_runs_plain_mpiexec(tmp_path):
    result = run_cli(["bench", "train", "--out", str(tmp_path), "--variants", "ssgd", "--net", "none",
                      "--dry-run", "--ranks", "4"])
    assert result.returncode == 0, result.stderr
    assert "ssdmpi-netns" not in result.stdout and "mpiexec -n 4 " in result.stdout


def synthetic_bench(out):
    """Run directories as a real bench would leave them: ssgd slow, ssd period fast, one failed run."""
    runs = out / "runs"
    # ssgd: 200 samples/s, 10 s per epoch; ends at 86%.
    write_run(runs / "ssgd", algo="ssgd", sps=200.0, step_time=0.5, final_acc=0.86)
    # ssd period k=5: 2.5x the samples/s; ends at 85.7% (reaches the 85.5% target at epoch 3).
    write_run(runs / "ssd-period-k5", algo="ssd", comm="period", k=5, sps=500.0, step_time=0.2, final_acc=0.857)
    return ["ssgd", "ssd-period-k5"]


def test_results_from_existing_runs_table_csv_and_figures(tmp_path):
    synthetic_bench(tmp_path)
    result = run_cli(["bench", "train", "--out", str(tmp_path), "--variants", "ssgd,ssd:period:5", "--reuse"])
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
    assert [r["name"] for r in rows] == ["ssgd", "ssd-period-k5"]
    ssgd, ssd = rows
    assert float(ssd["speedup"]) == pytest.approx(2.5)
    assert float(ssgd["speedup"]) == pytest.approx(1.0)
    assert float(ssd["final_acc"]) == pytest.approx(85.7)
    assert float(ssd["acc_delta"]) == pytest.approx(-0.3)
    # write_run logs 20 steps per epoch, 3 epochs; the target (85.5%) is first reached at the last
    # evaluation: ssd at 60 * 0.2 = 12 s, ssgd at 60 * 0.5 = 30 s (its whole wall time).
    assert float(ssd["tta_s"]) == pytest.approx(12.0)
    assert float(ssd["tta_ratio"]) == pytest.approx(0.4)
    assert float(ssgd["wall_s"]) == pytest.approx(30.0)
    # per-step interval totals: write_run logs every step, so per-step means are the logged values
    assert float(ssd["compute_ms"]) == pytest.approx(4.0)
    assert float(ssd["wait_ms"]) == pytest.approx(1.0)
    assert float(ssd["mb_per_step"]) == pytest.approx(0.004096)
    md = (tmp_path / "results.md").read_text()
    assert "| ssd-period-k5 | ssd | period | 5 | 500.0 | 2.50x |" in md
    assert "speedup vs ssgd" in md and "time to target s" in md
    assert "| ssd-period-k5 |" in result.stdout
    assert (tmp_path / "figures" / "accuracy_vs_time.png").stat().st_size > 10_000


def test_per_step_means_weight_each_record_by_the_steps_it_covers(tmp_path):
    from ssdmpi.bench.rows import run_metrics
    from ssdmpi.rundir import load_run

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    records = [  # per-step means over each logging interval; the warm-up interval is left out
        {"kind": "start", "config": {"algo": "ssd", "comm": "period", "delay": 5}},
        {"kind": "step", "step": 10, "stage": "warmup", "compute_s": 1.0, "wait_s": 9.0, "bytes_sent": 100,
         "samples_per_s": 10},
        {"kind": "step", "step": 20, "stage": "delay", "compute_s": 0.05, "wait_s": 0.01, "bytes_sent": 4,
         "samples_per_s": 100},
        {"kind": "checkpoint", "step": 20, "path": "x.h5"},
        {"kind": "step", "step": 25, "stage": "delay", "compute_s": 0.08, "wait_s": 0.04, "bytes_sent": 0,
         "samples_per_s": 300},
        {"kind": "eval", "step": 25, "epoch": 1, "time": 5.0, "train_s": 4.0, "test_acc": 0.5},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = load_run(run_dir)
    assert run.label == "ssd period k=5" and len(run.steps) == 3
    m = run_metrics(run)
    assert m["compute_s"] == pytest.approx((10 * 0.05 + 5 * 0.08) / 15)
    assert m["wait_s"] == pytest.approx((10 * 0.01 + 5 * 0.04) / 15)
    assert m["bytes_sent"] == pytest.approx(40 / 15)
    assert m["samples_per_s"] == pytest.approx(150.0)   # harmonic mean of the delay-stage records
    assert m["wall_s"] == 4.0   # training time: the evaluations' and checkpoints' seconds left out
    assert m["final_acc"] == 0.5


def test_ssgd_is_warm_up_forever_so_all_its_records_count(tmp_path):
    from ssdmpi.bench.rows import run_metrics
    from ssdmpi.rundir import load_run

    run_dir = tmp_path / "ssgd"
    run_dir.mkdir()
    records = [{"kind": "step", "step": s, "stage": "warmup", "compute_s": 0.01 * s, "samples_per_s": 100}
               for s in (10, 20)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    m = run_metrics(load_run(run_dir))
    assert m["compute_s"] == pytest.approx(0.15) and m["samples_per_s"] == pytest.approx(100)


def test_a_failed_variant_is_reported_in_the_table_and_exits_1(tmp_path):
    from ssdmpi.bench.rows import summarise
    from ssdmpi.bench.tables import markdown_table
    from ssdmpi.bench.variants import parse_variant

    rows = summarise([parse_variant("ssgd"), parse_variant("odsgd")], {"odsgd": "failed (exit 1)"})
    assert rows[0]["status"] == "not run" and rows[1]["status"] == "failed (exit 1)"
    assert "| odsgd | odsgd |  | 1 |" in markdown_table(rows)


def test_existing_run_directory_is_not_overwritten(tmp_path):
    synthetic_bench(tmp_path)
    before = (tmp_path / "runs" / "ssgd" / "metrics.jsonl").read_text()
    result = run_cli(["bench", "train", "--out", str(tmp_path), "--variants", "ssgd", "--net", "none"])
    assert result.returncode == 2 and "already exists" in result.stderr and "--reuse" in result.stderr
    assert (tmp_path / "runs" / "ssgd" / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("flags, message", [
    (["--variants", "ssd:sometimes:5"], "--variants"),
    (["--variants", "ssd:period:0"], "--variants"),
    (["--variants", "ssgd,ssgd"], "twice"),
    (["--delays", "5,x"], "--delays"),
    (["--ranks", "0"], "--ranks"),
    (["--repeats", "0"], "--repeats"),
    (["--net", "fast"], "--net"),
    (["--train-args", "'unclosed"], "--train-args"),
    (["--train-subset", "0"], "--train-subset"),
    (["--dataset", "devils-dictionary", "--train-subset", "100"], "--steps"),
    (["--preset", "no-such-preset"], "unknown preset"),
    (["--target-rise", "-1"], "--target-rise"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, flags, message):
    result = run_cli(["bench", "train", "--out", str(tmp_path / "o"), "--dry-run", *flags])
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ssdmpi: error:") and message in lines[0], result.stderr


def test_throttled_network_without_root_or_iproute2_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    from ssdmpi.bench import launch as train  # the launcher checks of every bench module
    from ssdmpi.cli import main
    from ssdmpi.errors import UserError

    train.check_network("none")   # shared memory needs nothing
    monkeypatch.setattr(train, "NETNS", tmp_path / "no-launcher")
    with pytest.raises(UserError, match="no-launcher"):
        train.check_network("1gbit")
    launcher = tmp_path / "ssdmpi-netns"
    launcher.write_text("#!/bin/sh\n")
    monkeypatch.setattr(train, "NETNS", launcher)
    monkeypatch.setattr(train.os, "geteuid", lambda: 1000)
    assert main(["bench", "train", "--out", str(tmp_path / "o"), "--variants", "ssgd"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs root" in err[0] and "--net none" in err[0]
    assert not (tmp_path / "o").exists()
    monkeypatch.setattr(train.os, "geteuid", lambda: 0)
    monkeypatch.setattr(train.shutil, "which", lambda tool: None)
    with pytest.raises(UserError, match="iproute2"):
        train.check_network("1gbit")


def test_a_preset_sets_the_job_and_flags_given_override_it(tmp_path):
    result = run_cli(["bench", "train", "--out", str(tmp_path / "b"), "--preset", "text-gpt", "--variants",
                      "ssgd", "--net", "none", "--lr", "0.001", "--dry-run"])
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    # the preset's own settings (ssdmpi/presets/text-gpt.yaml), the given lr in place of its 0.003
    assert "--preset text-gpt --dataset devils-dictionary --model gpt --batch-size 8 --lr 0.001" in line
    assert "--warmup-steps 100" in line and "--steps 600" in line and "--epochs" not in line
    result = run_cli(["bench", "train", "--out", str(tmp_path / "c"), "--variants", "ssgd", "--net", "none",
                      "--dry-run"])
    line = result.stdout.strip()   # no preset: the communication-bound defaults
    assert "--preset" not in line and "--dataset fashion-mnist --model wide-mlp --batch-size 32 --lr 0.05" in line
    assert "--warmup-steps 20" in line and "--epochs 3" in line


def _language_model_run(run_dir, algo, tokens_per_s, losses, seconds, **config):
    """A language model's run directory: delay-stage step records at ``tokens_per_s`` (context 128) and one
    evaluation per entry of ``losses`` at the matching training second of ``seconds``."""
    run_dir.mkdir(parents=True)
    records = [{"kind": "start", "config": {"algo": algo, **config}}]
    records += [{"kind": "step", "step": 10 * i, "stage": "delay" if algo != "ssgd" else "warmup",
                 "samples_per_s": tokens_per_s / 128, "tokens_per_s": tokens_per_s, "compute_s": 0.01}
                for i in (1, 2, 3)]
    records += [{"kind": "eval", "step": 10 * (i + 1), "train_s": t, "val_loss": loss, "val_ppl": 2.718 ** loss}
                for i, (loss, t) in enumerate(zip(losses, seconds))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_language_models_table_has_tokens_per_s_and_validation_loss(tmp_path):
    _language_model_run(tmp_path / "runs" / "ssgd", "ssgd", 1000.0, [3.0, 2.5, 2.0], [10.0, 20.0, 30.0])
    _language_model_run(tmp_path / "runs" / "ssd-period-k5", "ssd", 3000.0, [3.1, 2.2, 2.01], [4.0, 8.0, 12.0],
                        comm="period", delay=5)
    result = run_cli(["bench", "train", "--out", str(tmp_path), "--variants", "ssgd,ssd:period:5", "--reuse"])
    assert result.returncode == 0, result.stderr
    ssgd, ssd = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
    assert float(ssd["tokens_per_s"]) == pytest.approx(3000.0) and float(ssd["speedup"]) == pytest.approx(3.0)
    assert float(ssd["final_loss"]) == pytest.approx(2.01)
    assert float(ssd["loss_delta_pct"]) == pytest.approx(0.5)        # 2.01 / 2.0 - 1
    # the target is ssgd's final loss + 1% = 2.02: ssd reaches it at its last evaluation (12 s), ssgd at 30 s
    assert float(ssd["tta_s"]) == pytest.approx(12.0) and float(ssd["tta_ratio"]) == pytest.approx(0.4)
    assert "final_acc" not in ssgd and "samples_per_s" not in ssgd
    md = (tmp_path / "results.md").read_text()
    assert "| tokens/s |" in md and "| final val loss |" in md and "val loss vs ssgd %" in md
    assert "| ssd-period-k5 | ssd | period | 5 | 3000 | 3.00x |" in md and "| 2.0100 | +0.50 |" in md
    result_rows = json.loads((tmp_path / "result.json").read_text())["rows"]
    assert result_rows[1]["final_loss"] == pytest.approx(2.01) and "final_acc" not in result_rows[1]
