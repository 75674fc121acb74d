"""The built-in digits file: shipped in the package, read without scikit-learn, identical to it;
its split: stratified, shuffled with a fixed seed, the same everywhere.

The oracle for the parsed arrays is an independent stdlib parse of the file (csv + gzip);
where scikit-learn is importable, its ``load_digits`` is a second oracle, bit for bit. The
oracle for the split is ``documented_split``, the rule of ``ssdmpi/data/digits.py``'s docstring
written again with the standard library.
"""

import collections
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


def documented_split(labels, test_size=360, seed=0):
    """``(train rows, test rows)`` by the rule ssdmpi/data/digits.py documents, in plain Python."""
    counts = collections.Counter(labels)
    total = sum(counts.values())
    quota = {c: test_size * n // total for c, n in counts.items()}
    by_remainder = sorted(counts, key=lambda c: (-(test_size * counts[c] - quota[c] * total), c))
    for c in by_remainder[:test_size - sum(quota.values())]:
        quota[c] += 1
    test = set()
    for c in counts:
        rows = [i for i, label in enumerate(labels) if label == c]
        rows.sort(key=lambda i: hashlib.sha256(f"ssdmpi-digits-split:{seed}:{i}".encode()).hexdigest())
        test.update(rows[:quota[c]])
    return [i for i in range(len(labels)) if i not in test], sorted(test)


def test_the_shipped_file_is_the_known_one():
    with open(digits.DIGITS_FILE, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == digits.DIGITS_SHA256
    rows = stdlib_table()
    assert len(rows) == 1797 and {len(r) for r in rows} == {65}
    labels = np.array([r[-1] for r in rows])
    pixels = np.array([r[:-1] for r in rows])
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
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
    # The splits: scikit-learn's arrays, float32 / 16, at the documented rows.
    raw = datasets.load_raw("digits")
    images = (want_data.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    train, test = documented_split(want_target.tolist())
    assert raw.train_images.tobytes() == images[train].tobytes()
    assert raw.test_images.tobytes() == images[test].tobytes()
    assert raw.train_labels.tobytes() == want_target[train].tobytes()
    assert raw.test_labels.tobytes() == want_target[test].tobytes()


def test_the_split_is_stratified_shuffled_disjoint_and_documented():
    labels = [row[-1] for row in stdlib_table()]
    train, test = digits.split_indices(np.array(labels))
    want_train, want_test = documented_split(labels)
    assert train.tolist() == want_train and test.tolist() == want_test       # the rule as documented
    assert len(test) == 360 and len(train) == 1437
    assert not set(train.tolist()) & set(test.tolist()) and sorted(train.tolist() + test.tolist()) == list(range(1797))
    # Stratified: each class's share of the test split is its share of the file, within one sample.
    per_class, in_test = collections.Counter(labels), collections.Counter(labels[i] for i in test)
    for c, n in per_class.items():
        assert abs(in_test[c] - 360 * n / 1797) < 1, (c, in_test[c], n)
    # Shuffled, not the file's order: the old split (the last 360 rows) is not it.
    assert test.tolist() != list(range(1437, 1797)) and min(test) < 100 and max(test) > 1700
    # Deterministic: the same rows every call; another seed gives other rows.
    assert digits.split_indices(np.array(labels))[1].tolist() == test.tolist()
    assert digits.split_indices(np.array(labels), seed=1)[1].tolist() != test.tolist()
    assert digits.split_indices(np.array(labels), seed=1)[1].tolist() == documented_split(labels, seed=1)[1]
    # The seed and the rule are stated where users read them.
    assert digits.SPLIT_SEED == 0 and "SPLIT_SEED`` = 0" in digits.__doc__
    text = " ".join(datasets.__doc__.split())
    assert "stratified by class and shuffled with a fixed seed" in text


def test_load_dataset_uses_the_split():
    ds = load_dataset("digits")
    labels = [row[-1] for row in stdlib_table()]
    train, test = documented_split(labels)
    assert ds.train_y.tolist() == [labels[i] for i in train] and ds.test_y.tolist() == [labels[i] for i in test]


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
