"""The built-in ``digits`` dataset: read the copy shipped in this package, offline.

``digits.csv.gz`` beside this module is the 8x8 optical-recognition digits set
(UCI dataset 80; notice and licences in ``digits.LICENSE.txt``), byte for byte the
file scikit-learn ships. It is 1,797 rows of 65 comma-separated integers: 64
pixels (row-major 8x8, values 0..16) and the label (0..9); no header.

``read_digits()`` returns the same arrays, bit for bit, as scikit-learn's
``load_digits(return_X_y=True)``: it parses the file the same way (NumPy's
``loadtxt`` into float64), with the standard library and NumPy only.
"""

from __future__ import annotations

import gzip
import io
import os

import numpy as np

from ssdmpi.errors import UserError

DIGITS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv.gz")
DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"   # of the .gz file
DIGITS_SHAPE = (1797, 64)


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
