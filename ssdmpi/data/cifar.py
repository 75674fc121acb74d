"""CIFAR-10 "python version" batches: ``cifar-10-batches-py/{data_batch_1..5,test_batch}``.

Each batch is a pickle of a dict with ``b"data"`` (10000 x 3072 uint8, each row a
32x32 image as 1024 red, then 1024 green, then 1024 blue values, row-major) and
``b"labels"`` (10000 ints in 0..9). Pickles can run code when loaded, so they are
read with an unpickler that only accepts the few NumPy and builtin names such a
batch contains.
"""

from __future__ import annotations

import io
import os
import pickle

import numpy as np

from ssdmpi.errors import UserError

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
SHAPE = (3, 32, 32)
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def read_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> (images (N, 3, 32, 32) uint8, labels (N,) int64); UserError if malformed."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        batch = _SafeUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as exc:  # truncated or foreign pickles raise many different types
        raise UserError(f"{path}: not a CIFAR-10 python batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(batch, dict):
        raise UserError(f"{path}: not a CIFAR-10 python batch (a pickled {type(batch).__name__}, not a dict)")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise UserError(f"{path}: CIFAR-10 batch without 'data' and 'labels' entries (has {sorted(batch)})")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"])
    per_image = int(np.prod(SHAPE))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != per_image:
        raise UserError(f"{path}: CIFAR-10 'data' must be N x {per_image} uint8, got {data.shape} {data.dtype}")
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise UserError(f"{path}: CIFAR-10 'labels' must be a list of integers")
    if len(labels) != len(data):
        raise UserError(f"{path}: {len(data)} images but {len(labels)} labels")
    return data.reshape((-1,) + SHAPE), labels.astype(np.int64)


def batches_dir(path: str) -> str:
    """``path`` itself if it holds the batches, else ``path/cifar-10-batches-py`` if that does."""
    nested = os.path.join(path, "cifar-10-batches-py")
    if not os.path.isfile(os.path.join(path, TEST_BATCH)) and os.path.isdir(nested):
        return nested
    return path


def read_split_dir(directory: str) -> dict:
    """All batches of ``directory``: {"train_images", "train_labels", "test_images", "test_labels"}."""
    directory = batches_dir(directory)
    missing = [b for b in TRAIN_BATCHES + (TEST_BATCH,) if not os.path.isfile(os.path.join(directory, b))]
    if missing:
        raise UserError(f"{directory}: missing CIFAR-10 batch files {', '.join(missing)} "
                        f"(extract {URL} there)")
    train = [read_batch(os.path.join(directory, b)) for b in TRAIN_BATCHES]
    test_images, test_labels = read_batch(os.path.join(directory, TEST_BATCH))
    return {
        "train_images": np.concatenate([t[0] for t in train]),
        "train_labels": np.concatenate([t[1] for t in train]),
        "test_images": test_images,
        "test_labels": test_labels,
    }


def write_batch(path: str, images: np.ndarray, labels) -> None:
    """Write a batch in the CIFAR-10 python format (images (N, 3, 32, 32) uint8). For tests."""
    images = np.ascontiguousarray(images, dtype=np.uint8)
    batch = {b"batch_label": b"written by ssdmpi", b"labels": [int(v) for v in labels],
             b"data": images.reshape(len(images), -1), b"filenames": [b"x.png"] * len(images)}
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)
