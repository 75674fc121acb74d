"""Datasets in every format load, normalise as documented, and survive 'ssdmpi data convert'.

The tests write small datasets in each format themselves (IDX gz/raw, CIFAR-10 pickles,
HDF5) and check the loaded arrays against an independent float64 implementation of the
documented normalisation.
"""

import os
import time

import h5py
import numpy as np
import pytest

from ssdmpi.data import cifar, datasets, idx, load_dataset
from tests.conftest import run_cli
from tests.unit.test_data_digits import documented_split, stdlib_table  # the digits file and split, independently

FASHION = "/usr/share/datasets/fashion-mnist"


def expected_normalised(train_scaled, test_scaled):
    """The documented normalisation, in float64: per-channel train mean/std (ddof=0)."""
    train_scaled = np.asarray(train_scaled, np.float64)
    mean = train_scaled.mean(axis=(0, 2, 3), keepdims=True)
    std = train_scaled.std(axis=(0, 2, 3), keepdims=True)
    return (train_scaled - mean) / std, (np.asarray(test_scaled, np.float64) - mean) / std


def make_idx_dir(directory, n_train=60, n_test=25, shape=(7, 5), gz=True, dotted=False, seed=0):
    """Write a small MNIST-like IDX dataset; return its raw arrays."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    arrays = {
        ("train", "images"): rng.integers(0, 256, (n_train,) + shape, dtype=np.uint8),
        ("train", "labels"): rng.integers(0, 10, n_train, dtype=np.uint8),
        ("test", "images"): rng.integers(0, 256, (n_test,) + shape, dtype=np.uint8),
        ("test", "labels"): rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for key, array in arrays.items():
        stem = idx.FILES[key].replace("-idx", ".idx") if dotted else idx.FILES[key]
        idx.write_idx(os.path.join(directory, stem + (".gz" if gz else "")), array)
    return arrays


def make_cifar_dir(directory, per_batch=8, seed=0):
    """Write a small CIFAR-10 python-batch directory (5 train batches + test); return the arrays."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    # Channels with different brightness, so a per-channel bug cannot hide.
    def images(n):
        return np.stack([rng.integers(lo, lo + 100, (n, 32, 32)) for lo in (0, 70, 150)], axis=1).astype(np.uint8)
    train_x, train_y = [], []
    for name in cifar.TRAIN_BATCHES:
        x, y = images(per_batch), rng.integers(0, 10, per_batch)
        cifar.write_batch(os.path.join(directory, name), x, y)
        train_x.append(x)
        train_y.append(y)
    test_x, test_y = images(per_batch), rng.integers(0, 10, per_batch)
    cifar.write_batch(os.path.join(directory, cifar.TEST_BATCH), test_x, test_y)
    return np.concatenate(train_x), np.concatenate(train_y), test_x, test_y


def make_hdf5(path, train_images, train_labels, test_images, test_labels, **attrs):
    with h5py.File(path, "w") as f:
        f["train/images"], f["train/labels"] = train_images, train_labels
        f["test/images"], f["test/labels"] = test_images, test_labels
        f.attrs.update(attrs)


