"""IDX files (MNIST, Fashion-MNIST): gzipped or raw, validated byte for byte.

An IDX file is a 4-byte magic number ``00 00 TT DD`` (``TT`` the element type,
``0x08`` = unsigned byte, the only one these datasets use; ``DD`` the number of
dimensions), ``DD`` big-endian uint32 sizes, then the elements, row-major. Images
are ``idx3`` (N, rows, cols), labels ``idx1`` (N,). A file whose first two bytes
are the gzip magic ``1f 8b`` is decompressed first, whatever its name; a ``.gz``
name on a file that is not gzip is an error.
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from ssdmpi.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
UBYTE = 0x08

# The four files of a split, each tried with and without ``.gz`` and with '-' or '.'
# before "idx" (LeCun's site uses '-', some mirrors use '.').
FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}


def candidates(directory: str, stem: str) -> list[str]:
    """The file names ``stem`` may have in ``directory``, in the order they are tried."""
    dotted = stem.replace("-idx", ".idx")
    return [os.path.join(directory, s + ext) for s in (stem, dotted) for ext in (".gz", "")]


def find_file(directory: str, stem: str) -> str:
    """The first existing candidate for ``stem``; UserError naming what was tried if none."""
    names = candidates(directory, stem)
    for name in names:
        if os.path.isfile(name):
            return name
    raise UserError(f"{directory} has no {stem}[.gz] (tried {', '.join(os.path.basename(n) for n in names)})")


def read_bytes(path: str) -> bytes:
    """The file's content, gunzipped if it is gzip; UserError if unreadable or a bad/truncated gzip."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if data[:2] == GZIP_MAGIC:
        try:
            return gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as exc:
            raise UserError(f"{path}: corrupt or truncated gzip data ({exc}); download it again") from None
    if path.endswith(".gz"):
        raise UserError(f"{path}: not a gzip file (it is named .gz but does not start with the gzip magic 1f 8b)")
    return data


def parse(data: bytes, path: str, ndim: int) -> np.ndarray:
    """Decode IDX bytes into a uint8 array with ``ndim`` dimensions (a read-only view of ``data``)."""
    if len(data) < 4:
        raise UserError(f"{path}: truncated IDX file ({len(data)} bytes, not even a header)")
    zero, dtype, dims = data[:2], data[2], data[3]
    if zero != b"\x00\x00" or dtype != UBYTE or dims != ndim:
        raise UserError(f"{path}: wrong IDX magic number 0x{data[:4].hex()} "
                        f"(expected 0x{UBYTE:02x}{ndim:02x} prefixed by 0000: unsigned bytes, {ndim} dimensions)")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise UserError(f"{path}: truncated IDX file (header cut short at {len(data)} bytes)")
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape, dtype=np.int64))
    if len(data) < expected:
        raise UserError(f"{path}: truncated IDX file ({len(data)} bytes, the header {shape} needs {expected}); "
                        "download it again")
    if len(data) > expected:
        raise UserError(f"{path}: {len(data) - expected} unexpected bytes after the {shape} IDX data")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_idx(path: str, ndim: int) -> np.ndarray:
    """Read one IDX file (gzipped or raw) as a uint8 array of ``ndim`` dimensions."""
    return parse(read_bytes(path), path, ndim)


def write_idx(path: str, array: np.ndarray, compress: bool | None = None) -> None:
    """Write a uint8 array as IDX (gzipped if ``compress``, default: if ``path`` ends in .gz). For tests."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    data = bytes([0, 0, UBYTE, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes() + array.tobytes()
    if compress if compress is not None else path.endswith(".gz"):
        data = gzip.compress(data, compresslevel=1)
    with open(path, "wb") as f:
        f.write(data)


def read_split_dir(directory: str) -> dict:
    """Read the four IDX files of ``directory``: {"train_images", "train_labels", "test_images", "test_labels"}.

    Images come back (N, 1, rows, cols) uint8, labels (N,) uint8. Counts are checked here;
    label ranges by the caller (who knows the number of classes).
    """
    out = {}
    for split in ("train", "test"):
        images_path = find_file(directory, FILES[(split, "images")])
        labels_path = find_file(directory, FILES[(split, "labels")])
        images = read_idx(images_path, 3)
        labels = read_idx(labels_path, 1)
        if len(images) != len(labels):
            raise UserError(f"{directory}: {split} split has {len(images)} images but {len(labels)} labels "
                            f"({os.path.basename(images_path)} vs {os.path.basename(labels_path)})")
        out[f"{split}_images"] = images[:, None, :, :]
        out[f"{split}_labels"] = labels
    return out
