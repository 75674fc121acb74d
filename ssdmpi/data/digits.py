"""The built-in ``digits`` dataset: read the copy shipped in this package, offline.

``digits.csv.gz`` beside this module is the 8x8 optical-recognition digits set
(UCI dataset 80; notice and licences in ``digits.LICENSE.txt``), byte for byte the
file scikit-learn ships. It is 1,797 rows of 65 comma-separated integers: 64
pixels (row-major 8x8, values 0..16) and the label (0..9); no header.

``read_digits()`` returns the same arrays, bit for bit, as scikit-learn's
``load_digits(return_X_y=True)``: it parses the file the same way (NumPy's
``loadtxt`` into float64), with the standard library and NumPy only.

The split (``split_indices``): 360 test samples (20%) and 1,437 train, stratified by class and
shuffled with a fixed seed, the same on every machine:

1. class ``c`` (``n_c`` samples) gets ``floor(360 * n_c / 1797)`` test samples; the classes
   with the largest remainders of ``360 * n_c / 1797`` get one more each (ties: the smaller
   class label first) until there are 360;
2. within class ``c``, the test samples are those with the smallest keys
   ``sha256(f"ssdmpi-digits-split:{seed}:{i}")`` (``i``: the row number in the file, from 0;
   ``seed``: ``SPLIT_SEED`` = 0), a shuffle that depends on no random-number library;
3. both splits keep the file's order.

Per class, the test split holds 35 to 37 samples and the train split 139 to 146. (The file's
order is not random: its last 360 rows are harder to classify than a random fifth of it, so
testing on them understates what a model learned.)
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os

import numpy as np

from ssdmpi.errors import UserError

DIGITS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv.gz")
DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"   # of the .gz file
DIGITS_SHAPE = (1797, 64)
TEST_SIZE = 360       # of 1,797: 20%
SPLIT_SEED = 0


def read_digits(path: str = DIGITS_FILE) -> tuple[np.ndarray, np.ndarray]:
    """(data, target): data (1797, 64) float64 pixels 0..16, target (1797,) int64 labels 0..9.

    UserError if the file is missing or not in the layout above (a broken install).
    """
    if not os.path.isfile(path):
        raise UserError(f"the built-in digits file is missing ({path}); reinstall ssdmpi")
    try:
        with gzip.open(path) as raw:
            table = np.loadtxt(io.TextIOWrapper(raw, encoding="utf-8"), delimiter=",")
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"cannot read the built-in digits file {path} ({exc}); reinstall ssdmpi") from None
    if table.ndim != 2 or table.shape[1] != DIGITS_SHAPE[1] + 1:
        raise UserError(f"{path}: expected rows of {DIGITS_SHAPE[1] + 1} values, got shape {table.shape}; "
                        "reinstall ssdmpi")
    return table[:, :-1], table[:, -1].astype(np.int64)


def split_indices(target, test_size: int = TEST_SIZE, seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """``(train rows, test rows)``: the stratified, shuffled split of the module docstring, each an
    ascending int64 array of row numbers of ``target`` (the labels, in the file's order)."""
    target = np.asarray(target)
    classes, counts = np.unique(target, return_counts=True)
    total = int(counts.sum())
    quota = [test_size * int(n) // total for n in counts]
    remainders = sorted(range(len(classes)), key=lambda c: (-(test_size * int(counts[c]) % total), int(classes[c])))
    for c in remainders[:test_size - sum(quota)]:
        quota[c] += 1
    test = []
    for label, k in zip(classes, quota):
        rows = np.flatnonzero(target == label)
        keys = [hashlib.sha256(f"ssdmpi-digits-split:{seed}:{int(i)}".encode()).hexdigest() for i in rows]
        test += [int(rows[j]) for j in sorted(range(len(rows)), key=keys.__getitem__)[:k]]
    is_test = np.zeros(len(target), dtype=bool)
    is_test[test] = True
    return np.flatnonzero(~is_test).astype(np.int64), np.flatnonzero(is_test).astype(np.int64)