def assert_same_dataset(a, b):
    for field in ("train_x", "train_y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert a.input_shape == b.input_shape and a.num_classes == b.num_classes


# ---------------------------------------------------------------------------- built-in default

def test_digits_is_builtin_with_the_documented_split_and_normalisation():
    ds = load_dataset("digits")
    assert (ds.num_train, ds.num_test, ds.input_shape, ds.num_classes) == (1437, 360, (1, 8, 8), 10)
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int64
    table = np.array(stdlib_table())
    images, target = table[:, :-1].reshape(-1, 1, 8, 8) / 16.0, table[:, -1]
    train, test = documented_split(target.tolist())
    want_train, want_test = expected_normalised(images[train], images[test])
    np.testing.assert_allclose(ds.train_x, want_train, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ds.test_x, want_test, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ds.train_y, target[train])
    np.testing.assert_array_equal(ds.test_y, target[test])
    # Dataset.mean/std undo the normalisation back to [0, 1] pixels, and scale takes the file's 0..16 there.
    np.testing.assert_allclose(ds.train_x * ds.std[0] + ds.mean[0], images[train], atol=1e-5)
    np.testing.assert_allclose(ds.train_x, (table[train, :-1].reshape(-1, 1, 8, 8) * ds.scale - ds.mean[0]) / ds.std[0],
                               atol=1e-5)


def test_datasets_are_cached_and_read_only():
    a = load_dataset("digits")
    assert load_dataset("digits") is a
    with pytest.raises(ValueError):
        a.train_x[0, 0, 0, 0] = 1.0   # shared by every caller: must not be writable


# ---------------------------------------------------------------------------- IDX

@pytest.mark.parametrize("gz,dotted", [(True, False), (False, False), (True, True)],
                         ids=["gzipped", "raw", "dotted-names"])
def test_idx_files_load_and_match_the_normalisation_oracle(tmp_path, gz, dotted):
    arrays = make_idx_dir(tmp_path / "mnist", gz=gz, dotted=dotted)
    ds = load_dataset("mnist", str(tmp_path / "mnist"))
    assert (ds.num_train, ds.num_test, ds.input_shape, ds.num_classes) == (60, 25, (1, 7, 5), 10)
    want_train, want_test = expected_normalised(arrays["train", "images"][:, None] / 255.0,
                                                arrays["test", "images"][:, None] / 255.0)
    np.testing.assert_allclose(ds.train_x, want_train, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ds.test_x, want_test, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(ds.train_y, arrays["train", "labels"])
    np.testing.assert_array_equal(ds.test_y, arrays["test", "labels"])
    assert ds.train_y.dtype == np.int64


def test_gzipped_and_raw_idx_give_identical_datasets(tmp_path):
    make_idx_dir(tmp_path / "gz", gz=True, seed=3)
    make_idx_dir(tmp_path / "raw", gz=False, seed=3)
    assert_same_dataset(load_dataset("fashion-mnist", str(tmp_path / "gz")),
                        load_dataset("fashion-mnist", str(tmp_path / "raw")))


def test_fashion_mnist_is_found_through_the_data_root(tmp_path, monkeypatch):
    make_idx_dir(tmp_path / "fashion-mnist", seed=5)
    monkeypatch.setenv("SSDMPI_DATA", str(tmp_path))
    assert load_dataset("fashion-mnist").source == str(tmp_path / "fashion-mnist")


def test_cache_notices_a_rewritten_file(tmp_path):
    make_idx_dir(tmp_path, seed=1)
    first = load_dataset("mnist", str(tmp_path))
    time.sleep(0.01)
    make_idx_dir(tmp_path, n_train=61, seed=2)
    second = load_dataset("mnist", str(tmp_path))
    assert (first.num_train, second.num_train) == (60, 61)


# ---------------------------------------------------------------------------- CIFAR-10

@pytest.mark.parametrize("give", ["batches-dir", "parent-dir"])
def test_cifar10_batches_load_per_channel(tmp_path, give):
    train_x, train_y, test_x, test_y = make_cifar_dir(tmp_path / "cifar-10-batches-py")
    ds = load_dataset("cifar10", str(tmp_path / "cifar-10-batches-py" if give == "batches-dir" else tmp_path))
    assert (ds.num_train, ds.num_test, ds.input_shape, ds.num_classes) == (40, 8, (3, 32, 32), 10)
    want_train, want_test = expected_normalised(train_x / 255.0, test_x / 255.0)
    np.testing.assert_allclose(ds.train_x, want_train, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ds.test_x, want_test, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(ds.train_y, train_y)
    np.testing.assert_array_equal(ds.test_y, test_y)
    assert len(set(np.round(ds.mean, 3))) == 3   # three different channel means were used


# ---------------------------------------------------------------------------- HDF5

def test_hdf5_uint8_nhw_layout_without_attributes(tmp_path):
    rng = np.random.default_rng(0)
    tr, te = rng.integers(0, 256, (30, 6, 6), dtype=np.uint8), rng.integers(0, 256, (10, 6, 6), dtype=np.uint8)
    make_hdf5(tmp_path / "d.h5", tr, np.arange(30) % 4, te, np.arange(10) % 3)
    ds = load_dataset("hdf5", str(tmp_path / "d.h5"))
    assert ds.input_shape == (1, 6, 6) and ds.num_classes == 4   # 1 + the largest label
    want_train, _ = expected_normalised(tr[:, None] / 255.0, te[:, None] / 255.0)
    np.testing.assert_allclose(ds.train_x, want_train, rtol=1e-6, atol=1e-6)


def test_hdf5_float_images_are_taken_as_scaled(tmp_path):
    rng = np.random.default_rng(1)
    tr, te = rng.random((20, 2, 3, 3)).astype(np.float32), rng.random((5, 2, 3, 3)).astype(np.float32)
    make_hdf5(tmp_path / "d.h5", tr, np.zeros(20, np.int32), te, np.ones(5, np.int32), num_classes=7)
    ds = load_dataset("hdf5", str(tmp_path / "d.h5"))
    assert ds.num_classes == 7
    want_train, want_test = expected_normalised(tr, te)
    np.testing.assert_allclose(ds.train_x, want_train, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ds.test_x, want_test, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- synthetic

def test_synthetic_is_seeded_and_takes_string_options():
    a = load_dataset("synthetic", num_train=200, num_test=50, input_shape="3,4,4", num_classes=5, seed=3)
    b = load_dataset("synthetic", num_train="200", num_test="50", input_shape=(3, 4, 4), num_classes="5", seed="3")
    c = load_dataset("synthetic", num_train=200, num_test=50, input_shape=(3, 4, 4), num_classes=5, seed=4)
    assert a is b   # the same options, however spelled, hit the cache
    assert (a.num_train, a.num_test, a.input_shape, a.num_classes) == (200, 50, (3, 4, 4), 5)
    assert not np.array_equal(a.train_x, c.train_x)
    assert np.bincount(a.train_y).tolist() == [40] * 5   # balanced classes


def test_synthetic_is_learnable():
    ds = load_dataset("synthetic", num_train=2000, num_test=500, input_shape=(1, 8, 8), seed=1)
    # Nearest class mean (the Bayes-optimal rule for these equal-covariance Gaussians).
    flat_train, flat_test = ds.train_x.reshape(ds.num_train, -1), ds.test_x.reshape(ds.num_test, -1)
    centroids = np.stack([flat_train[ds.train_y == k].mean(0) for k in range(ds.num_classes)])
    pred = np.argmin(((flat_test[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (pred == ds.test_y).mean() > 0.9          # learnable ...
    shuffled = np.random.default_rng(0).permutation(ds.test_y)
    assert (pred == shuffled).mean() < 0.3           # ... and the accuracy means something


# ---------------------------------------------------------------------------- data convert

def _sources(tmp_path):
    make_idx_dir(tmp_path / "idx-gz", gz=True, seed=7)
    make_idx_dir(tmp_path / "idx-raw", gz=False, seed=8)
    make_cifar_dir(tmp_path / "cifar")
    rng = np.random.default_rng(2)
    make_hdf5(tmp_path / "in.h5", rng.random((12, 1, 4, 4)), np.arange(12) % 3, rng.random((4, 1, 4, 4)),
              np.arange(4) % 3, num_classes=3)
    return {
        "idx-gz": ["mnist", "--data-path", str(tmp_path / "idx-gz")],
        "idx-raw": ["fashion-mnist", "--data-path", str(tmp_path / "idx-raw")],
        "cifar10": ["cifar10", "--data-path", str(tmp_path / "cifar")],
        "hdf5": ["hdf5", "--data-path", str(tmp_path / "in.h5")],
        "digits": ["digits"],
        "synthetic": ["synthetic", "-o", "num_train=64", "-o", "num_test=16", "-o", "input_shape=2,3,3"],
    }


@pytest.mark.parametrize("fmt", ["idx-gz", "idx-raw", "cifar10", "hdf5", "digits", "synthetic"])
def test_convert_round_trip_gives_the_same_dataset(tmp_path, fmt):
    args = _sources(tmp_path)[fmt]
    out = tmp_path / "out.h5"
    result = run_cli(["data", "convert"] + args + ["--out", str(out)])
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
    options = {"num_train": 64, "num_test": 16, "input_shape": (2, 3, 3)} if fmt == "synthetic" else {}
    path = args[2] if len(args) > 2 and args[1] == "--data-path" else None
    original = load_dataset(args[0], path, **options)
    converted = load_dataset("hdf5", str(out))
    assert_same_dataset(original, converted)
    with h5py.File(out, "r") as f:
        assert f.attrs["name"] == original.name and f.attrs["num_classes"] == original.num_classes
        if fmt in ("idx-gz", "cifar10"):
            assert f["train/images"].dtype == np.uint8   # stored un-normalised, compactly
    assert os.listdir(tmp_path).count("out.h5") == 1 and not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_convert_refuses_to_overwrite_unless_forced(tmp_path):
    out = tmp_path / "out.h5"
    out.write_bytes(b"precious")
    result = run_cli(["data", "convert", "digits", "--out", str(out)])
    assert result.returncode == 2 and "--force" in result.stderr and "Traceback" not in result.stderr
    assert out.read_bytes() == b"precious"
    result = run_cli(["data", "convert", "digits", "--out", str(out), "--force", "--compress"])
    assert result.returncode == 0, result.stderr
    assert load_dataset("hdf5", str(out)).num_train == 1437
    assert sorted(os.listdir(tmp_path)) == ["out.h5"]   # no temporary file left behind


def test_write_hdf5_failure_leaves_no_file(tmp_path, monkeypatch):
    from ssdmpi.data import hdf5

    raw = datasets.load_raw("digits")
    raw.train_labels = None   # makes the write fail half-way
    with pytest.raises(TypeError):
        hdf5.write_hdf5(str(tmp_path / "x.h5"), raw)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------- data list / Debian package

def test_data_list_says_where_each_dataset_is_looked_for(tmp_path):
    make_idx_dir(tmp_path / "mnist")
    result = run_cli(["data", "list", "--json"], env={"SSDMPI_DATA": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    import json
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert set(rows) == set(datasets.DATASETS)
    assert rows["mnist"]["found"] == str(tmp_path / "mnist")
    assert str(tmp_path / "cifar-10-batches-py") in rows["cifar10"]["looked_in"]
    assert "/usr/share/datasets/fashion-mnist" in rows["fashion-mnist"]["looked_in"]
    text = run_cli(["data", "list"]).stdout
    assert "digits" in text and "looked in" in text


@pytest.mark.skipif(not os.path.isdir(FASHION), reason=f"Debian's dataset-fashion-mnist is not installed ({FASHION})")
def test_fashion_mnist_from_the_debian_package():
    datasets.clear_cache()
    ds = load_dataset("fashion-mnist")
    assert ds.source == FASHION
    assert (ds.num_train, ds.num_test, ds.input_shape, ds.num_classes) == (60000, 10000, (1, 28, 28), 10)
    assert np.bincount(ds.train_y).tolist() == [6000] * 10 and np.bincount(ds.test_y).tolist() == [1000] * 10
    assert abs(float(ds.train_x.mean())) < 1e-4 and abs(float(ds.train_x.std()) - 1) < 1e-4
    assert 0.28 < ds.mean[0] < 0.29 and 0.35 < ds.std[0] < 0.36   # the well-known Fashion-MNIST statistics
    assert load_dataset("fashion-mnist") is ds   # cached: the second load decodes nothing


def test_convert_under_mpiexec_writes_once(tmp_path):
    out = tmp_path / "digits.h5"
    result = run_cli(["data", "convert", "digits", "--out", str(out)], ranks=2)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("wrote") == 1   # rank 0 alone converts and reports
    assert load_dataset("hdf5", str(out)).num_test == 360
