"""Starting a run: a saved config.yaml is reusable for a new run, a failed start leaves no
directory behind, ``--print-config`` shows the resolution and writes nothing, and the help of
every flag states the default a run without it gets."""

import argparse
import os
import re

import pytest
import yaml

from ssdmpi import config
from ssdmpi.algos import registry
from ssdmpi.errors import UserError
from tests.conftest import assert_one_line_error, run_cli

TINY = ["--widths", "16", "--steps", "6", "--eval-every", "0", "--no-progress-bar", "--warmup-steps", "2",
        "--delay", "2"]


def parse(*argv):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(list(argv))


# --- bug 4: a saved config.yaml starts a new run ------------------------------------------------

def test_saved_yaml_keeps_run_dir_and_stop_at_step_as_comments_only(tmp_path):
    cfg = config.resolve(parse("--run-dir", str(tmp_path / "a"), "--stop-at-step", "5", "--lr", "0.02"))
    text = cfg.to_yaml()
    (tmp_path / "c.yaml").write_text(text)
    settings = config.load_file(str(tmp_path / "c.yaml"))
    assert "run_dir" not in settings and "stop_at_step" not in settings and settings["lr"] == 0.02
    assert f"#   run_dir: {tmp_path / 'a'}" in text and "#   stop_at_step: 5" in text   # still on record
    again = config.resolve(parse("--config", str(tmp_path / "c.yaml")))
    assert again.run_dir is None and again.stop_at_step is None and again.lr == 0.02


