"""The training configuration: defaults < preset < YAML file < flags, and one-line errors."""

import argparse

import pytest

from ssdmpi import config
from ssdmpi.errors import UserError
from ssdmpi.optim.schedules import parse_schedule


def parse(*argv):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_no_arguments_resolve_to_the_default_preset():
    cfg = config.resolve(parse())
    preset = config.load_preset("default")
    assert cfg.dataset == "digits" and cfg.model == "mlp"
    for key, value in preset.items():
        assert getattr(cfg, key) == value


def test_flags_override_the_file_which_overrides_the_preset(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 0.3\nbatch-size: 64\nepochs: 7\n")
    cfg = config.resolve(parse("--config", str(path), "--epochs", "9"))
    assert cfg.lr == 0.3            # file beats preset (0.05)
    assert cfg.batch_size == 64     # dashes or underscores
    assert cfg.epochs == 9          # flag beats file
    assert cfg.model == "mlp"       # preset beats dataclass default


def test_named_preset_has_the_published_cifar10_settings():
    cfg = config.resolve(parse("--preset", "cifar10-resnet20"))
    assert (cfg.model, cfg.batch_size, cfg.epochs, cfg.lr, cfg.local_lr) == ("resnet20", 128, 160, 0.4, 1.6)
    assert parse_schedule(cfg.lr_schedule) == ("multistep", {"milestones": [80.0, 120.0], "gamma": 0.1})
    assert (cfg.momentum, cfg.weight_decay, cfg.delay, cfg.warmup_steps) == (0.9, 1e-4, 5, 500)


def test_warmup_epochs_from_a_flag_clears_the_presets_warmup_steps():
    cfg = config.resolve(parse("--warmup-epochs", "2"))
    assert cfg.warmup_steps is None and cfg.warmup_epochs == 2.0
    assert cfg.warmup_iterations(steps_per_epoch=30) == 60


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = config.resolve(parse("--lr", "0.02", "--widths", "64,32"))
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    again = config.resolve(parse("--config", str(path)))
    assert again == cfg


def test_each_value_says_where_it_came_from(tmp_path):
    (tmp_path / "c.yaml").write_text("lr: 0.3\n")
    sources = config.resolve_request(parse("--delay", "3", "--config", str(tmp_path / "c.yaml"))).sources
    assert sources["delay"] == "flag" and sources["lr"] == str(tmp_path / "c.yaml")
    assert sources["warmup_steps"] == "preset default" and sources["comm"] == "default"


@pytest.mark.parametrize("yaml_text, needle", [
    ("lr: 0.1\nlearning_rate: 0.2\n", "unknown setting 'learning_rate'"),
    ("- lr\n", "expected a mapping"),
    ("lr: [\n", "not valid YAML"),
])
def test_bad_config_files_are_one_line_errors(tmp_path, yaml_text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(UserError, match=needle.replace("[", r"\[")):
        config.resolve(parse("--config", str(path)))


def test_missing_config_file_and_unknown_preset():
    with pytest.raises(UserError, match="cannot read config file"):
        config.resolve(parse("--config", "/nonexistent/x.yaml"))
    with pytest.raises(UserError, match="unknown preset 'nope'; choose one of .*default"):
        config.resolve(parse("--preset", "nope"))


@pytest.mark.parametrize("argv, needle", [
    (["--algo", "sgd"], "--algo 'sgd' is not one of"),
    (["--comm", "ring"], "--comm 'ring'"),
    (["--local-update", "x"], "--local-update 'x'"),
    (["--batch-size", "0"], "--batch-size must be a positive integer"),
    (["--epochs", "-1"], "--epochs must be a positive integer"),
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--lr", "0"], "--lr must be > 0"),
    (["--lr", "nan"], "--lr must be a finite number"),
    (["--momentum", "1"], "--momentum must be < 1"),
    (["--weight-decay=-1e-4"], "--weight-decay must be >= 0"),
    (["--delay", "0"], "--delay must be a positive integer or auto"),
    (["--warmup-steps", "-5"], "--warmup-steps must be an integer >= 0"),
    (["--lr-schedule", "exp"], "--lr-schedule 'exp' is not understood"),
    (["--lr-schedule", "multistep:120,80"], "is not understood"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--progress", "spin"], "--progress 'spin'"),
    (["--transport", "x"], "--transport 'x'"),
    (["--dtype", "float16"], "--dtype 'float16'"),
    (["--augment", "rotate"], "unknown augmentation"),
    (["--keep-checkpoints", "-1"], "--keep-checkpoints must be an integer >= 0"),
    (["--log-every", "0"], "--log-every must be a positive integer"),
    (["--glu-divisor", "0"], "--glu-divisor must be > 0"),
    (["--stall-timeout", "0"], "--stall-timeout must be > 0"),
    (["--seed", "-1"], "--seed must be an integer >= 0"),
])
def test_each_bad_option_is_a_one_line_error_naming_it(argv, needle):
    with pytest.raises(UserError) as info:
        config.resolve(parse(*argv))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_bad_widths_is_an_error_at_parse_time():
    with pytest.raises(UserError, match="--widths"):
        parse("--widths", "64,x")


def test_resume_refuses_structural_changes_but_allows_longer_runs():
    old = config.resolve(parse()).to_dict()
    cfg = config.resolve(parse("--epochs", "40"), checkpoint_config=old)
    config.check_resume(old, cfg)             # more epochs: fine
    assert cfg.epochs == 40 and cfg.lr == old["lr"]
    cfg = config.resolve(parse("--model", "wide-mlp"), checkpoint_config=old)
    with pytest.raises(UserError, match="trained with model='mlp'"):
        config.check_resume(old, cfg)


def test_a_checkpoint_from_before_the_momentum_merge_resumes_without_it():
    """A delta-merge checkpoint whose config has no ``merge_momentum`` (written before the setting) ran
    without the momentum merge: it resumes with 0, and refuses 1; other algorithms are left alone."""
    old = config.resolve(parse()).to_dict()
    assert "merge_momentum" in old                       # every config written now records it
    del old["merge_momentum"]
    cfg = config.resolve(parse(), checkpoint_config=old)
    config.check_resume(old, cfg)
    assert cfg.merge_momentum == 0.0
    with pytest.raises(UserError, match="merge-momentum"):
        config.check_resume(old, config.resolve(parse("--merge-momentum", "1"), checkpoint_config=old))
    for flags in (("--algo", "localsgd"), ("--comm", "step"), ("--period-rule", "delta-own")):
        other = config.resolve(parse(*flags)).to_dict()
        del other["merge_momentum"]
        cfg = config.resolve(parse(), checkpoint_config=other)
        config.check_resume(other, cfg)
        assert cfg.merge_momentum is None, flags
    new = config.resolve(parse()).to_dict()             # written now, with the default: it stays the default
    assert config.resolve(parse(), checkpoint_config=new).merge_momentum == 1.0


@pytest.mark.parametrize("flags, needle", [
    (("--warmup-steps", "30"), "trained with --warmup-steps 10 but this run asks for --warmup-steps 30"),
    (("--warmup-steps", "5"), "trained with --warmup-steps 10 but this run asks for --warmup-steps 5"),
    (("--warmup-epochs", "1"), "trained with --warmup-steps 10 but this run asks for --warmup-epochs 1.0"),
])
def test_resume_refuses_a_moved_warmup(flags, needle):
    old = config.resolve(parse("--warmup-steps", "10")).to_dict()
    config.check_resume(old, config.resolve(parse(), checkpoint_config=old))    # unchanged: fine
    config.check_resume(old, config.resolve(parse("--warmup-steps", "10"), checkpoint_config=old))
    with pytest.raises(UserError) as info:
        config.check_resume(old, config.resolve(parse(*flags), checkpoint_config=old))
    assert needle in str(info.value) and "cannot move the switch" in str(info.value) and "\n" not in str(info.value)


def test_resume_refuses_a_warmup_in_epochs_changed_or_given_in_steps():
    old = config.resolve(parse("--warmup-epochs", "0.5")).to_dict()
    config.check_resume(old, config.resolve(parse("--warmup-epochs", "0.5"), checkpoint_config=old))
    for flags in (("--warmup-epochs", "2"), ("--warmup-steps", "10")):
        with pytest.raises(UserError, match="trained with --warmup-epochs 0.5 but"):
            config.check_resume(old, config.resolve(parse(*flags), checkpoint_config=old))


@pytest.mark.parametrize("schedule", ["cosine", "poly", "poly:3"])
def test_resume_refuses_another_length_under_a_length_dependent_schedule(schedule):
    old = config.resolve(parse("--lr-schedule", schedule, "--epochs", "20")).to_dict()
    config.check_resume(old, config.resolve(parse("--epochs", "20"), checkpoint_config=old))
    for flags, now in ((("--epochs", "40"), "--epochs 40"), (("--epochs", "10"), "--epochs 10"),
                       (("--steps", "5000"), "--steps 5000")):
        with pytest.raises(UserError) as info:
            config.check_resume(old, config.resolve(parse(*flags), checkpoint_config=old))
        text = str(info.value)
        assert f"--lr-schedule {schedule} spreads its decay over the whole run" in text and "\n" not in text
        assert f"trained for --epochs 20, and resuming it for {now}" in text and "keep --epochs 20" in text


def test_resume_allows_another_length_under_a_schedule_that_does_not_depend_on_it():
    for schedule in ("constant", "step:5", "multistep:5,8"):
        old = config.resolve(parse("--lr-schedule", schedule, "--epochs", "20")).to_dict()
        config.check_resume(old, config.resolve(parse("--epochs", "40"), checkpoint_config=old))
    # a schedule the user changes on resume is a change of their own (reported as such), not refused
    old = config.resolve(parse("--epochs", "20")).to_dict()
    config.check_resume(old, config.resolve(parse("--epochs", "40", "--lr-schedule", "cosine"), checkpoint_config=old))


def test_resume_refuses_another_length_under_a_length_dependent_local_schedule():
    args = ("--local-update", "glu-paper", "--comm", "step", "--local-lr-schedule", "cosine", "--steps", "300")
    old = config.resolve(parse(*args)).to_dict()
    with pytest.raises(UserError, match="--local-lr-schedule cosine spreads its decay"):
        config.check_resume(old, config.resolve(parse("--steps", "600"), checkpoint_config=old))


def test_resume_takes_settings_from_the_checkpoint_not_the_default_preset():
    old = config.resolve(parse("--lr", "0.01", "--stop-at-step", "5", "--run-dir", "/a")).to_dict()
    cfg = config.resolve(parse(), checkpoint_config=old)
    assert cfg.lr == 0.01
    assert cfg.stop_at_step is None and cfg.run_dir is None   # not inherited


@pytest.mark.parametrize("spec, expected", [
    ("constant", ("constant", {})),
    ("cosine", ("cosine", {})),
    ("poly", ("poly", {"power": 2.0})),
    ("step:30:0.5", ("step", {"every": 30.0, "gamma": 0.5})),
    ("multistep:80,120", ("multistep", {"milestones": [80.0, 120.0], "gamma": 0.1})),
])
def test_schedule_specs(spec, expected):
    assert parse_schedule(spec) == expected


def test_every_preset_is_valid():
    names = config.list_presets()
    assert {"default", "cifar10-resnet20"} <= set(names)
    for name in names:
        config.resolve(parse("--preset", name))


def _help_of(flag):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return next(a.help for a in parser._actions if flag in a.option_strings)


def test_help_states_the_default_a_run_without_the_flag_gets():
    """The values here are the defaults as documented (docs/ALGORITHM.md) and the default preset's file:
    written out, so that a changed default or a help that states another value fails."""
    assert _help_of("--warmup-steps").endswith("(default: 50, from the default preset; preset cifar10-resnet20, "
                                               "diloco, fashion-mnist-lenet5, fashion-mnist-mlp, streaming-diloco, "
                                               "text-gpt set their own)")
    assert _help_of("--widths").endswith("(default: 128, from the default preset; preset fashion-mnist-mlp sets "
                                         "its own)")
    assert _help_of("--momentum").endswith("(default: 0.9 with --optimizer sgd; set by preset cifar10-resnet20, "
                                           "fashion-mnist-lenet5, fashion-mnist-mlp)")
    assert _help_of("--weight-decay").endswith("(default: 0.0001 with --optimizer sgd; 0.1 with --optimizer adamw; "
                                               "set by preset cifar10-resnet20, diloco, fashion-mnist-lenet5, "
                                               "fashion-mnist-mlp, streaming-diloco, text-gpt)")
    assert _help_of("--stall-timeout").endswith("(default: 300.0)")
    assert _help_of("--delay").endswith("(default: 5 with --algo ssd or localsgd; odsgd: 1; set by preset "
                                        "cifar10-resnet20, diloco, fashion-mnist-lenet5, fashion-mnist-mlp, "
                                        "streaming-diloco)")
    assert _help_of("--servers").endswith("(default: 1 with --algo asgd)")
    assert _help_of("--glu-divisor").endswith("(default: 12 with --local-update glu-paper; set by preset "
                                              "cifar10-resnet20)")
    assert _help_of("--local-lr").endswith("(default: world size x lr; set by preset cifar10-resnet20)")
    for name in config.FIELD_NAMES:
        flag = "--no-progress-bar" if name == "progress_bar" else f"--{name.replace('_', '-')}"
        assert "(default: " in _help_of(flag), name


def test_the_help_of_a_preset_setting_names_the_presets_that_set_it():
    """``default_help`` on planted presets: the default preset's value wins, and the others are named."""
    presets = {"default": {"lr": 0.5}, "big": {"lr": 0.4, "epochs": 9}, "small": {"epochs": 2}}
    assert config.default_help("lr", presets) == "default: 0.5, from the default preset; preset big sets its own"
    assert config.default_help("epochs", presets) == "default: 20; set by preset big, small"
    assert config.default_help("seed", presets) == "default: 0"


def test_the_choices_in_the_help_are_the_registered_ones():
    assert "training algorithm: ssgd | ssd | asgd | localsgd | odsgd (default: ssd;" in _help_of("--algo")
    assert "delta-own | eager | replay" in _help_of("--period-rule")
    assert "global-momentum | glu-paper | sgd" in _help_of("--local-update")
    assert "inner optimizer of every step: sgd | adamw (default: sgd; set by preset diloco, streaming-diloco, " \
        "text-gpt)" in _help_of("--optimizer")


def test_the_default_preset_restates_no_default():
    """A setting of the default preset must differ from its declared default (else it states it twice)."""
    restated = {k: v for k, v in config.load_preset("default").items() if v == config.SETTINGS[k].default}
    assert restated == {}
