"""The config layer resolves a run once (defaults < preset < file < flags, each value's source known) and
turns the frozen TrainConfig into the algorithm's and the communicator's settings without resolving again."""

import argparse
import dataclasses

import pytest

from ssdmpi import config
from ssdmpi.errors import UserError
from ssdmpi.optim.schedules import schedule_in_steps


def resolve(*argv):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    args = parser.parse_args(list(argv))
    return config.resolve(args), None


def test_cifar10_preset_schedules_are_converted_from_epochs_to_steps():
    cfg, soft = resolve("--preset", "cifar10-resnet20")
    E = 97    # 50,000 images / (4 ranks x 128)
    algo = config.algo_config(cfg, E, 160 * E, world_size=4)
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
    algo = config.algo_config(cfg, 97, 970, world_size=4)
    assert algo.algo == "ssgd" and algo.local_update is None and algo.delay is None


def test_the_users_own_inapplicable_settings_are_errors():
    with pytest.raises(UserError, match="--delay does not apply to --algo ssgd"):
        resolve("--algo", "ssgd", "--delay", "3")


def test_warmup_epochs_and_lr_warmup_are_converted_with_the_epoch_length():
    cfg, soft = resolve("--warmup-epochs", "1.5", "--lr-warmup-epochs", "0.5", "--lr-schedule", "cosine")
    algo = config.algo_config(cfg, 20, 400, world_size=2)
    assert algo.warmup_steps == 30 and algo.lr_warmup_steps == 10 and algo.total_steps == 400


def test_default_local_lr_is_world_size_times_lr():
    cfg, soft = resolve("--comm", "step", "--local-update", "sgd", "--lr", "0.05")
    assert config.algo_config(cfg, 10, 100, world_size=4).local_lr == pytest.approx(0.2)


def test_the_resolved_config_holds_the_algorithms_defaults_and_is_frozen():
    cfg, _ = resolve()
    assert (cfg.delay, cfg.comm, cfg.period_rule, cfg.merge_delay, cfg.local_update, cfg.warmup_steps) == \
        (5, "period", "delta-merge", 1, None, 50)
    assert (cfg.optimizer, cfg.momentum, cfg.weight_decay) == ("sgd", 0.9, 1e-4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 0.5
    algo = config.algo_config(cfg, 22, 440, world_size=4)
    assert algo.resolved and config.recorded(cfg, algo) == cfg


def test_the_record_keeps_warmup_epochs():
    cfg, _ = resolve("--warmup-epochs", "2")
    out = config.recorded(cfg, config.algo_config(cfg, 10, 100, world_size=2))
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


def test_a_file_value_that_does_not_apply_is_left_out_with_a_note(tmp_path):
    """A saved config reused for another algorithm: its settings of the first one are left out (a note
    naming the file and the keys), the same values given as flags are refused."""
    path = tmp_path / "my.yaml"
    path.write_text("algo: ssgd\ndelay: 5\ncomm: period\nlr: 0.05\n")
    resolved = config.resolve_request(config.Request(config_file=str(path)))
    cfg = resolved.config
    assert cfg.algo == "ssgd" and cfg.delay is None and cfg.comm is None and cfg.lr == 0.05
    assert resolved.dropped == {"delay", "comm"}
    assert resolved.note() == (f"left out, not used by --algo ssgd: {path}: delay, comm (ssdmpi train --print-config "
                               "says why)")
    assert any(n.startswith(f"{path}: delay: 5 left out (--delay does not apply to --algo ssgd")
               for n in resolved.notes)
    with pytest.raises(UserError, match="--delay does not apply to --algo ssgd"):
        config.resolve_request(config.Request(flags={"algo": "ssgd", "delay": 5}))


def test_a_checkpoints_config_reused_for_localsgd_leaves_out_the_schedule(tmp_path):
    old = config.resolve(argparse.Namespace()).to_dict()           # ssd --comm period, as config.yaml records it
    path = tmp_path / "config.yaml"
    path.write_text(config.TrainConfig(**{**old, "widths": [128]}).to_yaml())
    resolved = config.resolve_request(config.Request(flags={"algo": "localsgd"}, config_file=str(path)))
    assert resolved.config.algo == "localsgd" and resolved.config.delay == 5
    assert {"comm", "period_rule", "merge_delay", "merge_momentum"} <= resolved.dropped


@pytest.mark.parametrize("text, needle", [("lr: -1\n", "lr must be > 0.0, got -1"),
                                          ("delay: zero\n", "delay must be a positive integer or auto"),
                                          ("comm: often\n", "comm")])
def test_an_error_for_a_file_value_names_the_file_and_the_key(tmp_path, text, needle):
    path = tmp_path / "my.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        config.resolve_request(config.Request(config_file=str(path)))
    message = str(err.value)
    assert message.startswith(f"{path}: ") and needle in message and "--" not in message.split(":", 1)[1][:12]
