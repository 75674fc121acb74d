"""The config layer turns a TrainConfig into the algorithm's and the communicator's settings."""

import argparse

import pytest

from ssdmpi import config
from ssdmpi.errors import UserError
from ssdmpi.optim.schedules import schedule_in_steps


def resolve(*argv):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    args = parser.parse_args(list(argv))
    return config.resolve(args), config.soft_settings(args)


def test_cifar10_preset_schedules_are_converted_from_epochs_to_steps():
    cfg, soft = resolve("--preset", "cifar10-resnet20")
    E = 97    # 50,000 images / (4 ranks x 128)
    algo = config.algo_config(cfg, soft, E, 160 * E, world_size=4)
    assert algo.lr_schedule == {"kind": "multistep", "milestones": [80 * E, 120 * E], "gamma": 0.1}
    assert algo.local_lr_schedule == {"kind": "multistep", "milestones": [75 * E, 115 * E], "gamma": 0.1}
    assert (algo.algo, algo.delay, algo.comm, algo.local_update) == ("ssd", 5, "step", "glu-paper")
    assert (algo.local_lr, algo.glu_divisor, algo.warmup_steps) == (1.6, 12.0, 500)
    assert algo.global_schedule()(80 * E - 1) == pytest.approx(0.4)
    assert algo.global_schedule()(80 * E) == pytest.approx(0.04)


@pytest.mark.parametrize("spec, expected", [
    ("constant", {"kind": "constant"}),
    ("cosine", {"kind": "cosine"}),
    ("poly:3", {"kind": "poly", "power": 3.0}),
    ("step:0.01:0.5", {"kind": "step", "every": 1, "gamma": 0.5}),      # at least one step
    ("step:2.5", {"kind": "step", "every": 25, "gamma": 0.1}),
    ("multistep:1.5,3", {"kind": "multistep", "milestones": [15, 30], "gamma": 0.1}),
])
def test_schedule_in_steps(spec, expected):
    assert schedule_in_steps(spec, steps_per_epoch=10) == expected


def test_preset_algorithm_settings_that_do_not_apply_are_dropped():
    cfg, soft = resolve("--preset", "cifar10-resnet20", "--algo", "ssgd")
    algo = config.algo_config(cfg, soft, 97, 970, world_size=4)
    assert algo.algo == "ssgd" and algo.local_update is None and algo.delay is None


def test_the_users_own_inapplicable_settings_are_errors():
    cfg, soft = resolve("--algo", "ssgd", "--delay", "3")
    with pytest.raises(UserError, match="--delay does not apply to --algo ssgd"):
        config.algo_config(cfg, soft, 10, 100, world_size=2)


def test_warmup_epochs_and_lr_warmup_are_converted_with_the_epoch_length():
    cfg, soft = resolve("--warmup-epochs", "1.5", "--lr-warmup-epochs", "0.5", "--lr-schedule", "cosine")
    algo = config.algo_config(cfg, soft, 20, 400, world_size=2)
    assert algo.warmup_steps == 30 and algo.lr_warmup_steps == 10 and algo.total_steps == 400


def test_default_local_lr_is_world_size_times_lr():
    cfg, soft = resolve("--comm", "step", "--local-update", "sgd", "--lr", "0.05")
    assert config.algo_config(cfg, soft, 10, 100, world_size=4).local_lr == pytest.approx(0.2)


def test_resolved_settings_record_the_algorithms_defaults():
    cfg, soft = resolve()
    algo = config.algo_config(cfg, soft, 22, 440, world_size=4)
    out = config.resolved_settings(cfg, algo)
    assert (out.delay, out.comm, out.period_rule, out.merge_delay, out.local_update, out.warmup_steps) == \
        (5, "period", "delta-merge", 1, None, 50)
    assert cfg.delay is None     # the input is not modified


def test_resolved_settings_keep_warmup_epochs():
    cfg, soft = resolve("--warmup-epochs", "2")
    out = config.resolved_settings(cfg, config.algo_config(cfg, soft, 10, 100, world_size=2))
    assert out.warmup_epochs == 2.0 and out.warmup_steps is None


def test_communicator_options_carry_the_runtime_settings():
    cfg, _ = resolve("--progress", "thread", "--transport", "host", "--bucket-size", "4M", "--stall-timeout", "9")
    assert config.communicator_options(cfg) == {"progress": "thread", "transport": "host", "stall_timeout": 9.0,
                                                "bucket_bytes": 4 << 20}
    cfg, _ = resolve()
    assert config.communicator_options(cfg)["bucket_bytes"] is None     # one fused buffer


@pytest.mark.parametrize("value", ["0", "-1K", "lots"])
def test_bad_bucket_size_is_an_error(value, tmp_path):
    with pytest.raises((UserError, SystemExit)):
        resolve("--bucket-size", value)
    path = tmp_path / "run.yaml"
    path.write_text(f"bucket_size: {value}\n")
    with pytest.raises(UserError, match="bucket-size|size"):
        resolve("--config", str(path))


def test_bucket_size_in_a_file_takes_suffixes(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("bucket-size: 64K\n")
    cfg, _ = resolve("--config", str(path))
    assert cfg.bucket_size == 64 << 10
