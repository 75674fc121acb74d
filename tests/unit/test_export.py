"""A trained model outside ssdmpi: ``ssdmpi.load_model(run).predict(raw)`` with the normalisation
the checkpoint records, and ``ssdmpi export`` to a safetensors file under PyTorch names.

Oracles: the dataset pipeline's own normalised test split (``load_dataset``) for ``predict``; the
global model read back from the rank files with h5py for the exported tensors; each built-in
model's PyTorch twin (``ssdmpi/verify/torch_ref.py``) and, in a fresh ``python -I`` that imports
only safetensors and torch, the LeNet-5 of ``examples/predict_in_pytorch.py`` for the logits."""

import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import ssdmpi
from ssdmpi.data import datasets, load_dataset
from ssdmpi.errors import UserError
from tests.conftest import ROOT, assert_one_line_error, run_cli
from tests.unit.test_data_digits import documented_split, stdlib_table

FASHION = "/usr/share/datasets/fashion-mnist"
SCRIPT = ROOT / "examples" / "predict_in_pytorch.py"
MODELS = {"mlp": [], "wide-mlp": ["--widths", "16,16"], "lenet5": [], "resnet20": []}
NAMES = {   # the PyTorch twins' state_dict names, written out
    "mlp": ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
    "wide-mlp": ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"],
    "lenet5": [f"{layer}.{p}" for layer in ("conv1", "conv2", "fc1", "fc2", "fc3") for p in ("weight", "bias")],
}


