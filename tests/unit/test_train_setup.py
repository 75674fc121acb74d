"""How the trainer turns a TrainConfig into the algorithm's settings (epochs -> steps, soft settings)."""

import argparse

import pytest

from ssdmpi import config
from ssdmpi.errors import UserError
from ssdmpi.run_setup import algo_config, resolved_config


def resolve(*argv):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    args = parser.parse_args(list(argv))
    return config.resolve(args), config.soft_settings(args)


def test_cifar10_preset_schedules_are_converted_from_epochs_to_steps():
    cfg, soft = resolve("--preset", "cifar10-resnet20")
    E = 97    # 50,000 images / (4 ranks x 128)
    algo = algo_config(cfg, soft, E, 160 * E, world_size=4)
    assert algo.lr_schedule == {"kind": "multistep", "milestones": [80 * E, 120 * E], "gamma": 0.1}
    assert algo.local_lr_schedule == {"kind": "multistep", "milestones": [75 * E, 115 * E], "gamma": 0.1}
    assert (algo.algo, algo.delay, algo.comm, algo.local_update) == ("ssd", 5, "step", "glu-paper")
    assert (algo.local_lr, algo.glu_divisor, algo.warmup_steps) == (1.6, 12.0, 500)
    assert algo.global_schedule()(80 * E - 1) == pytest.approx(0.4)
    assert algo.global_schedule()(80 * E) == pytest.approx(0.04)


def test_preset_algorithm_settings_that_do_not_apply_are_dropped():
    cfg, soft = resolve("--preset", "cifar10-resnet20", "--algo", "ssgd")
    algo = algo_config(cfg, soft, 97, 970, world_size=4)
    assert algo.algo == "ssgd" and algo.local_update is None and algo.delay is None


def test_the_users_own_inapplicable_settings_are_errors():
    cfg, soft = resolve("--algo", "ssgd", "--delay", "3")
    with pytest.raises(UserError, match="--delay does not apply to --algo ssgd"):
        algo_config(cfg, soft, 10, 100, world_size=2)


def test_warmup_epochs_and_lr_warmup_are_converted_with_the_epoch_length():
    cfg, soft = resolve("--warmup-epochs", "1.5", "--lr-warmup-epochs", "0.5", "--lr-schedule", "cosine")
    algo = algo_config(cfg, soft, 20, 400, world_size=2)
    assert algo.warmup_steps == 30 and algo.lr_warmup_steps == 10 and algo.total_steps == 400


def test_resolved_config_records_the_algorithms_defaults():
    cfg, soft = resolve()
    algo = algo_config(cfg, soft, 22, 440, world_size=4)
    out = resolved_config(cfg, algo)
    assert (out.delay, out.comm, out.period_rule, out.local_update, out.warmup_steps) == \
        (5, "period", "delta-own", None, 50)
    assert cfg.delay is None     # the input is not modified


def test_resumed_metrics_drop_records_logged_after_the_checkpoint(tmp_path):
    import json

    from ssdmpi.run_setup import trim_metrics

    path = tmp_path / "metrics.jsonl"
    lines = [{"kind": "start", "step": 0}, {"kind": "step", "step": 10}, {"kind": "checkpoint", "step": 20},
             {"kind": "step", "step": 20}, {"kind": "step", "step": 30}, {"kind": "eval", "step": 30}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "step", "st')   # cut by the crash
    trim_metrics(str(path), 20)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 10, 20, 20]


def test_run_directory_rules(tmp_path):
    import os

    from ssdmpi.run_setup import prepare_run_dir

    run = tmp_path / "run"
    prepare_run_dir(str(run), resuming=False)
    assert (run / "checkpoints").is_dir() and os.listdir(run) == ["checkpoints"]
    (run / "metrics.jsonl").write_text('{"kind": "start"}\n')
    with pytest.raises(UserError, match="already holds a run; continue it with --resume auto"):
        prepare_run_dir(str(run), resuming=False)
    # --resume auto found no checkpoint: the dead attempt's metrics are moved aside, not appended to
    prepare_run_dir(str(run), resuming=False, auto=True)
    assert not (run / "metrics.jsonl").exists()
    assert [p.name for p in run.iterdir() if p.name.startswith("metrics.jsonl.")]
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="cannot use run directory .*file/run"):
        prepare_run_dir(str(tmp_path / "file" / "run"), resuming=False)
