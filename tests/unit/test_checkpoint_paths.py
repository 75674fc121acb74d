"""What a checkpoint path may be, and how a path that is none is reported.

A file of a format-2 checkpoint (a rank file, its manifest) stands for the whole checkpoint in
``ckpt verify``/``inspect``, ``eval --checkpoint``, ``train --resume`` and ``ssdmpi.load_model``;
a file that is no checkpoint at all (not HDF5, or HDF5 of something else) is said to be that,
never "corrupt"; ``ckpt list`` has a header and prints once under mpiexec."""

import json
import os

import numpy as np
import pytest

import ssdmpi
from ssdmpi.errors import UserError
from tests.conftest import assert_one_line_error, run_cli

SMALL = ["--dataset", "digits", "--model", "mlp", "--widths", "16", "--batch-size", "8", "--algo", "ssd",
         "--delay", "2", "--warmup-steps", "4", "--eval-every", "0", "--no-progress-bar"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-rank run with checkpoints at steps 10 and 20: ``(run directory, newest checkpoint)``."""
    run_dir = tmp_path_factory.mktemp("paths") / "run"
    result = run_cli(["train", "--run-dir", str(run_dir), "--steps", "20", "--checkpoint-every", "10"] + SMALL,
                     ranks=2)
    assert result.returncode == 0, result.stderr
    return run_dir, run_dir / "checkpoints" / "ckpt-00000020"


def test_a_rank_file_stands_for_its_checkpoint(run):
    run_dir, ckpt = run
    rank_file = ckpt / "rank-0001.h5"
    verified = run_cli(["ckpt", "verify", str(rank_file)])
    assert verified.returncode == 0 and verified.stdout.strip() == f"{ckpt}: ok", verified.stdout + verified.stderr
    inspected = json.loads(run_cli(["ckpt", "inspect", "--json", str(ckpt / "manifest.json")]).stdout)
    assert inspected["path"] == str(ckpt) and inspected["step"] == 20 and inspected["problems"] == []
    evaluated = run_cli(["eval", "--checkpoint", str(rank_file), "--json"])
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads(evaluated.stdout)
    assert report["checkpoint"] == str(ckpt) and report["step"] == 20 and report["samples"] == 360
    by_file, by_dir = ssdmpi.load_model(rank_file), ssdmpi.load_model(ckpt)
    assert np.array_equal(by_file.params, by_dir.params)
    # --resume from the rank file of the step-10 checkpoint continues that checkpoint (to step 20 again)
    resumed = run_cli(["train", "--run-dir", str(run_dir), "--resume",
                       str(run_dir / "checkpoints" / "ckpt-00000010" / "rank-0000.h5"), "--steps", "20"] + SMALL,
                      ranks=2)
    assert resumed.returncode == 0, resumed.stderr
    starts = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    starts = [r for r in starts if r["kind"] == "start"]
    assert starts[-1]["resumed_from"].endswith("ckpt-00000010") and starts[-1]["step"] == 10


def test_a_file_that_is_no_checkpoint_is_not_called_corrupt(run, tmp_path):
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    other_hdf5 = tmp_path / "digits.h5"
    assert run_cli(["data", "convert", "digits", "--out", str(other_hdf5)]).returncode == 0
    for path, why in ((text, "not an HDF5 file"), (other_hdf5, "an HDF5 file without an ssdmpi checkpoint's")):
        verified = run_cli(["ckpt", "verify", str(path)])
        assert verified.returncode == 2
        assert verified.stdout.startswith(f"{path}: not an ssdmpi checkpoint ({why}"), verified.stdout
        assert "corrupt" not in (verified.stdout + verified.stderr).lower()
        for args in (["eval", "--checkpoint", str(path)], ["ckpt", "inspect", str(path)],
                     ["train", "--resume", str(path), "--run-dir", str(tmp_path / "r")] + SMALL):
            result = run_cli(args)
            assert_one_line_error(result, f"{path} is not an ssdmpi checkpoint ({why}")
            assert "corrupt" not in result.stderr.lower()
        with pytest.raises(UserError, match="is not an ssdmpi checkpoint") as raised:
            ssdmpi.load_model(path)
        assert "corrupt" not in str(raised.value)
    assert not (tmp_path / "r").exists()
    # A damaged checkpoint is still called corrupt.
    _, ckpt = run
    damaged = tmp_path / "ckpt-00000020"
    damaged.mkdir()
    for name in os.listdir(ckpt):
        (damaged / name).write_bytes((ckpt / name).read_bytes())
    data = bytearray((damaged / "rank-0001.h5").read_bytes())
    data[-100] ^= 0xFF
    (damaged / "rank-0001.h5").write_bytes(bytes(data))
    verified = run_cli(["ckpt", "verify", str(damaged / "rank-0001.h5")])
    assert verified.returncode == 2, verified.stdout
    assert verified.stdout.startswith(f"{damaged}: CORRUPT: rank-0001.h5:"), verified.stdout


def test_ckpt_list_has_a_header_and_prints_once_under_mpiexec(run):
    run_dir, _ = run
    for ranks in (None, 2):
        result = run_cli(["ckpt", "list", str(run_dir)], ranks=ranks)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].split() == ["step", "checkpoint", "size", "status"], lines
        assert [line.split()[:2] for line in lines[1:]] == [["10", "ckpt-00000010"], ["20", "ckpt-00000020"]], lines
        assert lines[-1].endswith("ok  (best, last)") or lines[-1].endswith("ok  (last)"), lines
    verified = run_cli(["ckpt", "verify", str(run_dir)], ranks=2)
    assert verified.returncode == 0 and len(verified.stdout.splitlines()) == 2, verified.stdout
