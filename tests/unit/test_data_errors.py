"""Bad data is a one-line UserError naming the problem and the fix; the CLI exits 2 without a traceback.

Each case builds a broken dataset in a temporary directory, then checks both the library
(``load_dataset`` raises ``UserError`` with the key words) and the command line
(``ssdmpi data convert`` exits 2 and prints exactly one line).
"""

import gzip
import os
import pickle

import h5py
import numpy as np
import pytest

from ssdmpi.data import cifar, idx, load_dataset
from ssdmpi.errors import UserError
from tests.conftest import run_cli
from tests.unit.test_data_formats import make_cifar_dir, make_hdf5, make_idx_dir


def _idx_path(directory, key, gz=True):
    return os.path.join(directory, idx.FILES[key] + (".gz" if gz else ""))


def truncated_gzip(d):
    make_idx_dir(d)
    path = _idx_path(d, ("train", "images"))
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


def truncated_raw(d):
    make_idx_dir(d, gz=False)
    path = _idx_path(d, ("test", "images"), gz=False)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-7])


def not_gzip(d):
    make_idx_dir(d)
    path = _idx_path(d, ("train", "labels"))
    open(path, "wb").write(gzip.decompress(open(path, "rb").read()))   # raw bytes under a .gz name


def wrong_magic(d):
    make_idx_dir(d)
    path = _idx_path(d, ("train", "images"))
    data = bytearray(gzip.decompress(open(path, "rb").read()))
    data[3] = 1   # claims 1 dimension: a labels file where an images file belongs
    open(path, "wb").write(gzip.compress(bytes(data)))


def count_mismatch(d):
    make_idx_dir(d)
    idx.write_idx(_idx_path(d, ("train", "labels")), np.zeros(59, np.uint8))


def idx_labels_out_of_range(d):
    make_idx_dir(d)
    idx.write_idx(_idx_path(d, ("test", "labels")), np.full(25, 10, np.uint8))


def missing_file(d):
    make_idx_dir(d)
    os.unlink(_idx_path(d, ("test", "labels")))


def cifar_missing_batch(d):
    make_cifar_dir(d)
    os.unlink(os.path.join(d, "data_batch_3"))


def cifar_not_a_batch(d):
    make_cifar_dir(d)
    with open(os.path.join(d, "test_batch"), "wb") as f:
        pickle.dump([1, 2, 3], f)


def cifar_code_in_pickle(d):
    make_cifar_dir(d)
    with open(os.path.join(d, "test_batch"), "wb") as f:
        pickle.dump(os.system, f)   # a pickle that would import and call os.system: refused


def cifar_labels_out_of_range(d):
    make_cifar_dir(d)
    cifar.write_batch(os.path.join(d, "data_batch_2"), np.zeros((8, 3, 32, 32), np.uint8), [0] * 7 + [12])


def hdf5_missing_datasets(d):
    with h5py.File(os.path.join(d, "d.h5"), "w") as f:
        f["train/images"] = np.zeros((4, 3, 3), np.uint8)
        f["train/labels"] = np.zeros(4, np.int64)


def hdf5_labels_out_of_range(d):
    make_hdf5(os.path.join(d, "d.h5"), np.zeros((4, 3, 3), np.uint8), [0, 1, 2, 3], np.zeros((2, 3, 3), np.uint8),
              [0, 1], num_classes=3)


def hdf5_negative_label(d):
    make_hdf5(os.path.join(d, "d.h5"), np.zeros((4, 3, 3), np.uint8), [0, 1, -1, 0], np.zeros((2, 3, 3), np.uint8),
              [0, 1])


def hdf5_count_mismatch(d):
    make_hdf5(os.path.join(d, "d.h5"), np.zeros((4, 3, 3), np.uint8), [0, 1, 0], np.zeros((2, 3, 3), np.uint8),
              [0, 1])


def hdf5_not_hdf5(d):
    open(os.path.join(d, "d.h5"), "w").write("not an HDF5 file\n")


def hdf5_bad_dtype(d):
    make_hdf5(os.path.join(d, "d.h5"), np.zeros((4, 3, 3), np.int32), [0, 1, 0, 1], np.zeros((2, 3, 3), np.int32),
              [0, 1])


