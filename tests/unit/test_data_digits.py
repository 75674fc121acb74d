"""The built-in digits file: shipped in the package, read without scikit-learn, identical to it.

The oracle for the parsed arrays is an independent stdlib parse of the file (csv + gzip);
where scikit-learn is importable, its ``load_digits`` is a second oracle, bit for bit.
"""

import csv
import gzip
import hashlib
import importlib.util
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from ssdmpi.data import datasets, digits, load_dataset
from ssdmpi.errors import UserError
from tests.conftest import ROOT


def stdlib_table():
    """The shipped file parsed with the standard library only: a list of 65-int rows."""
    with gzip.open(digits.DIGITS_FILE, "rt", encoding="ascii", newline="") as f:
        return [[int(v) for v in row] for row in csv.reader(f)]


def test_the_shipped_file_is_the_known_one():
    with open(digits.DIGITS_FILE, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == digits.DIGITS_SHA256
    rows = stdlib_table()
    assert len(rows) == 1797 and {len(r) for r in rows} == {65}
    labels = np.array([r[-1] for r in rows])
    pixels = np.array([r[:-1] for r in rows])
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert np.bincount(labels[:1437]).tolist() == [143, 146, 142, 146, 144, 145, 144, 143, 141, 143]
    assert (pixels.min(), pixels.max()) == (0, 16)


def test_read_digits_matches_an_independent_parse():
    data, target = digits.read_digits()
    rows = np.array(stdlib_table())
    assert data.shape == digits.DIGITS_SHAPE and data.dtype == np.float64
    assert target.shape == (1797,) and target.dtype == np.int64
    np.testing.assert_array_equal(data, rows[:, :-1].astype(np.float64))
    np.testing.assert_array_equal(target, rows[:, -1])


def test_read_digits_is_bit_identical_to_scikit_learn():
    sk = pytest.importorskip("sklearn.datasets", reason="scikit-learn is not installed (an optional oracle)")
    want_data, want_target = sk.load_digits(return_X_y=True)
    data, target = digits.read_digits()
    assert (data.dtype, data.shape, target.dtype, target.shape) == \
        (want_data.dtype, want_data.shape, want_target.dtype, want_target.shape)
    assert data.tobytes() == want_data.tobytes() and target.tobytes() == want_target.tobytes()
    # What the loader stored before the file was shipped: scikit-learn's arrays, float32 / 16.
    raw = datasets.load_raw("digits")
    images = (want_data.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    assert raw.train_images.tobytes() == images[:1437].tobytes()
    assert raw.test_images.tobytes() == images[1437:].tobytes()
    assert raw.train_labels.tobytes() == want_target[:1437].tobytes()
    assert raw.test_labels.tobytes() == want_target[1437:].tobytes()


def test_digits_loads_with_scikit_learn_unimportable(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)   # any `import sklearn` now raises ImportError
    datasets.clear_cache()
    try:
        ds = load_dataset("digits")
    finally:
        datasets.clear_cache()
    assert (ds.num_train, ds.num_test, ds.source) == (1437, 360, digits.DIGITS_FILE)
    assert datasets.search_paths("digits") == [digits.DIGITS_FILE]


def test_a_missing_or_broken_digits_file_is_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="built-in digits file is missing .*; reinstall ssdmpi"):
        digits.read_digits(str(tmp_path / "nope.csv.gz"))
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(UserError, match="cannot read the built-in digits file .*; reinstall ssdmpi"):
        digits.read_digits(str(bad))
    short = tmp_path / "short.csv.gz"
    with gzip.open(short, "wt") as f:
        f.write("1,2,3\n4,5,6\n")
    with pytest.raises(UserError, match=r"expected rows of 65 values, got shape \(2, 3\)"):
        digits.read_digits(str(short))


@pytest.mark.timeout(180)
def test_the_wheel_ships_the_digits_file_and_its_notice(tmp_path):
    setuptools = pytest.importorskip("setuptools", reason="building the wheel needs setuptools")
    if importlib.util.find_spec("wheel") is None and \
            tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (70, 1):
        pytest.skip(f"setuptools {setuptools.__version__} without the 'wheel' package cannot build a wheel "
                    "offline (pip install wheel, or setuptools >= 70.1)")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for tree in ("ssdmpi", "bin"):
        shutil.copytree(ROOT / tree, src / tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "whl"), str(src)], capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "whl").glob("ssdmpi-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ssdmpi/data/digits.csv.gz" in names and "ssdmpi/data/digits.LICENSE.txt" in names
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        shipped = z.read("ssdmpi/data/digits.csv.gz")
    assert hashlib.sha256(shipped).hexdigest() == digits.DIGITS_SHA256
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and not any("scikit" in line.lower() for line in requires)
