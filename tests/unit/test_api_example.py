"""docs/API.md's example, run as written: ``examples/`` holds its files (the page quotes them
verbatim), a copy trains under ``mpiexec`` by the command its first line gives, then the run is
evaluated with the page's ``ssdmpi eval`` line and reloaded with ``ssdmpi.load_model`` (the
page's ``check_mine.py``, and in this process). ``load_model``'s other paths: a model passed
explicitly, a factory that cannot be imported, a checkpoint that does not fit."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import ssdmpi
from ssdmpi.data import load_dataset
from ssdmpi.errors import UserError
from ssdmpi.nn import build_model
from ssdmpi.restore import eval_dataset
from ssdmpi.run.evaluation import evaluate
from tests.conftest import ROOT, assert_one_line_error, mpiexec, run_cli

EXAMPLES = ROOT / "examples"
FILES = ("mymodels.py", "train_mine.py", "check_mine.py")


def page_blocks(kind: str) -> list:
    """The ``kind`` (python, bash) code blocks of docs/API.md, in order."""
    return re.findall(rf"```{kind}\n(.*?)```", (ROOT / "docs" / "API.md").read_text(), flags=re.S)


def as_run_here(line: str) -> list:
    """A command of the page (``mpiexec -n 4 python x.py``, ``ssdmpi eval ...``) with this
    environment's launcher and Python."""
    words = shlex.split(line)
    head = {"mpiexec": [mpiexec()], "python": [sys.executable], "ssdmpi": [sys.executable, "-m", "ssdmpi"]}
    return [part for word in words for part in head.get(word, [word])]