# (name, what goes in the directory, dataset path relative to it, words the message must contain)
CASES = {
    "truncated-gzip-idx": ("mnist", truncated_gzip, ".", ["train-images-idx3-ubyte.gz", "truncated"]),
    "truncated-raw-idx": ("mnist", truncated_raw, ".", ["t10k-images-idx3-ubyte", "truncated"]),
    "non-gzip-idx": ("mnist", not_gzip, ".", ["not a gzip file"]),
    "wrong-magic": ("fashion-mnist", wrong_magic, ".", ["magic number", "0x00000801"]),
    "count-mismatch": ("mnist", count_mismatch, ".", ["60 images but 59 labels"]),
    "idx-labels-out-of-range": ("mnist", idx_labels_out_of_range, ".", ["labels out of range", "[0, 10)"]),
    "idx-missing-file": ("mnist", missing_file, ".", ["t10k-labels-idx1-ubyte"]),
    "cifar-missing-batch": ("cifar10", cifar_missing_batch, ".", ["data_batch_3", "cifar-10-python.tar.gz"]),
    "cifar-not-a-batch": ("cifar10", cifar_not_a_batch, ".", ["test_batch", "not a CIFAR-10 python batch"]),
    "cifar-code-in-pickle": ("cifar10", cifar_code_in_pickle, ".", ["refusing to load"]),
    "cifar-labels-out-of-range": ("cifar10", cifar_labels_out_of_range, ".", ["labels out of range", "12"]),
    "hdf5-missing-datasets": ("hdf5", hdf5_missing_datasets, "d.h5", ["/test/images", "/test/labels", "missing"]),
    "hdf5-labels-out-of-range": ("hdf5", hdf5_labels_out_of_range, "d.h5", ["labels out of range", "[0, 3)"]),
    "hdf5-negative-label": ("hdf5", hdf5_negative_label, "d.h5", ["labels out of range", "-1"]),
    "hdf5-count-mismatch": ("hdf5", hdf5_count_mismatch, "d.h5", ["4 images but 3 labels"]),
    "hdf5-not-hdf5": ("hdf5", hdf5_not_hdf5, "d.h5", ["not a readable HDF5 file"]),
    "hdf5-bad-dtype": ("hdf5", hdf5_bad_dtype, "d.h5", ["uint8", "int32"]),
    "missing-directory": ("fashion-mnist", lambda d: None, "nowhere", ["no such directory", "nowhere",
                                                                     "apt-get install dataset-fashion-mnist"]),
    "missing-hdf5-file": ("hdf5", lambda d: None, "none.h5", ["no such HDF5 file", "none.h5"]),
}


def assert_one_line_exit_2(result, words):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ssdmpi: error: "), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize("case", list(CASES))
def test_bad_data_is_a_one_line_user_error(tmp_path, case):
    name, build, rel, words = CASES[case]
    build(str(tmp_path))
    path = str(tmp_path / rel)
    with pytest.raises(UserError) as info:
        load_dataset(name, path)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)
    assert_one_line_exit_2(run_cli(["data", "convert", name, "--data-path", path, "--out", str(tmp_path / "o.h5")]),
                           words)
    assert not (tmp_path / "o.h5").exists()


def test_missing_dataset_lists_every_place_looked_at_and_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SSDMPI_DATA", str(tmp_path / "root"))
    monkeypatch.chdir(tmp_path)
    looked = [str(tmp_path / "root" / "cifar-10-batches-py"), str(tmp_path / "data" / "cifar-10-batches-py"),
              "/usr/share/datasets/cifar-10-batches-py"]
    if os.path.isdir(looked[-1]):
        pytest.skip("CIFAR-10 is installed system-wide")
    with pytest.raises(UserError) as info:
        load_dataset("cifar10")
    for word in looked + ["https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"]:
        assert word in str(info.value)
    result = run_cli(["data", "convert", "cifar10", "--out", str(tmp_path / "o.h5")], cwd=tmp_path,
                     env={"SSDMPI_DATA": str(tmp_path / "root")})
    assert_one_line_exit_2(result, looked)


def test_unknown_dataset_name_lists_the_names(tmp_path):
    with pytest.raises(UserError, match="unknown dataset 'imagenet'; choose one of: digits, fashion-mnist"):
        load_dataset("imagenet")
    assert_one_line_exit_2(run_cli(["data", "convert", "imagenet", "--out", str(tmp_path / "o.h5")]),
                           ["imagenet", "digits", "cifar10", "hdf5", "synthetic"])


@pytest.mark.parametrize("kwargs,words", [
    ({"input_shape": "7"}, ["input_shape", "C,H,W"]),
    ({"num_classes": 1}, ["num_classes >= 2"]),
    ({"colour": "red"}, ["unknown option", "colour"]),
    ({"num_train": "many"}, ["bad option value"]),
])
def test_bad_synthetic_options(kwargs, words):
    with pytest.raises(UserError) as info:
        load_dataset("synthetic", **kwargs)
    for word in words:
        assert word in str(info.value)


def test_options_and_paths_where_none_belong():
    with pytest.raises(UserError, match="takes no options"):
        load_dataset("fashion-mnist", "/usr/share/datasets/fashion-mnist", num_train=5)
    with pytest.raises(UserError, match="takes no options"):   # whether or not the data is there
        load_dataset("fashion-mnist", "/nonexistent/fashion-mnist", num_train=5)
    with pytest.raises(UserError, match="takes no path"):
        load_dataset("digits", "/tmp")
    with pytest.raises(UserError, match="needs a path"):
        load_dataset("hdf5")


def test_bad_option_syntax_on_the_command_line(tmp_path):
    assert_one_line_exit_2(run_cli(["data", "convert", "synthetic", "-o", "num_train", "--out", str(tmp_path / "o")]),
                           ["KEY=VALUE"])
