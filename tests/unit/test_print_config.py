"""``ssdmpi train --print-config`` prints the settings the run will record in its config.yaml
(the chosen ``--algo``'s defaults written in; the settings it does not use left unset, saying
so), refuses what the run refuses; ``ssdmpi train --help`` lists the dataset names of the data
registry and, like ssdmpi/run/command.py's docstring, every file of a run directory."""

import argparse
import re
import subprocess
import sys

import pytest
import yaml

from ssdmpi import config
from ssdmpi.run.start import print_config
from tests.conftest import ROOT, run_cli

ALGOS = ("ssgd", "ssd", "odsgd", "localsgd", "asgd")
# What --print-config shows for each algorithm's settings (the default preset, nothing else given),
# as documented (docs/ALGORITHM.md): a value (the algorithm's default, recorded in config.yaml), a
# "default: ..." comment (a default the run decides), or "only with ..." (the run does not use it).
NOT = "not used by this run (only with "
EXPECTED = {
    "ssgd": {"delay": NOT + "--algo ssd, localsgd or odsgd)", "comm": NOT + "--algo ssd or odsgd)",
             "period_rule": NOT + "--algo ssd --comm period)", "local_update": NOT + "--comm step or --period-rule "
             "replay)", "glu_divisor": NOT + "--local-update glu-paper)", "servers": NOT + "--algo asgd)"},
    "ssd": {"delay": 5, "comm": "period", "period_rule": "delta-merge", "merge_delay": 1, "merge_momentum": 1.0,
            "delay_max": NOT + "--delay auto)",
            "local_lr": NOT + "--local-update glu-paper or sgd)", "asgd_order": NOT + "--algo asgd)"},
    "odsgd": {"delay": 1, "comm": "step", "local_update": "global-momentum", "period_rule": NOT + "--algo ssd --comm "
              "period)", "merge_delay": NOT + "--comm period --period-rule delta-merge)",
              "glu_divisor": NOT + "--local-update glu-paper)"},
    "localsgd": {"delay": 5, "comm": NOT + "--algo ssd or odsgd)", "local_update": NOT + "--comm step or "
                 "--period-rule replay)", "servers": NOT + "--algo asgd)"},
    "asgd": {"servers": 1, "asgd_order": "arrival", "delay": NOT + "--algo ssd, localsgd or odsgd)",
             "local_lr": NOT + "--local-update glu-paper or sgd)"},
}


def parse(*argv):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(list(argv))


def printed(capsys, *argv) -> tuple[dict, dict]:
    """``(settings, {key: comment})`` of ``ssdmpi train --print-config ARGV``, run in process."""
    assert print_config(parse("--print-config", *argv)) == 0
    text = capsys.readouterr().out
    comments = {m.group(1): m.group(2) for m in re.finditer(r"^(\w+): .* +# (.*)$", text, re.M)}
    return yaml.safe_load(text), comments


@pytest.mark.parametrize("algo", ALGOS)
def test_each_algorithm_setting_shows_its_value_for_the_algo_or_that_the_algo_does_not_use_it(capsys, algo):
    settings, comments = printed(capsys, "--algo", algo)
    for key, expected in EXPECTED[algo].items():
        if isinstance(expected, str) and expected.startswith(NOT):
            assert settings[key] is None and comments[key] == expected, (algo, key, comments.get(key))
        else:
            assert settings[key] == expected and comments[key] == f"the default for --algo {algo}", \
                (algo, key, settings[key], comments.get(key))


PRESETS = ("default", "cifar10-resnet20", "diloco", "fashion-mnist-lenet5", "fashion-mnist-mlp", "streaming-diloco",
           "text-gpt")


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_prints_the_settings_written_out_here(capsys, preset):
    """``--print-config --preset NAME``, every line: each value, each comment and the order, as
    written out in tests/unit/print_config/NAME.yaml (a changed default, a default stated twice
    that drifted, or a lost comment shows up here)."""
    assert print_config(parse("--print-config", "--preset", preset)) == 0
    expected = (ROOT / "tests" / "unit" / "print_config" / f"{preset}.yaml").read_text()
    assert capsys.readouterr().out == expected


def test_the_written_out_presets_are_every_preset():
    assert sorted(PRESETS) == config.list_presets()


def test_a_default_the_run_decides_is_a_comment_and_a_value_given_has_none(capsys):
    settings, comments = printed(capsys, "--comm", "step", "--local-update", "sgd", "--delay", "3")
    assert settings["local_lr"] is None and comments["local_lr"] == "default: world size x lr"
    assert comments["local_lr_schedule"] == "default: the global schedule's shape"
    assert (settings["delay"], settings["local_update"]) == (3, "sgd")
    assert "delay" not in comments and "local_update" not in comments and "comm" not in comments


