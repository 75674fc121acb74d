"""The run-directory reader (ssdmpi/rundir.py): its one rule for a bad line of ``metrics.jsonl``, the
summary and the config, and that the other modules read through it."""

import json

import pytest

from ssdmpi.errors import UserError

RECORDS = [{"kind": "start", "step": 0}, {"kind": "step", "step": 10, "loss": 1.5},
           {"kind": "eval", "step": 10, "test_acc": 0.5}]


def write_metrics(run_dir, text):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir / "metrics.jsonl"


def lines(records):
    return "".join(json.dumps(r) + "\n" for r in records)


def test_records_in_file_order_with_their_lines_as_written(tmp_path):
    from ssdmpi.rundir import read_records, record_lines

    path = write_metrics(tmp_path / "run", lines(RECORDS))
    assert read_records(path) == RECORDS
    assert [line for line, _ in record_lines(path)] == [json.dumps(r) + "\n" for r in RECORDS]


def test_a_missing_file_holds_no_record(tmp_path):
    from ssdmpi.rundir import has_metrics, read_records

    assert read_records(tmp_path / "metrics.jsonl") == [] and not has_metrics(tmp_path)


@pytest.mark.parametrize("tail", ['{"kind": "step", "st', '[1, 2]', "not json\n", '{"kind": "step", "st\n\n  \n'])
def test_a_last_line_cut_short_is_skipped(tmp_path, tail):
    from ssdmpi.rundir import read_records

    path = write_metrics(tmp_path / "run", lines(RECORDS) + tail)
    assert read_records(path) == RECORDS


def test_blank_lines_are_ignored(tmp_path):
    from ssdmpi.rundir import read_records

    path = write_metrics(tmp_path / "run", "\n" + lines(RECORDS[:1]) + "  \n\n" + lines(RECORDS[1:]))
    assert read_records(path) == RECORDS


@pytest.mark.parametrize("bad", ['{"kind": "step", "st', "[1, 2]", "7"])
def test_a_bad_line_before_the_last_is_corruption_naming_its_line(tmp_path, bad):
    from ssdmpi.rundir import CorruptMetrics, read_records

    path = write_metrics(tmp_path / "run", lines(RECORDS[:1]) + "\n" + bad + "\n" + lines(RECORDS[1:]))
    with pytest.raises(CorruptMetrics, match=r"metrics\.jsonl:3: corrupt metrics line .*repair or delete"):
        read_records(path)
    assert issubclass(CorruptMetrics, UserError)


def test_a_file_that_is_not_utf8_text_is_a_one_line_error(tmp_path):
    from ssdmpi.rundir import read_records

    path = write_metrics(tmp_path / "run", "")
    path.write_bytes(b'{"kind": "step"}\n\xff\xfe\n')
    with pytest.raises(UserError, match="unreadable"):
        read_records(path)


def test_the_loggers_and_the_trainer_read_with_the_same_rule(tmp_path):
    """``loggers.record_lines`` (what resume's trimming reads) is the reader itself."""
    from ssdmpi import loggers, rundir

    assert loggers.record_lines is rundir.record_lines and loggers.read_records is rundir.read_records
    path = write_metrics(tmp_path / "run", lines(RECORDS) + '{"cut')
    assert [r for _, r in loggers.record_lines(path)] == RECORDS


def test_summary_and_config(tmp_path):
    from ssdmpi.rundir import read_config, read_summary

    run = tmp_path / "run"
    run.mkdir()
    assert read_summary(run) == {} and read_config(run) == {}
    (run / "summary.json").write_text(json.dumps({"step": 20, "test_acc": 0.9}))
    (run / "config.yaml").write_text("algo: ssd\ndelay: 5\nwidths: [256, 128]\n")
    assert read_summary(run) == {"step": 20, "test_acc": 0.9}
    assert read_config(run) == {"algo": "ssd", "delay": 5, "widths": [256, 128]}
    (run / "config.yaml").write_text("algo: [unclosed\n")       # a config only labels a run
    assert read_config(run) == {}
    (run / "config.json").write_text(json.dumps({"algo": "ssgd"}))     # a peer's, read first
    assert read_config(run) == {"algo": "ssgd"}
    (run / "summary.json").write_text('{"step": 2')
    with pytest.raises(UserError, match=r"summary\.json: not readable JSON"):
        read_summary(run)


def test_load_run_splits_records_by_kind_and_reads_the_last_parts_config(tmp_path):
    from ssdmpi.rundir import load_run

    run_dir = tmp_path / "run"
    write_metrics(run_dir, lines([{"kind": "start", "step": 0, "world_size": 2, "config": {"algo": "ssgd"}},
                                  {"kind": "step", "step": 5}, {"kind": "checkpoint", "step": 5},
                                  {"kind": "start", "step": 5, "world_size": 4, "config": {"algo": "ssd"}},
                                  {"kind": "step", "step": 10}, {"step": 10, "test_acc": 0.7}]))
    run = load_run(run_dir)
    assert [r["step"] for r in run.steps] == [5, 10] and [r["test_acc"] for r in run.evals] == [0.7]
    assert [s["world_size"] for s in run.segments] == [2, 4] and run.setting("algo") == "ssd"


def test_importing_the_reader_loads_no_numpy():
    import subprocess
    import sys

    code = "import sys, ssdmpi.rundir; assert 'numpy' not in sys.modules and 'mpi4py' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
