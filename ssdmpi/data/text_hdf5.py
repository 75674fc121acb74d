"""The HDF5 text layout: what ``ssdmpi data convert text`` writes and ``load_dataset("text", path)`` reads.

Layout (one file, two datasets at the root)::

    /train_tokens   (N,)   uint8 (byte-level tokens: token = byte value), or uint16 for vocab_size > 256
    /val_tokens     (M,)   the same dtype; may be empty
    attributes of / :
        format       "ssdmpi-text", version 1
        vocab_size   int      tokens are in [0, vocab_size); default 256 for uint8, 65536 for uint16
        tokenizer    "bytes"  the tokens are the text's UTF-8 bytes, one token each (written when vocab_size is 256)
        name         str      what the corpus is called
        source       str      where the text came from (its files or dataset)
        licence      str      the text's licence
        description  str      what the text is
    (only the two datasets are needed to read a file; the attributes are optional)

The whole file is read into memory. ``write_text_hdf5`` writes atomically, like the image
layout's writer (``ssdmpi/data/hdf5.py``).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ssdmpi.errors import UserError

FORMAT = "ssdmpi-text"
VERSION = 1
REQUIRED = ("train_tokens", "val_tokens")
ATTRIBUTES = ("name", "source", "licence", "description")


def is_text_hdf5(path: str) -> bool:
    """True if ``path`` is an HDF5 file holding ``/train_tokens``."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return isinstance(f.get("train_tokens"), h5py.Dataset)
    except OSError:
        return False


def read_text_hdf5(path: str):
    """The ``TextDataset`` in ``path`` (validated); UserError (one line) if the file is not in the layout."""
    import h5py

    from ssdmpi.data.text import from_tokens

    if not os.path.isfile(path):
        raise UserError(f"no such HDF5 file: {path} (write one with 'ssdmpi data convert text FILE... --out {path}')")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise UserError(f"{path}: not a readable HDF5 file ({exc}); write one with "
                        "'ssdmpi data convert text'") from None
    with f:
        missing = [name for name in REQUIRED if not isinstance(f.get(name), h5py.Dataset)]
        if missing:
            hint = " (it holds an image dataset: use --dataset hdf5)" if isinstance(f.get("train/images"),
                                                                                   h5py.Dataset) else ""
            raise UserError(f"{path}: missing HDF5 datasets {', '.join('/' + m for m in missing)} of the text "
                            f"layout{hint}; write one with 'ssdmpi data convert text FILE... --out FILE.h5'")
        try:
            train, val = (f[name][...] for name in REQUIRED)
        except OSError as exc:
            raise UserError(f"{path}: cannot read its datasets ({exc}); is the file truncated?") from None
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    for split, tokens in (("train", train), ("val", val)):
        if tokens.ndim != 1 or tokens.dtype not in (np.uint8, np.uint16):
            raise UserError(f"{path}: /{split}_tokens must be a 1-D uint8 or uint16 array, got "
                            f"{tokens.dtype} {tokens.shape}")
    if train.dtype != val.dtype and val.size:
        raise UserError(f"{path}: /train_tokens is {train.dtype} but /val_tokens {val.dtype}; store both alike")
    vocab = int(attrs.get("vocab_size", 256 if train.dtype == np.uint8 else 65536))
    info = {k: str(attrs.get(k, "")) for k in ATTRIBUTES}
    origin = ": ".join(v for v in (info["name"], info["source"]) if v)
    return from_tokens("text", train, val, vocab, source=path + (f" (converted from {origin})" if origin else ""),
                       licence=info["licence"], description=info["description"])


def write_text_hdf5(path: str, dataset, force: bool = False, compress: bool = False) -> None:
    """Write ``dataset`` (a ``TextDataset``) in the layout above, atomically; refuses an existing
    ``path`` unless ``force`` (a temporary file beside it is renamed over it when complete)."""
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
    options = {"compression": "gzip", "compression_opts": 4} if compress else {}
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["version"] = VERSION
            f.attrs["vocab_size"] = int(dataset.vocab_size)
            if int(dataset.vocab_size) == 256:
                f.attrs["tokenizer"] = "bytes"
            for key in ATTRIBUTES:
                f.attrs[key] = str(getattr(dataset, key) or "")
            for name, tokens in (("train_tokens", dataset.train_tokens), ("val_tokens", dataset.val_tokens)):
                f.create_dataset(name, data=tokens, **(options if len(tokens) else {}))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
