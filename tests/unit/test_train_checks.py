"""Settings a run checks or fixes before it trains: a relative ``--data-path`` is recorded as an
absolute one (the run is evaluated and resumed from other directories), and an lr warm-up that is
not shorter than the run is refused (it would train at a fraction of ``--lr`` throughout)."""

import json

import yaml

from ssdmpi.data import datasets
from ssdmpi.data.hdf5 import write_hdf5
from tests.conftest import assert_one_line_error, run_cli

SMALL = ["--model", "mlp", "--widths", "16", "--batch-size", "8", "--algo", "ssgd", "--eval-every", "0",
         "--no-progress-bar"]


def test_a_relative_data_path_is_recorded_absolute(tmp_path):
    (tmp_path / "work" / "data").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    write_hdf5(str(tmp_path / "work" / "data" / "d.h5"), datasets.load_raw("digits"))
    run_dir = tmp_path / "work" / "run"
    result = run_cli(["train", "--dataset", "hdf5", "--data-path", "data/d.h5", "--run-dir", "run", "--steps", "5"]
                     + SMALL, cwd=tmp_path / "work")
    assert result.returncode == 0, result.stderr
    absolute = str(tmp_path / "work" / "data" / "d.h5")
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data_path"] == absolute
    manifest = json.loads((run_dir / "checkpoints" / "last" / "manifest.json").read_text())
    assert manifest["config"]["data_path"] == absolute
    evaluated = run_cli(["eval", "--checkpoint", str(run_dir), "--json"], cwd=tmp_path / "elsewhere")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["samples"] == 360
    resumed = run_cli(["train", "--run-dir", str(run_dir), "--resume", "auto", "--steps", "8"] + SMALL,
                      cwd=tmp_path / "elsewhere")
    assert resumed.returncode == 0, resumed.stderr


def test_an_lr_warmup_not_shorter_than_the_run_is_refused(tmp_path):
    for length, warmup in ((["--epochs", "2"], "5"), (["--epochs", "2"], "2"), (["--steps", "10"], "1")):
        run_dir = tmp_path / f"run-{warmup}"
        result = run_cli(["train", "--dataset", "digits", "--run-dir", str(run_dir), "--lr-warmup-epochs", warmup]
                         + length + SMALL)
        assert_one_line_error(result, f"--lr-warmup-epochs {warmup} (")
        assert "is not shorter than the run" in result.stderr and "--lr" in result.stderr
        assert not run_dir.exists()     # a start that fails removes the directory it made
