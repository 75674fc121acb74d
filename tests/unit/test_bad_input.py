"""Bad input on the command line, one table for every command: exit 2, exactly one line on
stderr that names the command and says what is wrong, no traceback, nothing created.

The flags' own type errors (``--bucket-size 4X``), argparse's errors (``--epochs five``, a
missing argument), abbreviations (``--epoch 5`` is not ``--epochs 5``) and an unknown key of a
``--config`` file go through the same one-line path."""

import os

import pytest

from tests.conftest import run_cli

# (the command that reports it, its arguments, what the one line must say). The config file
# ``bad.yaml`` is written first.
CASES = [
    ("train", ["--bucket-size", "4X"], "argument --bucket-size: cannot read size '4X'; write e.g. 64K, 4M or a "
                                        "number of bytes"),
    ("train", ["--bucket-size", "4x"], "argument --bucket-size: cannot read size '4x'; write e.g. 64K, 4M or a "
                                        "number of bytes"),
    ("train", ["--bucket-size=-4M"], "argument --bucket-size: size '-4M' is negative; write e.g. 64K, 4M or a "
                                     "number of bytes"),
    ("train", ["--bucket-size", "-4M"], "argument --bucket-size: expected one argument"),
    ("train", ["--widths", "abc"], "--widths must be comma-separated integers >= 1 like 256,128; got 'abc'"),
    ("train", ["--widths", "0"], "--widths must be comma-separated integers >= 1 like 256,128; got '0'"),
    ("train", ["--epochs", "five"], "argument --epochs: invalid int value: 'five'"),
    ("train", ["--epoch", "5"], "unrecognized arguments: --epoch 5 (did you mean --epochs?)"),
    ("train", ["--delay", "x"], "argument --delay: expected a positive integer k or auto, got 'x'"),
    ("train", ["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
    ("eval", ["--checkp", "x"], "the following arguments are required: --checkpoint"),
    ("eval", ["--checkpoint", "x", "--batch-size", "many"], "argument --batch-size: invalid int value: 'many'"),
    ("bench comm", ["--repetas", "3"], "unrecognized arguments: --repetas 3 (did you mean --repeats?)"),
    ("bench engine", ["--repeats", "x"], "argument --repeats: invalid int value: 'x'"),
    ("bench train", ["--epochs", "x"], "argument --epochs: invalid int value: 'x'"),
    ("bench model", ["--steps", "x"], "argument --steps: invalid int value: 'x'"),
    ("bench accuracy", ["--jobs", "x"], "argument --jobs: invalid int value: 'x'"),
    ("bench", ["nope"], "argument KIND: invalid choice: 'nope' (choose from 'engine', 'comm', 'train', "
                          "'peers', 'model', 'accuracy', 'stability', 'checkpoint', 'report')"),
    ("plot", [], "the following arguments are required: RUN_DIR"),
    ("plot", ["runs/x", "--tit", "t"], "unrecognized arguments: --tit t (did you mean --title?)"),
    ("info", ["--threads", "two"], "argument --threads: invalid int value: 'two'"),
    ("ckpt inspect", [], "the following arguments are required: path"),
    ("ckpt list", ["x", "--all"], "unrecognized arguments: --all"),
    ("data convert", ["digits", "--ou", "x.h5"], "the following arguments are required: --out"),
    ("", ["--vers", "info"], "unrecognized arguments: --vers (did you mean --version?)"),
]


@pytest.mark.parametrize("command,args,needle", CASES, ids=[" ".join([c, *a]).strip() for c, a, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path, command, args, needle):
    before = sorted(os.listdir(tmp_path))
    result = run_cli(command.split() + args, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    prog = f"ssdmpi {command}".strip()
    assert lines[0] == f"{prog}: error: {needle}; see {prog} --help", lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert sorted(os.listdir(tmp_path)) == before


def test_an_unknown_key_of_a_config_file_says_which_was_meant(tmp_path):
    (tmp_path / "my.yaml").write_text("epochs: 2\nbatch-sise: 16\n")
    result = run_cli(["train", "--config", "my.yaml"], cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == ["ssdmpi: error: my.yaml: unknown setting 'batch-sise' (did you mean "
                                          "batch_size?); see ssdmpi train --help for the settings"]
    assert os.listdir(tmp_path) == ["my.yaml"]


def test_a_bad_flag_under_mpiexec_is_one_line_from_rank_0(tmp_path):
    result = run_cli(["train", "--epochs", "five"], ranks=2, cwd=tmp_path, timeout=180)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["ssdmpi train: error: argument --epochs: invalid int value: 'five'; see ssdmpi train --help"]
    assert os.listdir(tmp_path) == []


def test_no_parser_of_any_command_takes_abbreviations():
    """Every (sub)command's parser, walked from the top: ``--epoch`` must never mean ``--epochs``."""
    import argparse

    from ssdmpi.cli import build_parser
    from ssdmpi.cluster.cli import build_parser as cluster_parser

    def walk(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from walk(sub)

    parsers = list(walk(build_parser())) + list(walk(cluster_parser()))
    assert len(parsers) > 15
    assert [p.prog for p in parsers if p.allow_abbrev] == []
