"""The HDF5 dataset layout: what ``ssdmpi data convert`` writes and ``load_dataset("hdf5", path)`` reads.

Layout (one file, two groups of two datasets)::

    /train/images   (N, C, H, W) or (N, H, W)   uint8 pixel values 0..255, or float (already scaled, e.g. to [0, 1]);
                    or (N, D)                   tabular: D features per sample, float (or uint8)
    /train/labels   (N,)                        integers in [0, num_classes)
    /test/images    (M, ...)                    same dtype and per-sample shape as /train/images
    /test/labels    (M,)
    attributes of / (all optional when reading):
        num_classes  int      default 1 + the largest label of either split
        name         str      the dataset it was converted from
        format       "ssdmpi-dataset", version 1

Images are stored *un-normalised*; ``load_dataset`` scales uint8 by 1/255 and then
normalises per channel (tabular data: per feature) with the train split's statistics, exactly as for the
dataset's native format, so ``load_dataset("hdf5", converted)`` equals the original.
The whole file is read into memory.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ssdmpi.errors import UserError

REQUIRED = ("train/images", "train/labels", "test/images", "test/labels")
FORMAT = "ssdmpi-dataset"
VERSION = 1


def read_hdf5(path: str) -> tuple[dict, dict]:
    """Read the layout above: ({"train_images", ..., "test_labels"}, root attributes); UserError if not it."""
    import h5py

    if not os.path.isfile(path):
        raise UserError(f"no such HDF5 file: {path} (write one with 'ssdmpi data convert NAME --out {path}')")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise UserError(f"{path}: not a readable HDF5 file ({exc})") from None
    with f:
        missing = [name for name in REQUIRED if not isinstance(f.get(name), h5py.Dataset)]
        if missing:
            raise UserError(f"{path}: missing HDF5 datasets {', '.join('/' + m for m in missing)} "
                            f"(the layout needs {', '.join('/' + r for r in REQUIRED)}; see 'ssdmpi data convert')")
        try:
            arrays = {name.replace("/", "_"): f[name][...] for name in REQUIRED}
        except OSError as exc:
            raise UserError(f"{path}: cannot read its datasets ({exc}); is the file truncated?") from None
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim == 3:
            arrays[f"{split}_images"] = images = images[:, None]
        if images.ndim not in (2, 4):
            raise UserError(f"{path}: /{split}/images must be (N, C, H, W), (N, H, W) or (N, D), "
                            f"got shape {images.shape}")
        if images.dtype != np.uint8 and not np.issubdtype(images.dtype, np.floating):
            raise UserError(f"{path}: /{split}/images must be uint8 (0..255) or float, got {images.dtype}")
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise UserError(f"{path}: /{split}/labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if arrays["train_images"].shape[1:] != arrays["test_images"].shape[1:]:
        raise UserError(f"{path}: train and test images differ in shape "
                        f"({arrays['train_images'].shape[1:]} vs {arrays['test_images'].shape[1:]})")
    return arrays, attrs


def write_hdf5(path: str, raw, force: bool = False, compress: bool = False) -> None:
    """Write ``raw`` (a ``RawSplits``) in the layout above, atomically.

    The data go to a temporary file in the same directory, renamed over ``path`` only
    when complete, so an interrupted conversion never leaves a partial file and an
    existing file is untouched until then. Refuses an existing ``path`` unless ``force``.
    """
    import h5py

    path = os.path.abspath(path)
    if os.path.exists(path) and not force:
        raise UserError(f"{path} exists; choose another --out or pass --force to replace it")
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise UserError(f"no such directory: {directory}")
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)   # mkstemp's 0600 would survive the rename
    options = {"compression": "gzip", "compression_opts": 4, "chunks": True} if compress else {}
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["version"] = VERSION
            f.attrs["name"] = raw.name
            f.attrs["num_classes"] = int(raw.num_classes)
            for split in ("train", "test"):
                f.create_dataset(f"{split}/images", data=getattr(raw, f"{split}_images"), **options)
                f.create_dataset(f"{split}/labels", data=np.asarray(getattr(raw, f"{split}_labels"), np.int64),
                                 **options)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