def digits_raw():
    """The digits test split as the file holds it: ``(pixels 0..16 (N, 1, 8, 8) float64, labels)``."""
    table = np.array(stdlib_table())
    _, test = documented_split(table[:, -1].tolist())
    return table[test, :-1].reshape(-1, 1, 8, 8).astype(np.float64), table[test, -1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A short 2-rank run of each built-in model on digits: ``{model: run directory}``."""
    where = tmp_path_factory.mktemp("export")
    out = {}
    for name, extra in MODELS.items():
        run_dir = where / name
        result = run_cli(["train", "--run-dir", str(run_dir), "--model", name, "--steps", "12", "--batch-size", "8",
                          "--algo", "ssgd", "--lr", "0.05", "--eval-every", "0", "--no-progress-bar"] + extra, ranks=2)
        assert result.returncode == 0, result.stderr
        out[name] = run_dir
    return out


def global_weights(ckpt) -> np.ndarray:
    """``W`` of a format-2 checkpoint, its pieces joined in rank order, read with h5py alone."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    name = manifest.get("aliases", {}).get("model/global_weights", "model/global_weights")
    pieces = []
    for rank in range(manifest["world_size"]):
        with h5py.File(ckpt / f"rank-{rank:04d}.h5", "r") as f:
            pieces.append(f[f"shared/{name}"][()])
    return np.concatenate(pieces)


# --- ssdmpi.load_model(...).predict ----------------------------------------------------------------

def test_predict_takes_raw_inputs_with_the_recorded_normalisation(runs):
    model = ssdmpi.load_model(runs["lenet5"])
    raw, labels = digits_raw()
    data = load_dataset("digits")
    assert data.test_y.tolist() == labels.tolist()
    want = model.forward(data.test_x, train=False)          # the pipeline's own normalised inputs
    logits = model.predict_logits(raw)
    np.testing.assert_allclose(logits, want, atol=1e-5)
    assert model.predict(raw).tolist() == logits.argmax(axis=1).tolist()
    z = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(model.predict_proba(raw), z / z.sum(axis=1, keepdims=True), rtol=1e-12)
    for shaped in (raw[:, 0], raw.reshape(len(raw), 64), raw.astype(np.uint8)):   # (N, H, W), (N, 64), uint8
        assert model.predict(shaped).tolist() == model.predict(raw).tolist()
    assert model.normalisation.to_record() == {"rule": "x = (raw * scale - mean[c]) / std[c]", "scale": 1 / 16,
                                               "mean": list(data.mean), "std": list(data.std), "axis": "channel",
                                               "raw": "values 0..16"}
    with pytest.raises(UserError, match=r"inputs of shape \(3, 65\) do not fit this model: it takes \(N, 1, 8, 8\)"):
        model.predict(np.zeros((3, 65)))


def test_a_checkpoint_without_its_normalisation_says_how_to_pass_it(runs, tmp_path):
    old = tmp_path / "ckpt-old"
    shutil.copytree(runs["mlp"] / "checkpoints" / "ckpt-00000012", old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["normalisation"]                # as a checkpoint written before it was recorded
    (old / "manifest.json").write_text(json.dumps(manifest))
    model = ssdmpi.load_model(old)
    assert model.normalisation is None
    raw, _ = digits_raw()
    with pytest.raises(UserError) as raised:
        model.predict(raw)
    message = str(raised.value)
    assert "\n" not in message and f"{old} does not record its data's normalisation" in message
    assert "ssdmpi.load_model(path, normalisation=ssdmpi.data.load_dataset(NAME))" in message
    given = ssdmpi.load_model(old, normalisation=load_dataset("digits"))
    assert given.predict(raw).tolist() == ssdmpi.load_model(runs["mlp"]).predict(raw).tolist()


@pytest.mark.skipif(not os.path.isdir(FASHION), reason=f"Debian's dataset-fashion-mnist is not installed ({FASHION})")
def test_uint8_images_are_normalised_exactly_as_in_training(tmp_path):
    from ssdmpi.data import idx

    run_dir = tmp_path / "run"
    result = run_cli(["train", "--run-dir", str(run_dir), "--dataset", "fashion-mnist", "--model", "mlp", "--widths",
                      "32", "--steps", "5", "--algo", "ssgd", "--eval-every", "0", "--no-progress-bar"])
    assert result.returncode == 0, result.stderr
    model = ssdmpi.load_model(run_dir)
    raw = idx.read_split_dir(FASHION)["test_images"][:500]
    assert raw.dtype == np.uint8 and model.normalisation.to_record()["raw"] == "uint8 0..255"
    want = model.forward(np.ascontiguousarray(load_dataset("fashion-mnist").test_x[:500]), train=False)
    assert np.array_equal(model.predict_logits(raw), want)      # the same float32 inputs, bit for bit


# --- ssdmpi export ------------------------------------------------------------------------------------

def test_export_writes_the_global_model_under_pytorch_names_with_its_description(runs, tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy", reason="ssdmpi export needs safetensors")
    from safetensors import safe_open

    for name, run_dir in runs.items():
        out = tmp_path / f"{name}.safetensors"
        result = run_cli(["export", str(run_dir), "--out", str(out)])
        assert result.returncode == 0, result.stderr
        ckpt = run_dir / "checkpoints" / "ckpt-00000012"
        assert result.stdout.startswith(f"wrote {out}: {name} at step 12 (") and str(ckpt) in result.stdout
        tensors = safetensors.load_file(str(out))
        with safe_open(str(out), "np") as f:
            meta, order = f.metadata(), list(f.keys())
        model = ssdmpi.load_model(run_dir)
        params = [spec.name for spec in model.flat.specs]
        if name in NAMES:
            assert params == NAMES[name] and sorted(tensors) == sorted(NAMES[name]), sorted(tensors)
        else:   # resnet20: every parameter, and each BatchNorm's running statistics and batch count
            norms = [s.rsplit(".", 1)[0] for s in params if s.endswith("bn1.weight") or s.endswith("bn2.weight")
                     or s.endswith("shortcut_bn.weight")]
            extra = {f"{n}.{k}" for n in norms for k in ("running_mean", "running_var", "num_batches_tracked")}
            assert len(norms) == 19 and set(tensors) == set(params) | extra, sorted(set(tensors) ^ set(params))
            assert tensors["layer3.2.bn2.num_batches_tracked"].dtype == np.int64
            assert int(tensors["layer3.2.bn2.num_batches_tracked"]) == 12
            assert not np.allclose(tensors["bn1.running_var"], 1.0)      # trained statistics, not the initial ones
        assert len(order) == len(tensors)
        flat = np.concatenate([tensors[p].reshape(-1) for p in params])
        assert flat.dtype == np.float32 and np.array_equal(flat, global_weights(ckpt))
        manifest = json.loads((ckpt / "manifest.json").read_text())
        assert meta["format"] == "ssdmpi-export" and meta["model"] == name and meta["names"] == "pytorch"
        assert json.loads(meta["input_shape"]) == [1, 8, 8] and meta["num_classes"] == "10"
        assert json.loads(meta["normalisation"]) == manifest["normalisation"] and meta["step"] == "12"
        assert meta["ssdmpi_version"] == ssdmpi.__version__ and meta["checkpoint"] == "ckpt-00000012"
        assert json.loads(meta["model_options"]) == ({"widths": [16, 16]} if name == "wide-mlp" else
                                                     {"widths": manifest["config"]["widths"]}
                                                     if manifest["config"]["widths"] else {})


def test_export_refuses_what_it_should_in_one_line(runs, tmp_path):
    pytest.importorskip("safetensors", reason="ssdmpi export needs safetensors")
    out = tmp_path / "m.safetensors"
    assert run_cli(["export", str(runs["mlp"]), "--out", str(out)]).returncode == 0
    before = out.read_bytes()
    assert_one_line_error(run_cli(["export", str(runs["mlp"]), "--out", str(out)]),
                          f"{out} exists; choose another --out or pass --force to replace it")
    assert run_cli(["export", str(runs["lenet5"]), "--out", str(out), "--force"]).returncode == 0
    assert out.read_bytes() != before and not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert_one_line_error(run_cli(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "x.safetensors")]),
                          "does not exist")
    assert_one_line_error(run_cli(["export", str(runs["mlp"]), "--out", str(tmp_path / "no" / "x.safetensors")]),
                          f"no such directory: {tmp_path / 'no'}")
    assert_one_line_error(run_cli(["export", str(runs["mlp"]), "--out", str(tmp_path)]), "is a directory")
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    assert_one_line_error(run_cli(["export", str(text), "--out", str(tmp_path / "y.safetensors")]),
                          "is not an ssdmpi checkpoint (not an HDF5 file)")
    once = run_cli(["export", str(runs["mlp"]), "--out", str(tmp_path / "z.safetensors")], ranks=2)
    assert once.returncode == 0 and once.stdout.count("wrote") == 1, once.stdout + once.stderr


def test_without_safetensors_export_says_what_to_install(runs, tmp_path, monkeypatch):
    from ssdmpi.export import export

    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(UserError, match=r"^ssdmpi export needs the safetensors package: pip install 'ssdmpi\[export"):
        export(runs["mlp"], str(tmp_path / "m.safetensors"))
    assert not (tmp_path / "m.safetensors").exists()


def test_a_model_supplies_its_own_names(runs, tmp_path, monkeypatch):
    safetensors = pytest.importorskip("safetensors.numpy", reason="ssdmpi export needs safetensors")
    from ssdmpi import export

    def renamed(model, step):
        return {f"net.{spec.name}": model.flat.view(spec.name) for spec in model.flat.specs}

    monkeypatch.setitem(export.STATE_DICT, "mlp", renamed)
    done = export.export(runs["mlp"], str(tmp_path / "m.safetensors"))
    assert sorted(safetensors.load_file(done["out"])) == sorted(f"net.{n}" for n in NAMES["mlp"])
    monkeypatch.delitem(export.STATE_DICT, "mlp")       # no mapping of its own: ssdmpi's names, said so
    done = export.export(runs["mlp"], str(tmp_path / "m.safetensors"), force=True)
    assert done["names"] == "ssdmpi" and sorted(safetensors.load_file(done["out"])) == sorted(NAMES["mlp"])


# --- into PyTorch --------------------------------------------------------------------------------------

def test_each_builtin_model_loads_into_its_pytorch_twin_with_the_same_logits(runs, tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is the oracle of this test")
    pytest.importorskip("safetensors", reason="ssdmpi export needs safetensors")
    from safetensors.torch import load_file

    from ssdmpi.nn import build_model
    from ssdmpi.verify.torch_ref import build_torch_model

    x = load_dataset("digits").test_x.copy()
    for name, run_dir in runs.items():
        out = tmp_path / f"{name}.safetensors"
        assert run_cli(["export", str(run_dir), "--out", str(out)]).returncode == 0
        model = ssdmpi.load_model(run_dir)
        widths = json.loads((run_dir / "checkpoints" / "last" / "manifest.json").read_text())["config"]["widths"]
        options = {"widths": tuple(widths)} if widths else {}
        twin = build_torch_model(build_model(name, (1, 8, 8), 10, seed=123, **options))   # other weights
        twin.load_state_dict(load_file(str(out)), strict=True)
        twin.eval()
        with torch.no_grad():
            got = twin(torch.from_numpy(x)).numpy()
        want = model.forward(x, train=False)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=name)
        assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.99, name


def test_the_api_page_quotes_the_pytorch_script_as_it_is():
    assert SCRIPT.read_text() in (ROOT / "docs" / "API.md").read_text()


def predict_in_a_fresh_python(model_file, raw, where) -> dict:
    """examples/predict_in_pytorch.py on ``raw`` in ``python -I`` (no PYTHONPATH, no user site), checking
    that it imported no ssdmpi; its output file's tensors as NumPy arrays."""
    from safetensors.numpy import load_file, save_file

    save_file({"images": np.ascontiguousarray(raw)}, str(where / "images.safetensors"))
    code = ("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__'); "
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'ssdmpi'); "
            "assert not loaded, loaded")
    result = subprocess.run([sys.executable, "-I", "-c", code, str(SCRIPT), str(model_file),
                             str(where / "images.safetensors"), str(where / "out.safetensors")],
                            cwd=where, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return load_file(str(where / "out.safetensors"))


def test_a_fresh_python_with_safetensors_and_torch_predicts_as_ssdmpi_does(runs, tmp_path):
    pytest.importorskip("torch", reason="the script runs the model in PyTorch")
    pytest.importorskip("safetensors", reason="ssdmpi export needs safetensors")
    out = tmp_path / "lenet5.safetensors"
    assert run_cli(["export", str(runs["lenet5"]), "--out", str(out)]).returncode == 0
    raw, _ = digits_raw()
    got = predict_in_a_fresh_python(out, raw.astype(np.float32), tmp_path)
    model = ssdmpi.load_model(runs["lenet5"])
    assert got["classes"].tolist() == model.predict(raw).tolist()
    assert np.abs(got["logits"] - model.predict_logits(raw)).max() <= 1e-5


@pytest.mark.timeout(400)
@pytest.mark.skipif(not os.path.isdir(FASHION), reason=f"Debian's dataset-fashion-mnist is not installed ({FASHION})")
def test_an_exported_fashion_mnist_lenet5_predicts_1000_raw_images_as_ssdmpi_does(tmp_path):
    pytest.importorskip("torch", reason="the script runs the model in PyTorch")
    pytest.importorskip("safetensors", reason="ssdmpi export needs safetensors")
    from ssdmpi.data import idx

    run_dir = tmp_path / "run"
    result = run_cli(["train", "--preset", "fashion-mnist-lenet5", "--steps", "300", "--run-dir", str(run_dir),
                      "--eval-every", "0", "--no-progress-bar"], ranks=2, timeout=360)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "fashion.safetensors"
    assert run_cli(["export", str(run_dir), "--out", str(out)]).returncode == 0
    raw = idx.read_split_dir(FASHION)["test_images"][:1000]         # uint8 0..255, (1000, 1, 28, 28)
    got = predict_in_a_fresh_python(out, raw, tmp_path)
    model = ssdmpi.load_model(run_dir)
    want = model.predict(raw)
    assert got["classes"].tolist() == want.tolist()
    assert np.abs(got["logits"] - model.predict_logits(raw)).max() <= 1e-5
    assert (want == idx.read_split_dir(FASHION)["test_labels"][:1000]).mean() > 0.6      # it learned something
    datasets.clear_cache()