def test_the_page_quotes_the_example_files_verbatim():
    blocks = page_blocks("python")
    for name in FILES:
        assert (EXAMPLES / name).read_text() in blocks, f"docs/API.md does not show examples/{name} as it is"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A copy of examples/ after the page's training command: ``(directory, summary)``."""
    where = tmp_path_factory.mktemp("example")
    for name in FILES:
        shutil.copy(EXAMPLES / name, where)
    (command,) = re.findall(r"run with {2}(.*?) {2}", (EXAMPLES / "train_mine.py").read_text().splitlines()[0])
    assert command == "mpiexec -n 4 python train_mine.py"
    result = subprocess.run(as_run_here(command), cwd=where, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((where / "runs" / "mine" / "summary.json").read_text())
    assert f"0 {summary['test_acc']}" in result.stdout          # exit code, test accuracy (the ranks' lines interleave)
    assert summary["model"] == "mymodels:net" and summary["dataset"] == "arrays" and summary["test_acc"] > 0.8
    return where, summary


@pytest.mark.timeout(400)
def test_the_pages_eval_line_evaluates_the_run(trained):
    where, summary = trained
    (line,) = [line.split("#")[0].strip() for block in page_blocks("bash") for line in block.splitlines()
               if line.startswith("ssdmpi eval --checkpoint runs/mine")]
    result = subprocess.run(as_run_here(line) + ["--json"], cwd=where, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["test_acc"] == pytest.approx(summary["test_acc"], abs=1e-6) and report["samples"] == 360


@pytest.mark.timeout(400)
def test_check_mine_reloads_the_run_with_load_model(trained):
    where, summary = trained
    result = subprocess.run([sys.executable, "check_mine.py"], cwd=where, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"test accuracy {summary['test_acc']:.2%}"


@pytest.mark.timeout(400)
def test_load_model_in_this_process(trained, monkeypatch):
    where, summary = trained
    run = where / "runs" / "mine"
    monkeypatch.setitem(sys.modules, "mymodels", None)     # as from a directory without mymodels.py
    with pytest.raises(UserError, match=r"its model mymodels:net cannot be rebuilt here \(cannot import 'mymodels'.*"
                                        r"pass model= \(the factory it was trained with"):
        ssdmpi.load_model(run)
    monkeypatch.syspath_prepend(str(where))
    monkeypatch.delitem(sys.modules, "mymodels")
    digits = load_dataset("digits")                  # the same normalised test split as the run's arrays
    checkpoint = sorted((run / "checkpoints").glob("ckpt-*"))[-1]
    for path in (run, str(checkpoint)):              # a run directory or a checkpoint
        model = ssdmpi.load_model(path)
        loss, acc, n = evaluate(model, digits.test_x, digits.test_y)
        assert model.name == "net" and n == 360 and acc == pytest.approx(summary["test_acc"], abs=1e-6)
    from mymodels import net

    by_factory = ssdmpi.load_model(run, model=net)
    built = net((1, 8, 8), 10, xp=np, dtype=np.float32, seed=123)
    into_built = ssdmpi.load_model(run, model=built)
    assert into_built is built
    assert np.array_equal(by_factory.params, model.params) and np.array_equal(built.params, model.params)
    with pytest.raises(UserError, match="holds 4810 parameters but the model mlp has"):
        ssdmpi.load_model(run, model=build_model("mlp", (1, 8, 8), 10))


def test_a_factory_of_a_scripts_main_says_to_pass_model(tmp_path):
    """tests/unit/api_scripts/user_script.py trains ``__main__:net``, which nothing can import again."""
    shutil.copy(Path(__file__).parent / "api_scripts" / "user_script.py", tmp_path)
    result = subprocess.run([mpiexec(), "-n", "2", sys.executable, "user_script.py", str(tmp_path / "run")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with pytest.raises(UserError, match=r"its model __main__:net cannot be rebuilt here \(it was defined in the "
                                        r"script that trained it\); pass model="):
        ssdmpi.load_model(tmp_path / "run")
    with pytest.raises(UserError, match=r"was trained on arrays given to ssdmpi.train \('arrays'\), which its run "
                                        r"does not keep: pass their test split as --dataset hdf5 --data-path FILE.h5"):
        eval_dataset(str(tmp_path / "run"), {"dataset": "arrays"}, None, None)
    # ssdmpi eval on it today: one line, exit 2 (what to pass: see ssdmpi/restore.py's eval_dataset and build)
    assert_one_line_error(run_cli(["eval", "--checkpoint", str(tmp_path / "run")], timeout=120), "arrays")




def test_eval_of_a_run_trained_on_arrays_by_a_scripts_factory_says_what_to_pass(tmp_path, monkeypatch):
    """A run trained on a script's arrays with a factory of the script's ``__main__``: ``ssdmpi eval``
    says what to pass (the data as HDF5, an importable --model), then evaluates with them."""
    script = (Path(__file__).parent / "api_scripts" / "user_script.py").read_text()
    (tmp_path / "user_script.py").write_text(script)
    (tmp_path / "mine.py").write_text(script.split("(xtr, ytr), (xte, yte) =")[0])
    result = subprocess.run([mpiexec(), "-n", "2", sys.executable, "user_script.py", str(tmp_path / "run")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    base = ["eval", "--checkpoint", "run", "--json"]
    assert_one_line_error(run_cli(base, ranks=2, cwd=tmp_path, timeout=120),
                          "was trained on arrays given to ssdmpi.train ('arrays'), which its run does not keep: "
                          "pass their test split as --dataset hdf5 --data-path FILE.h5")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mine", raising=False)
    import mine

    with h5py.File(tmp_path / "blobs.h5", "w") as f:
        for split, (x, y) in (("train", mine.blobs(1200, 1)), ("test", mine.blobs(300, 2))):
            f[f"{split}/images"], f[f"{split}/labels"] = x, y
    data = ["--dataset", "hdf5", "--data-path", "blobs.h5"]
    assert_one_line_error(run_cli(base + data, ranks=2, cwd=tmp_path, timeout=120),
                          "its model __main__:net cannot be rebuilt here (it was defined in the script that trained "
                          "it); pass an importable --model package.module:factory")
    done = run_cli(base + data + ["--model", "mine:net"], ranks=2, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert json.loads(done.stdout)["test_acc"] == pytest.approx(summary["test_acc"], abs=1e-6)