CONFIG_YAML_CASES = [["--algo", algo] for algo in ALGOS] + [
    ["--delay", "auto", "--warmup-steps", "6"], ["--comm", "step", "--local-update", "glu-paper"],
    ["--warmup-epochs", "0.1"], ["--algo", "ssgd", "--preset", "fashion-mnist-lenet5", "--dataset", "digits"]]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("args", CONFIG_YAML_CASES, ids=[" ".join(a) for a in CONFIG_YAML_CASES])
def test_print_config_shows_what_config_yaml_records(tmp_path, args):
    """The settings ``--print-config`` prints are those the same command's run writes to its
    config.yaml (``delay: 5``, not ``delay: null``), and its output runs as a ``--config`` file."""
    args = args + ["--steps", "8", "--no-progress-bar", "--eval-every", "0"]
    shown = run_cli(["train", "--print-config"] + args, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    ranks = 2 if "asgd" in args else None
    ran = run_cli(["train", "--run-dir", "run"] + args, ranks=ranks, cwd=tmp_path, timeout=240)
    assert ran.returncode == 0, ran.stderr
    assert yaml.safe_load(shown.stdout) == yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    (tmp_path / "printed.yaml").write_text(shown.stdout)
    again = run_cli(["train", "--config", "printed.yaml", "--run-dir", "again"], ranks=ranks, cwd=tmp_path,
                    timeout=240)
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load((tmp_path / "again" / "config.yaml").read_text()) == yaml.safe_load(shown.stdout)


def test_localsgd_comm_is_not_ssd_s_default(capsys):
    settings, comments = printed(capsys, "--algo", "localsgd")
    assert comments["comm"] == "not used by this run (only with --algo ssd or odsgd)"
    assert settings["delay"] == 5 and comments["period_rule"].startswith("not used")


def test_the_local_lr_applies_with_a_local_update_that_uses_one(capsys):
    settings, comments = printed(capsys, "--comm", "step", "--local-update", "glu-paper")
    assert comments["local_lr"] == "default: world size x lr"
    assert settings["glu_divisor"] == 12
    assert comments["period_rule"].startswith("not used by this run")


def test_warmup_steps_given_in_epochs_is_not_the_preset_s_step_count(capsys):
    settings, comments = printed(capsys, "--warmup-epochs", "1.5")
    assert settings["warmup_steps"] is None and settings["warmup_epochs"] == 1.5
    assert comments["warmup_steps"] == "unset, --warmup-epochs decides"


@pytest.mark.parametrize("args, needle", [
    (["--algo", "ssgd", "--delay", "3"], "--delay does not apply to --algo ssgd"),
    (["--algo", "localsgd", "--comm", "step"], "--comm step does not apply to --algo localsgd"),
])
def test_print_config_refuses_the_settings_the_run_refuses(args, needle):
    result = run_cli(["train", "--print-config"] + args)
    assert result.returncode == 2 and result.stdout == "", (result.returncode, result.stdout)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ssdmpi: error: ") and needle in lines[0], lines


def test_dataset_help_lists_the_data_registry():
    from ssdmpi.data.datasets import DATASETS  # the names load_dataset accepts

    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    (action,) = [a for a in parser._actions if a.dest == "dataset"]
    assert " | ".join(DATASETS) in action.help and "default: digits" in action.help


def test_building_the_cli_parser_imports_no_numpy():
    """``ssdmpi --help`` stays fast: the parser (which lists the dataset names) needs no NumPy."""
    code = "import sys; from ssdmpi.cli import build_parser; build_parser(); print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", (out.stdout, out.stderr)


def test_the_run_directory_listing_names_the_loggers_files():
    """The command's docstring and ``ssdmpi train --help`` list what --csv and --tensorboard write."""
    from ssdmpi import loggers
    from ssdmpi.run import command

    for text in (command.__doc__, command.EPILOG):
        assert all(name in text for name in loggers.CSV_FILES.values()), text
        assert f"{loggers.TENSORBOARD_DIR}/" in text, text


def test_every_train_flag_states_its_default():
    """``ssdmpi train --help``: each flag but the switches that only act (--help, --print-config)
    says what a run without it gets."""
    from ssdmpi.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    for action in train._actions:
        if action.dest in ("help", "print_config"):
            continue
        assert action.help and "default: " in action.help, (action.option_strings, action.help)