def test_config_yaml_of_a_finished_run_starts_a_new_run(tmp_path):
    first = tmp_path / "first"
    assert run_cli(["train", "--run-dir", str(first)] + TINY, cwd=tmp_path).returncode == 0
    result = run_cli(["train", "--config", str(first / "config.yaml")], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (new,) = (tmp_path / "runs").iterdir()                     # the default run directory, not the old one
    assert (new / "summary.json").is_file()
    assert yaml.safe_load((new / "config.yaml").read_text()) == yaml.safe_load((first / "config.yaml").read_text())


def test_an_old_style_config_naming_a_used_run_dir_says_where_run_dir_came_from(tmp_path):
    first = tmp_path / "first"
    assert run_cli(["train", "--run-dir", str(first)] + TINY).returncode == 0
    (tmp_path / "old.yaml").write_text(f"run_dir: {first}\nlr: 0.05\n")
    assert_one_line_error(run_cli(["train", "--config", str(tmp_path / "old.yaml")] + TINY),
                          f"run_dir comes from {tmp_path / 'old.yaml'}: drop it there or pass --run-dir")


# --- bug 5: a failed start removes what it created, nothing else ------------------------------------

@pytest.mark.parametrize("bad", [["--model", "nope"], ["--dataset", "mnist", "--data-path", "/nonexistent/mnist"],
                                 ["--model", "lenet5", "--dataset", "synthetic-no-such"]])
def test_a_failed_start_leaves_no_run_directory(tmp_path, bad):
    run = tmp_path / "new" / "run"
    result = run_cli(["train", "--run-dir", str(run)] + TINY + bad, ranks=2)
    assert result.returncode == 2, result.stderr
    assert not (tmp_path / "new").exists()          # run/, run/checkpoints/ and new/ were this attempt's
    result = run_cli(["train"] + TINY + bad, cwd=tmp_path)
    assert result.returncode == 2 and not (tmp_path / "runs").exists()


def test_a_failed_start_keeps_directories_it_did_not_create(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (tmp_path / "other").mkdir()
    assert run_cli(["train", "--run-dir", str(mine), "--model", "nope"] + TINY).returncode == 2
    assert mine.is_dir() and os.listdir(mine) == []   # the user's directory stays; our checkpoints/ went
    first = tmp_path / "first"
    assert run_cli(["train", "--run-dir", str(first)] + TINY).returncode == 0
    before = sorted(p.relative_to(first) for p in first.rglob("*"))
    result = run_cli(["train", "--run-dir", str(first), "--resume", "auto", "--model", "wide-mlp"] + TINY)
    assert result.returncode == 2
    assert sorted(p.relative_to(first) for p in first.rglob("*")) == before   # the earlier run is untouched


def test_remove_created_removes_only_empty_directories_it_made(tmp_path):
    from ssdmpi.run.directory import prepare_run_dir, remove_created

    created = prepare_run_dir(str(tmp_path / "a" / "b"), resuming=False)
    assert created == [str(tmp_path / "a" / "b" / "checkpoints"), str(tmp_path / "a" / "b"), str(tmp_path / "a")]
    (tmp_path / "a" / "note.txt").write_text("someone else's")
    remove_created(created)
    assert not (tmp_path / "a" / "b").exists() and (tmp_path / "a" / "note.txt").is_file()
    assert prepare_run_dir(str(tmp_path / "a" / "b"), resuming=False) == [str(tmp_path / "a" / "b" / "checkpoints"),
                                                                         str(tmp_path / "a" / "b")]


# --- item 8: --print-config and the help's defaults --------------------------------------------------

def test_print_config_prints_the_resolution_and_writes_nothing(tmp_path):
    (tmp_path / "c.yaml").write_text("lr: 0.3\nbatch_size: 64\n")
    result = run_cli(["train", "--print-config", "--config", str(tmp_path / "c.yaml"), "--batch-size", "8",
                      "--run-dir", str(tmp_path / "r")], cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert os.listdir(tmp_path) == ["c.yaml"]                         # no run directory, no runs/
    printed = yaml.safe_load(result.stdout)
    expected = config.resolve(parse("--config", str(tmp_path / "c.yaml"), "--batch-size", "8")).to_dict()
    expected.pop("run_dir"), expected.pop("stop_at_step")
    expected.update(delay=5, comm="period", period_rule="delta-merge", merge_delay=1,   # what --algo ssd resolves
                    merge_momentum=1.0, optimizer="sgd", momentum=0.9, weight_decay=1e-4)   # and --optimizer sgd
    assert printed == expected and printed["lr"] == 0.3 and printed["batch_size"] == 8
    assert f"#   run_dir: {tmp_path / 'r'}" in result.stdout
    assert re.search(r"^delay: 5 +# the default for --algo ssd$", result.stdout, re.M)


def test_print_config_output_fed_back_is_the_same_run(tmp_path):
    first = run_cli(["train", "--print-config", "--preset", "cifar10-resnet20", "--algo", "ssgd"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    printed = yaml.safe_load(first.stdout)
    assert printed["delay"] is None and printed["local_update"] is None   # the preset's, dropped for ssgd
    (tmp_path / "p.yaml").write_text(first.stdout)
    again = run_cli(["train", "--print-config", "--config", str(tmp_path / "p.yaml")], cwd=tmp_path)
    assert again.returncode == 0 and yaml.safe_load(again.stdout) == printed


def test_print_config_under_mpiexec_prints_once_and_bad_input_is_one_line(tmp_path):
    result = run_cli(["train", "--print-config", "--lr", "0.2"], ranks=2, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.count("lr: 0.2\n") == 1, result.stdout
    assert_one_line_error(run_cli(["train", "--print-config", "--config", str(tmp_path / "none.yaml")], ranks=2),
                          "cannot read config file")


def _helps():
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return {a.dest: a.help for a in parser._actions if a.help}


def test_help_states_the_resolved_default_of_every_flag():
    """``default: X`` where X is what a run without the flag gets: the default preset's value, the
    dataclass's, or (for the algorithm's settings) what the algorithm resolves them to; and the
    presets the help names as setting their own are exactly those that do."""
    from ssdmpi.algos import AlgoConfig

    helps = _helps()
    cfg = config.resolve(parse())
    algo = config.recorded(cfg, config.algo_config(cfg, 89, 1780, 1))
    presets = {p: config.load_preset(p) for p in config.list_presets() if p != "default"}
    for name in config.FIELD_NAMES:
        if name == "progress_bar":
            continue
        text = helps[name]
        value = getattr(algo, name) if getattr(cfg, name) is None else getattr(cfg, name)
        if value is not None:
            shown = ",".join(map(str, value)) if isinstance(value, list) else f"{value:g}" \
                if isinstance(value, float) and name in registry.RESOLVED else str(value)
            assert f"(default: {shown}" in text, (name, shown, text)
        setters = sorted(p for p, values in presets.items() if name in values)
        named = re.search(r"(?:set by )?preset ([\w, -]+?) sets? (?:its|their) own|set by preset ([\w, -]+)\)",
                          text.replace("\n", " "))
        listed = sorted(re.split(r",\s*", (named.group(1) or named.group(2)).strip())) if named else []
        assert listed == setters, (name, listed, setters, text)
    odsgd = AlgoConfig(algo="odsgd").validate(1)
    assert f"odsgd: {odsgd.delay}" in helps["delay"] and f"odsgd: {odsgd.comm}" in helps["comm"]


def test_model_help_lists_the_registered_models():
    from ssdmpi.nn import MODELS

    assert all(name in _helps()["model"] for name in MODELS) and "package.module:factory" in _helps()["model"]


def test_unknown_model_is_a_user_error_naming_the_choices():
    from ssdmpi.nn import build_model

    with pytest.raises(UserError, match="unknown model 'nope'; choose one of .*package.module:factory"):
        build_model("nope", (4,), 2)
