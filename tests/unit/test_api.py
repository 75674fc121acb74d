"""The Python API (``ssdmpi.train``), ``--model package.module:factory`` and tabular (N, D) data.

The API's must-show: a user's script, run under the venv's ``mpiexec -n 2``, trains a model it
defines itself on its own arrays (tests/unit/api_scripts/user_script.py, copied to a temporary
directory so that nothing but the installed ssdmpi is importable next to it).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import ssdmpi
from ssdmpi.data import from_arrays, load_dataset
from ssdmpi.errors import UserError
from ssdmpi.nn import MODELS, Model, build_model, register_model
from ssdmpi.nn.layers import Linear
from tests.conftest import assert_one_line_error, mpiexec, run_cli

SCRIPTS = Path(__file__).parent / "api_scripts"
SHORT = ["--steps", "8", "--eval-every", "0", "--no-progress-bar", "--warmup-steps", "2", "--delay", "2"]

MYMODELS = '''
from ssdmpi.nn import Model
from ssdmpi.nn.layers import Flatten, Linear, ReLU


def net(input_shape, num_classes, *, xp, dtype, seed, hidden=24):
    fan_in = 1
    for s in input_shape:
        fan_in *= s
    return Model([Flatten(name="flat"), Linear(fan_in, hidden, name="fc1"), ReLU(name="r"),
                  Linear(hidden, num_classes, name="fc2")], input_shape, xp=xp, dtype=dtype, seed=seed, name="net")


def not_a_model(input_shape, num_classes):
    return 42


def five_classes(input_shape, num_classes, **kwargs):
    return net(input_shape, 5, **kwargs)

not_callable = 3


def no_arguments():
    return None


def unflattened(input_shape, num_classes, *, xp, dtype, seed):
    # Linear straight on (C, H, W) images: its layers do not fit the data's shape
    return Model([Linear(input_shape[0], num_classes, name="fc")], input_shape, xp=xp, dtype=dtype, seed=seed)
'''


@pytest.mark.parametrize("ranks", [2, 1, 4])
def test_a_user_script_trains_its_own_model_on_its_own_arrays_under_mpiexec(tmp_path, ranks):
    shutil.copy(SCRIPTS / "user_script.py", tmp_path)
    result = subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, "user_script.py", str(tmp_path / "run")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("run.rank*.json"))]
    assert sorted(r["rank"] for r in lines) == list(range(ranks))
    for r in lines:
        assert r["exit_code"] == 0 and r["world_size"] == ranks and r["model"] == "__main__:net"
        assert r["input_shape"] == [20]                       # (N, D) arrays: flat feature vectors
        assert r["test_acc"] >= 0.7, r                        # 3 classes: chance is 0.33
        assert abs(r["own_acc"] - r["test_acc"]) <= 2 / 300   # the returned model holds the evaluated W
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dataset"] == "arrays" and summary["num_params"] == 20 * 32 + 32 + 32 * 3 + 3
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"] == "__main__:net" and saved["algo"] == "ssd" and saved["epochs"] == 4


def test_a_script_trains_longer_with_resume_auto_bit_for_bit(tmp_path):
    """Through the API as through the CLI: 2 epochs, then ``resume: auto`` to 4 == one 4-epoch run."""
    shutil.copy(SCRIPTS / "resume_script.py", tmp_path)
    result = subprocess.run([mpiexec(), "-n", "2", sys.executable, "resume_script.py", str(tmp_path)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(lines) == 2
    for r in lines:
        assert r == {"codes": [0, 0, 0], "steps": [80, 40, 80], "dataset": "mine", "same": True}


def test_model_from_a_module_in_the_current_directory(tmp_path):
    (tmp_path / "mymodels.py").write_text(MYMODELS)
    result = run_cli(["train", "--model", "mymodels:net", "--run-dir", "run"] + SHORT, ranks=2, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["model"] == "mymodels:net" and summary["num_params"] == 64 * 24 + 24 + 24 * 10 + 10
    # ssdmpi eval rebuilds the model from the same package.module:factory
    evaluated = run_cli(["eval", "--checkpoint", "run/checkpoints/ckpt-00000008"], cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr


@pytest.mark.parametrize("spec, needle", [
    ("mymodels:nothere", "mymodels has no attribute 'nothere'"),
    ("nosuchmodule:net", "cannot import 'nosuchmodule'"),
    ("mymodels:not_callable", "not_callable is a int, not a model factory"),
    ("mymodels:not_a_model", "the factory returned a int, not an ssdmpi.nn.Model"),
    ("mymodels:five_classes", "outputs (5,) per sample, but the data has 10 classes"),
    ("mymodels:", "expected package.module:factory"),
    ("mymodels:no_arguments", "the factory must take (input_shape, num_classes"),
    ("mymodels:unflattened", "model mymodels:unflattened does not fit inputs (1, 8, 8): "),
])
def test_bad_model_factories_are_one_line_errors(tmp_path, spec, needle):
    (tmp_path / "mymodels.py").write_text(MYMODELS)
    result = run_cli(["train", "--model", spec, "--run-dir", "run"] + SHORT, ranks=2, cwd=tmp_path)
    assert_one_line_error(result, needle)
    assert not (tmp_path / "run").exists()


def test_factory_options_and_registered_names(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mymodels.py").write_text(MYMODELS)
    model = build_model("mymodels:net", (1, 8, 8), 10, hidden=7, seed=0)
    assert isinstance(model, Model) and model.num_params == 64 * 7 + 7 + 7 * 10 + 10
    with pytest.raises(UserError, match="model 'mymodels:not_a_model': bad option widths; it takes no options"):
        build_model("mymodels:not_a_model", (4,), 2, widths=(3,))
    import mymodels

    monkeypatch.setitem(MODELS, "tiny", mymodels.net)
    assert build_model("tiny", (4,), 2).output_shape == (2,)
    monkeypatch.delitem(MODELS, "tiny")
    register_model("tiny2", mymodels.net)
    try:
        assert build_model("tiny2", (4,), 3).output_shape == (3,)
    finally:
        MODELS.pop("tiny2")
    with pytest.raises(UserError, match="built in"):
        register_model("mlp", mymodels.net)
    with pytest.raises(UserError, match="built with numpy, the run uses"):
        build_model(build_model("mlp", (4,), 2), (4,), 2, xp=object())


def test_from_arrays_validates_shapes_and_normalises_per_feature():
    rng = np.random.default_rng(0)
    x, y = rng.normal(3.0, 2.0, size=(50, 4)), rng.integers(0, 3, 50)
    d = from_arrays(x, y, x[:10], y[:10])
    assert d.input_shape == (4,) and d.num_classes == 3 and d.train_x.dtype == np.float32
    np.testing.assert_allclose(d.train_x.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(d.train_x.std(0), 1, atol=1e-5)
    np.testing.assert_allclose(d.test_x, ((x[:10] - x.mean(0)) / x.std(0)).astype(np.float32), rtol=1e-5, atol=1e-5)
    assert from_arrays(rng.integers(0, 255, (6, 5, 5), dtype=np.uint8), y[:6], np.zeros((2, 5, 5), np.uint8),
                       y[:2]).input_shape == (1, 5, 5)
    for bad, needle in [((x[:, 0], y, x, y), r"train_x must be \(N, D\) features"),
                        ((x, y[:-1], x, y), "50 images but 49 labels"),
                        ((x, y, x[:, :3], y), "train and test samples differ in shape"),
                        ((x, y * 0.5, x, y), "train_y must be a 1-D array of integer labels"),
                        ((x.astype(int), y, x, y), "train_x must be float or uint8")]:
        with pytest.raises(UserError, match=needle):
            from_arrays(*bad)


def test_python_api_bad_input_is_a_user_error_before_anything_starts(tmp_path):
    x, y = np.zeros((8, 3), np.float32), np.zeros(8, np.int64)
    with pytest.raises(UserError, match=r"train_x must be \(N, D\) features"):
        ssdmpi.train({"steps": 1}, dataset=(np.zeros(8), y, x, y))
    with pytest.raises(UserError, match="a dataset mapping needs train_x"):
        ssdmpi.train({"steps": 1}, dataset={"train_x": x})
    with pytest.raises(UserError, match="unknown setting 'learning_rate'"):
        ssdmpi.train({"learning_rate": 1}, dataset=(x, y, x, y))
    with pytest.raises(UserError, match="config must be a mapping"):
        ssdmpi.train(3)


def test_tabular_hdf5_trains_with_mlp_and_is_refused_by_image_models(tmp_path):
    from ssdmpi.data.datasets import RawSplits
    from ssdmpi.data.hdf5 import write_hdf5

    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 300)
    x = (rng.normal(size=(300, 6)) + y[:, None] * 1.5).astype(np.float32)
    path = tmp_path / "tab.h5"
    write_hdf5(str(path), RawSplits("tab", x[:240], y[:240], x[240:], y[240:], 2, "test"))
    d = load_dataset("hdf5", str(path))
    assert d.input_shape == (6,) and d.train_x.shape == (240, 6)
    data = ["--dataset", "hdf5", "--data-path", str(path)]
    result = run_cli(["train", "--run-dir", str(tmp_path / "run"), "--batch-size", "8", "--epochs", "3",
                      "--no-progress-bar", "--warmup-steps", "5"] + data, ranks=2)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["test_acc"] >= 0.8
    assert_one_line_error(run_cli(["train", "--model", "lenet5", "--run-dir", str(tmp_path / "x")] + SHORT + data),
                          "lenet5 needs image inputs")
    assert_one_line_error(run_cli(["train", "--augment", "flip", "--run-dir", str(tmp_path / "y")] + SHORT + data),
                          "--augment flip needs images")


def test_help_of_ssdmpi_train_is_the_api_s_contract():
    """``help(ssdmpi.train)`` documents the function a script calls, not the command's module."""
    import pydoc

    from ssdmpi.run import api, command, trainer

    text = pydoc.render_doc(ssdmpi.train, renderer=pydoc.plaintext)
    assert ssdmpi.train is api.train and text.splitlines()[2].startswith("train(config=None, model=None, dataset=None)")
    for needle in ("Every rank calls it with the same arguments", "``config``:", "``model``:", "``dataset``:",
                   "Returns a ``Result`` on every rank", "UserError"):
        assert needle in text, needle
    assert command.__doc__.splitlines()[0] not in text and trainer.__doc__.splitlines()[0] not in text
    assert build_model(lambda s, c, **kw: Model([Linear(s[0], c, name="fc")], s, **kw), (3,), 2).num_params == 8
