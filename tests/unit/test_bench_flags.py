"""Every ``ssdmpi bench`` subcommand's parser: help for every flag, the shared spellings, the deprecated aliases."""

import argparse
import json

import pytest

from ssdmpi.bench import KINDS, flags
from ssdmpi.cli import build_parser
from ssdmpi.errors import UserError
from tests.conftest import run_cli

# The canonical spellings each subcommand must have (ssdmpi/bench/flags.py's table).
CANONICAL = {
    "engine": {"--batch-size", "--repeats", "--json"},
    "comm": {"--sizes", "--repeats", "--parts", "--strategies", "--json"},
    "train": {"--batch-size", "--delays", "--repeats"},
    "model": {"--batch-size", "--allreduce-repeats", "--repeats", "--plan-delay", "--json"},
    "accuracy": {"--batch-size", "--delays"},
    "stability": {"--delays", "--json"},
    "checkpoint": {"--batch-size", "--repeats", "--json"},
    "peers": {"--batch-size", "--repeats"},
    "report": {"--results", "--out", "--check"},
}
# (kind, old flags, new flags): each pair must parse to the same namespace.
ALIASES = [
    ("engine", ["--batch", "4"], ["--batch-size", "4"]),
    ("engine", ["--json"], ["--json", "-"]),
    ("comm", ["--json"], ["--json", "-"]),
    ("comm", ["--sizes", "1K", "4M"], ["--sizes", "1K,4M"]),
    ("comm", ["--parts", "overlap", "bandwidth"], ["--parts", "overlap,bandwidth"]),
    ("comm", ["--strategies", "test", "thread"], ["--strategies", "test,thread"]),
    ("train", ["--k", "2,5"], ["--delays", "2,5"]),
    ("model", ["--reps", "2"], ["--allreduce-repeats", "2"]),
    ("model", ["--plan-k", "3"], ["--plan-delay", "3"]),
]
OLD_SPELLINGS = {"--batch", "--k", "--reps", "--plan-k"}


def bench_parsers() -> dict:
    """kind -> the ``ssdmpi bench KIND`` parser, from the real CLI."""
    def sub(parser):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {kind: p for kind, p in sub(sub(build_parser())["bench"]).items()}


@pytest.fixture
def fresh_notes(monkeypatch):
    """No deprecation note printed yet in this process tree (restored afterwards)."""
    monkeypatch.setenv(flags._NOTED_ENV, "")


def test_every_kind_is_a_subcommand():
    assert set(bench_parsers()) == set(KINDS) == set(CANONICAL)


@pytest.mark.parametrize("kind", sorted(CANONICAL))
def test_every_flag_has_help_and_the_canonical_names_exist(kind):
    parser = bench_parsers()[kind]
    visible = set()
    for action in parser._actions:
        if isinstance(action, flags.DeprecatedAlias):
            assert action.help == argparse.SUPPRESS and set(action.option_strings) <= OLD_SPELLINGS
            continue
        assert action.help and action.help != argparse.SUPPRESS and action.help.strip(), action.option_strings
        visible.update(action.option_strings)
        # Lists are one comma-separated value; --json always takes FILE.
        assert action.nargs != "+" or isinstance(action, flags.CommaList), action.option_strings
        if "--json" in action.option_strings:
            assert isinstance(action, flags.JsonFile)
    assert CANONICAL[kind] <= visible
    assert not visible & OLD_SPELLINGS
    text = parser.format_help()
    assert " ...]" not in text and "[FILE]" not in text   # a list is shown as one value, FILE as required


@pytest.mark.parametrize("kind, old, new", ALIASES, ids=[" ".join([k] + o) for k, o, _ in ALIASES])
def test_an_old_spelling_parses_like_the_new_one_with_a_note(kind, old, new, fresh_notes, capsys):
    parser = build_parser()
    new_args = vars(parser.parse_args(["bench", kind] + new))
    assert capsys.readouterr().err == ""
    old_args = vars(parser.parse_args(["bench", kind] + old))
    assert old_args == new_args
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ssdmpi: note: ") and "deprecated" in err[0], err
    assert old[0] in err[0] and new[0] in err[0]


def test_a_note_is_printed_once_per_process_tree_and_by_rank_0_only(fresh_notes, capsys, monkeypatch):
    parser = build_parser()
    parser.parse_args(["bench", "train", "--k", "2"])
    parser.parse_args(["bench", "train", "--k", "3"])     # e.g. the same command relaunched under mpiexec
    assert len(capsys.readouterr().err.splitlines()) == 1
    monkeypatch.setenv(flags._NOTED_ENV, "")
    monkeypatch.setattr("ssdmpi.comm.abort.world_rank_size", lambda: (1, 2))
    assert parser.parse_args(["bench", "model", "--reps", "2"]).allreduce_repeats == 2
    assert capsys.readouterr().err == ""


def test_an_alias_on_the_command_line_is_a_note_then_the_new_name_in_errors(tmp_path):
    result = run_cli(["bench", "train", "--out", str(tmp_path / "o"), "--dry-run", "--k", "5,x"],
                     env={flags._NOTED_ENV: ""})
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith("ssdmpi: note: --k is deprecated"), result.stderr
    assert lines[1].startswith("ssdmpi: error: --delays must be comma-separated integers"), result.stderr


def test_parse_choices_keeps_the_order_and_rejects_unknown_empty_and_repeated_names():
    assert flags.parse_choices("thread, test", "--strategies", ("blocking", "test", "thread")) == ["thread", "test"]
    for bad in ("", "fast", "test,test", "test,fast"):
        with pytest.raises(UserError, match="--strategies must be comma-separated names from blocking,test,thread"):
            flags.parse_choices(bad, "--strategies", ("blocking", "test", "thread"))


def test_emit_json_prints_for_dash_and_writes_a_file_otherwise(tmp_path, capsys):
    flags.emit_json("-", json.dumps({"a": 1}))
    assert json.loads(capsys.readouterr().out) == {"a": 1}
    path = tmp_path / "r.json"
    flags.emit_json(str(path), json.dumps({"b": 2}, indent=2))
    assert path.read_text() == json.dumps({"b": 2}, indent=2) and capsys.readouterr().out == ""
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]            # no temporary file left
    with pytest.raises(UserError, match="--json .*: cannot write it"):
        flags.emit_json(str(tmp_path / "no" / "such" / "dir.json"), "{}")


@pytest.mark.parametrize("flag, value, message", [
    ("--parts", "bandwidth,latency", "--parts must be comma-separated names from bandwidth,overlap"),
    ("--strategies", "test,test", "--strategies must be comma-separated names"),
])
def test_bench_comm_rejects_a_bad_list_in_one_line(flag, value, message):
    result = run_cli(["bench", "comm", flag, value])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
