"""How datasets are named and their labels reported to users: an HDF5 file by its own name and
path (not as "hdf5"), a label-range error by the count of bad labels."""

import h5py
import numpy as np
import pytest

from ssdmpi.data import datasets, from_arrays, load_dataset
from ssdmpi.data.hdf5 import write_hdf5
from ssdmpi.errors import UserError
from tests.conftest import run_cli


def test_an_hdf5_file_is_named_as_it_names_itself_with_its_path(tmp_path):
    converted = tmp_path / "mine.h5"
    write_hdf5(str(converted), datasets.load_raw("digits"))
    assert load_dataset("hdf5", str(converted)).name == f"digits (HDF5 file {converted})"
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:      # written by hand, without a name attribute: the file's own name
        f["train/images"], f["train/labels"] = np.zeros((4, 3), np.float32), np.array([0, 1, 0, 1])
        f["test/images"], f["test/labels"] = np.zeros((2, 3), np.float32), np.array([0, 1])
    assert load_dataset("hdf5", str(plain)).name == f"plain (HDF5 file {plain})"
    result = run_cli(["train", "--dataset", "hdf5", "--data-path", str(converted), "--run-dir", str(tmp_path / "run"),
                      "--steps", "2", "--algo", "ssgd", "--batch-size", "8", "--eval-every", "0", "--no-progress-bar"])
    assert result.returncode == 0, result.stderr
    assert f"digits (HDF5 file {converted})" in result.stdout and " hdf5 (" not in result.stdout, result.stdout


def test_labels_out_of_range_are_counted_as_labels():
    x = np.zeros((20, 3), np.float32)
    y = np.array([10] * 16 + [0, 1, 2, 3])
    with pytest.raises(UserError, match=r"train labels out of range: 16 labels outside \[0, 10\), e\.g\. 10$"):
        from_arrays(x, y, x[:2], np.array([0, 1]), num_classes=10)
    with pytest.raises(UserError, match=r"test labels out of range: 1 label outside \[0, 10\), e\.g\. -1$"):
        from_arrays(x, np.zeros(20, np.int64), x[:2], np.array([0, -1]), num_classes=10)
