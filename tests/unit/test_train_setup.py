"""The run directory: metrics trimmed after a resume, a fresh run refused over an old one."""

import pytest

from ssdmpi.errors import UserError


def test_resumed_metrics_drop_records_logged_after_the_checkpoint(tmp_path):
    import json

    from ssdmpi.run.directory import trim_metrics

    path = tmp_path / "metrics.jsonl"
    lines = [{"kind": "start", "step": 0}, {"kind": "step", "step": 10}, {"kind": "checkpoint", "step": 20},
             {"kind": "step", "step": 20}, {"kind": "step", "step": 30}, {"kind": "eval", "step": 30}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "step", "st')   # cut by the crash
    trim_metrics(str(path), 20)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 10, 20, 20]


def test_run_directory_rules(tmp_path):
    import os

    from ssdmpi.run.directory import prepare_run_dir

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
