"""Datasets: find, decode, validate and normalise them; one ``load_dataset`` for all formats.

Names (``DATASETS``) and where each is looked for when no ``path`` is given:

=============== ====================================================== =========================
name            source                                                 looked for in (first hit)
=============== ====================================================== =========================
digits          8x8 UCI digits, shipped in ssdmpi (the default)         ssdmpi/data/digits.csv.gz
fashion-mnist   IDX files ``train-images-idx3-ubyte[.gz]`` etc.         $SSDMPI_DATA/fashion-mnist,
                                                                        ./data/fashion-mnist,
                                                                        /usr/share/datasets/fashion-mnist
mnist           IDX files, as above                                     .../mnist under the same roots
cifar10         python batches ``data_batch_1..5``, ``test_batch``      .../cifar-10-batches-py
hdf5            the layout of ``ssdmpi/data/hdf5.py`` (``path`` needed)  ``path`` only
synthetic       seeded Gaussian classes (options below)                generated
devils-dictionary  text: Bierce's "The Devil's Dictionary", shipped     ssdmpi/data/devil.dict.dz
                in ssdmpi (383,656 bytes)
kjv             text: the King James Bible (4.1 MB): a UTF-8 file       .../kjv/kjv.txt under the
                ``kjv.txt``, or Debian's bible-kjv                      same roots, then
                                                                        /usr/lib/bible.data
text            the text layout of ``ssdmpi/data/text_hdf5.py``         ``path`` only
                (``path`` needed)
=============== ====================================================== =========================

The last three are text datasets: ``load_dataset`` returns a ``TextDataset`` of byte-level
tokens (``ssdmpi/data/text.py``: the windows, the loader, the trainer's contract; the corpora
and their licences: ``ssdmpi/data/corpora.py``), ``kind == "text"``; the others a ``Dataset``,
``kind == "classification"``, normalised as below. The built-in corpora's val split is their
last 10% of bytes; ``dataset_kind(name)`` tells the kind without loading anything.

``digits`` split: 1,437 train / 360 test (20%), stratified by class and shuffled with a
fixed seed, the same on every machine (``ssdmpi/data/digits.py`` states the rule); each split
keeps the file's order. ``fashion-mnist``/``mnist``: 60,000/10,000, ``cifar10``
50,000/10,000 (the files' own splits), 10 classes each.

``synthetic`` options: ``num_train`` (default 4096), ``num_test`` (1024),
``input_shape`` ((1, 28, 28); a tuple or a string "3,32,32"), ``num_classes`` (10),
``seed`` (0), ``separation`` (6.0). Class ``k`` has a random mean image ``mu_k``
(seeded); a sample is ``mu_y + N(0, 1)`` per pixel, with ``mu_k`` scaled so two class
means are ``separation`` noise standard deviations apart on average. Classes are
balanced. A linear model can learn it; 6.0 makes the best possible accuracy ~99%.

Normalisation (every dataset, every format, the same rule):

1. scale pixels to [0, 1]: uint8 images are divided by 255, ``digits`` (0..16) by 16;
   float images (HDF5 floats, ``synthetic``) are taken as they are (``Dataset.scale``: the
   factor, from the source's own values);
2. for each channel ``c``: ``mean_c`` and ``std_c`` are the mean and population
   standard deviation (ddof=0, computed in float64) of channel ``c`` over every pixel
   of the TRAIN split (``std_c`` < 1e-12 counts as 1);
3. ``x = (scaled - mean_c) / std_c`` for both splits (the test split with the train
   statistics), stored float32. ``Dataset.mean``/``Dataset.std`` hold the statistics
   in scaled units, so ``scaled = x * std_c + mean_c``.

Decoded datasets are cached in memory per process (keyed by name, options and the
files' sizes and modification times), so a second ``load_dataset`` is free. The arrays
are shared between callers and therefore read-only; copy before modifying.
"""

from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

import numpy as np

from ssdmpi.data.names import DATASETS, TEXT_DATASETS
from ssdmpi.errors import UserError

_ALIASES = {"fashion_mnist": "fashion-mnist", "fmnist": "fashion-mnist", "cifar-10": "cifar10",
            "cifar_10": "cifar10", "h5": "hdf5", "devil": "devils-dictionary", "devils_dictionary": "devils-dictionary",
            "bible": "kjv", "bible-kjv": "kjv"}

# Where datasets that live in a directory are looked for: <root>/<subdir> for each root.
_SUBDIR = {"fashion-mnist": "fashion-mnist", "mnist": "mnist", "cifar10": "cifar-10-batches-py"}
_HOW_TO_GET = {
    "fashion-mnist": "install Debian's package (apt-get install dataset-fashion-mnist) or download the four "
                     "*-ubyte.gz files from https://github.com/zalandoresearch/fashion-mnist into such a directory",
    "mnist": "download the four *-ubyte.gz files from https://ossci-datasets.s3.amazonaws.com/mnist/ "
             "(a mirror of yann.lecun.com/exdb/mnist) into such a directory",
    "cifar10": "download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz and extract it "
               "(it unpacks to cifar-10-batches-py/)",
    "kjv": "install Debian's package (apt-get install bible-kjv: its bible program reads bible-kjv-text's "
           "/usr/lib/bible.data) or put a UTF-8 text of the King James Bible in kjv/kjv.txt under one of those roots",
}
BIBLE_DATA = "/usr/lib/bible.data"   # Debian's bible-kjv-text
SYNTHETIC_DEFAULTS = {"num_train": 4096, "num_test": 1024, "input_shape": (1, 28, 28), "num_classes": 10,
                      "seed": 0, "separation": 6.0}


@dataclasses.dataclass
class RawSplits:
    """A dataset before normalisation, as stored on disk (what ``data convert`` writes).

    Images (N, C, H, W): uint8 (0..255) or float32 already scaled (e.g. to [0, 1]).
    Labels (N,) integers in [0, num_classes). ``raw_scale``: the factor that took the source's
    own values to these images (``digits``: 1/16; others: 1).
    """

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    source: str
    raw_scale: float = 1.0


@dataclasses.dataclass
class Dataset:
    """A normalised dataset in memory (see the module docstring for the normalisation).

    ``train_x`` (N, C, H, W) and ``test_x`` (M, C, H, W) float32; ``train_y``/``test_y``
    int64 in [0, num_classes); ``input_shape`` = (C, H, W); ``mean``/``std`` per channel
    in scaled [0, 1] units; ``scale``: the source's own values times ``scale`` are those units,
    so ``x = (raw * scale - mean_c) / std_c``; ``source`` says where the data came from. Arrays
    are read-only.
    ``kind`` is "classification" (a ``TextDataset``'s is "text").
    """

    kind: ClassVar[str] = "classification"
    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    input_shape: tuple
    num_classes: int
    mean: tuple = ()
    std: tuple = ()
    source: str = ""
    scale: float = 1.0

    @property
    def num_train(self) -> int:
        return len(self.train_x)

    @property
    def num_test(self) -> int:
        return len(self.test_x)

    def summary(self) -> str:
        """One line: name, sizes, shape, classes, source."""
        shape = "x".join(str(s) for s in self.input_shape)
        return (f"{self.name}: {self.num_train} train / {self.num_test} test, {shape}, "
                f"{self.num_classes} classes ({self.source})")


def canonical_name(name: str) -> str:
    """The dataset's canonical name; UserError listing the names if unknown."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise UserError(f"unknown dataset '{name}'; choose one of: {', '.join(DATASETS)}")
    return key


def dataset_kind(name: str) -> str:
    """"text" for a text dataset (loads as a ``TextDataset``), "classification" for the others."""
    return "text" if canonical_name(name) in TEXT_DATASETS else "classification"


def data_roots() -> list[str]:
    """Parent directories searched for datasets: $SSDMPI_DATA (if set), ./data, /usr/share/datasets."""
    roots = [os.environ["SSDMPI_DATA"]] if os.environ.get("SSDMPI_DATA") else []
    return roots + [os.path.abspath("data"), "/usr/share/datasets"]


def search_paths(name: str) -> list[str]:
    """Where ``name`` is looked for when no path is given (empty for generated/built-in ones)."""
    name = canonical_name(name)
    if name == "digits":
        from ssdmpi.data.digits import DIGITS_FILE
        return [DIGITS_FILE]
    if name == "devils-dictionary":
        from ssdmpi.data.corpora import DEVIL_FILE
        return [DEVIL_FILE]
    if name == "kjv":
        return [os.path.join(root, "kjv", "kjv.txt") for root in data_roots()] + [BIBLE_DATA]
    if name not in _SUBDIR:
        return []
    return [os.path.join(root, _SUBDIR[name]) for root in data_roots()]


def locate(name: str, path: str | None = None) -> str:
    """The directory or file to read ``name`` from; UserError listing what was tried if none."""
    name = canonical_name(name)
    if name in ("digits", "synthetic", "devils-dictionary"):
        if path:
            raise UserError(f"dataset '{name}' takes no path (got {path}); it is "
                            f"{'generated' if name == 'synthetic' else 'built in'}")
        return ""
    if name == "hdf5":
        if not path:
            raise UserError("dataset 'hdf5' needs a path to the .h5 file (write one with 'ssdmpi data convert')")
        return os.path.abspath(path)
    if name == "text":
        if not path:
            raise UserError("dataset 'text' needs a path to the .h5 file "
                            "(write one with 'ssdmpi data convert text FILE... --out FILE.h5')")
        return os.path.abspath(path)
    if name == "kjv":
        return _locate_file(name, path)
    if path:
        if not os.path.isdir(path):
            raise UserError(f"{name}: no such directory: {path}; to get the data, {how_to_get(name)}")
        return os.path.abspath(path)
    tried = search_paths(name)
    for candidate in tried:
        if os.path.isdir(candidate):
            return candidate
    raise UserError(f"{name} not found; looked in {', '.join(tried)}; to get it, {how_to_get(name)}, "
                    "or pass its directory as the path")



def _locate_file(name: str, path: str | None) -> str:
    """A dataset read from one file (``kjv``): ``path`` (a file, or a directory holding the file's usual
    name), else the first of ``search_paths`` that exists."""
    if path:
        if os.path.isdir(path):
            path = next((os.path.join(path, f) for f in ("kjv.txt", "bible.data")
                         if os.path.isfile(os.path.join(path, f))), os.path.join(path, "kjv.txt"))
        if not os.path.isfile(path):
            raise UserError(f"{name}: no such file: {path}; to get the data, {how_to_get(name)}")
        return os.path.abspath(path)
    tried = search_paths(name)
    for candidate in tried:
        if os.path.isfile(candidate):
            return candidate
    raise UserError(f"{name} not found; looked for {', '.join(tried)}; to get it, {how_to_get(name)}, "
                    "or pass the file as the path")


def how_to_get(name: str) -> str:
    """How to obtain dataset ``name`` (a clause for error messages and ``data list``)."""
    return _HOW_TO_GET[name]


# ----------------------------------------------------------------------------- readers

def _read_digits() -> RawSplits:
    from ssdmpi.data.digits import DIGITS_FILE, read_digits, split_indices
    data, target = read_digits()
    pixels, labels = data.astype(np.float32), target
    images = (pixels / np.float32(16.0)).reshape(-1, 1, 8, 8)   # digits pixels are 0..16
    train, test = split_indices(labels)
    return RawSplits("digits", images[train], labels[train], images[test], labels[test], 10, DIGITS_FILE,
                     raw_scale=1.0 / 16.0)


def _parse_shape(value) -> tuple:
    if isinstance(value, str):
        value = [v for v in value.replace("x", ",").replace("(", "").replace(")", "").split(",") if v.strip()]
    try:
        shape = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise UserError(f"synthetic: input_shape must be C,H,W (e.g. 3,32,32), got {value!r}") from None
    if len(shape) != 3 or min(shape) < 1:
        raise UserError(f"synthetic: input_shape must be three positive sizes C,H,W, got {value!r}")
    return shape


def synthetic_options(options: dict) -> dict:
    """The synthetic dataset's options, defaults filled and types checked (strings accepted, as from a CLI)."""
    unknown = set(options) - set(SYNTHETIC_DEFAULTS)
    if unknown:
        raise UserError(f"synthetic: unknown option(s) {', '.join(sorted(unknown))}; "
                        f"known: {', '.join(SYNTHETIC_DEFAULTS)}")
    opts = dict(SYNTHETIC_DEFAULTS, **options)
    try:
        for key in ("num_train", "num_test", "num_classes", "seed"):
            opts[key] = int(opts[key])
        opts["separation"] = float(opts["separation"])
    except (TypeError, ValueError) as exc:
        raise UserError(f"synthetic: bad option value ({exc})") from None
    opts["input_shape"] = _parse_shape(opts["input_shape"])
    if opts["num_train"] < 1 or opts["num_test"] < 0 or opts["num_classes"] < 2 or opts["seed"] < 0:
        raise UserError("synthetic: need num_train >= 1, num_test >= 0, num_classes >= 2, seed >= 0")
    return opts


def _read_synthetic(options: dict) -> RawSplits:
    o = synthetic_options(options)
    rng = np.random.default_rng(o["seed"])
    dim = int(np.prod(o["input_shape"]))
    # E|mu_a - mu_b| = separation when each pixel of mu_k ~ N(0, separation^2 / (2 dim)).
    means = rng.standard_normal((o["num_classes"], dim), dtype=np.float32)
    means *= np.float32(o["separation"] / np.sqrt(2.0 * dim))

    def split(n):
        labels = rng.permutation(np.arange(n, dtype=np.int64) % o["num_classes"])
        images = rng.standard_normal((n, dim), dtype=np.float32)
        for start in range(0, n, 8192):   # add the class means in chunks: no (n, dim) temporary
            images[start:start + 8192] += means[labels[start:start + 8192]]
        return images.reshape((n,) + o["input_shape"]), labels

    train_images, train_labels = split(o["num_train"])
    test_images, test_labels = split(o["num_test"])
    desc = ", ".join(f"{k}={v}" for k, v in o.items())
    return RawSplits("synthetic", train_images, train_labels, test_images, test_labels, o["num_classes"],
                     f"generated: {desc}")


def _read_directory(name: str, directory: str) -> RawSplits:
    if name == "cifar10":
        from ssdmpi.data import cifar
        arrays = cifar.read_split_dir(directory)
    else:
        from ssdmpi.data import idx
        arrays = idx.read_split_dir(directory)
    return RawSplits(name, num_classes=10, source=directory, **arrays)


def _read_hdf5(path: str) -> RawSplits:
    from ssdmpi.data.hdf5 import read_hdf5
    arrays, attrs = read_hdf5(path)
    if "num_classes" in attrs:
        num_classes = int(attrs["num_classes"])
    else:
        top = [int(arrays[k].max()) for k in ("train_labels", "test_labels") if arrays[k].size]
        num_classes = max(top) + 1 if top else 0
    origin = f" (converted from {attrs['name']})" if attrs.get("name") else ""
    # Named as the file names itself (its ``name`` attribute, else the file's own name), with where it is.
    own = attrs.get("name") or os.path.splitext(os.path.basename(path))[0]
    return RawSplits(f"{own} (HDF5 file {path})", num_classes=num_classes, source=path + origin, **arrays)


def reject_options(name: str, options: dict) -> None:
    """Only ``synthetic`` takes options. Checked before the data is looked for: a wrong
    option is wrong wherever the data is, and the user should hear that first."""
    if options and name != "synthetic":
        raise UserError(f"dataset '{name}' takes no options (got {', '.join(sorted(options))})")


def load_raw(name: str, path: str | None = None, **options) -> RawSplits:
    """Read dataset ``name`` without normalising it (validated: counts, shapes, label range)."""
    name = canonical_name(name)
    if name in TEXT_DATASETS:
        raise UserError(f"dataset '{name}' is text: load_dataset gives its tokens (they are stored as they are)")
    reject_options(name, options)
    where = locate(name, path)
    if name == "digits":
        raw = _read_digits()
    elif name == "synthetic":
        raw = _read_synthetic(options)
    elif name == "hdf5":
        raw = _read_hdf5(where)
    else:
        raw = _read_directory(name, where)
    _validate(raw)
    return raw


def from_arrays(train_x, train_y, test_x, test_y, num_classes: int | None = None, name: str = "arrays") -> Dataset:
    """A ``Dataset`` from in-memory arrays, validated and normalised like every other dataset.

    ``train_x``: (N, D) flat feature vectors (tabular: standardised per feature), (N, H, W) or
    (N, C, H, W) images; uint8 pixels (0..255) or floats taken as they are. ``train_y``: (N,)
    integers in [0, num_classes) (default: 1 + the largest label). The test split likewise,
    with the same per-sample shape and dtype. ``UserError`` (one line) on anything else.
    """
    arrays = {}
    for split, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim == 3:
            x = x[:, None]
        if x.ndim not in (2, 4):
            raise UserError(f"{name}: {split}_x must be (N, D) features or (N, [C,] H, W) images, got shape {x.shape}")
        if x.dtype != np.uint8 and not np.issubdtype(x.dtype, np.floating):
            raise UserError(f"{name}: {split}_x must be float or uint8, got {x.dtype}")
        if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or y.size == 0):
            raise UserError(f"{name}: {split}_y must be a 1-D array of integer labels, got {y.dtype} {y.shape}")
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = x, y.astype(np.int64)
    if arrays["train_images"].shape[1:] != arrays["test_images"].shape[1:]:
        raise UserError(f"{name}: train and test samples differ in shape ({arrays['train_images'].shape[1:]} vs "
                        f"{arrays['test_images'].shape[1:]})")
    if num_classes is None:
        top = [int(arrays[k].max()) for k in ("train_labels", "test_labels") if arrays[k].size]
        num_classes = max(top) + 1 if top else 0
    raw = RawSplits(name, num_classes=int(num_classes), source="in-memory arrays", **arrays)
    _validate(raw)
    return normalise(raw)


def _validate(raw: RawSplits) -> None:
    if raw.num_classes < 1:
        raise UserError(f"{raw.source}: the dataset has no classes")
    for split in ("train", "test"):
        images, labels = getattr(raw, f"{split}_images"), getattr(raw, f"{split}_labels")
        if len(images) != len(labels):
            raise UserError(f"{raw.source}: {split} split has {len(images)} images but {len(labels)} labels")
        if labels.size and (labels.min() < 0 or labels.max() >= raw.num_classes):
            bad = labels[(labels < 0) | (labels >= raw.num_classes)]
            raise UserError(f"{raw.source}: {split} labels out of range: {len(bad)} label"
                            f"{'s' * (len(bad) != 1)} outside [0, {raw.num_classes}), e.g. {int(bad[0])}")
    if len(raw.train_images) == 0:
        raise UserError(f"{raw.source}: the train split is empty")


# ----------------------------------------------------------------------------- normalisation

def channel_stats(images: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and population std (float64) of ``images * scale`` (N, C, H, W), in chunks."""
    channels = images.shape[1]
    total = np.zeros(channels)
    squares = np.zeros(channels)
    for start in range(0, len(images), 4096):   # float64 temporaries of bounded size
        chunk = images[start:start + 4096].astype(np.float64)
        chunk *= scale
        total += chunk.sum(axis=(0, 2, 3))
        squares += np.einsum("nchw,nchw->c", chunk, chunk)
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
    return mean, np.where(std < 1e-12, 1.0, std)


def normalise(raw: RawSplits) -> Dataset:
    """Scale and standardise ``raw`` per channel with the train split's statistics (module docstring).

    Tabular data (images of shape (N, D): flat feature vectors) is standardised per feature,
    each feature being its own channel; ``input_shape`` is then ``(D,)``.
    """
    if raw.train_images.ndim == 2:
        D = raw.train_images.shape[1]
        as_images = dataclasses.replace(raw, train_images=raw.train_images.reshape(-1, D, 1, 1),
                                        test_images=raw.test_images.reshape(-1, D, 1, 1))
        out = _normalise_images(as_images)
        out.train_x, out.test_x = out.train_x.reshape(-1, D), out.test_x.reshape(-1, D)   # read-only views
        out.input_shape = (D,)
        return out
    return _normalise_images(raw)


def _normalise_images(raw: RawSplits) -> Dataset:
    scale = 1.0 / 255.0 if raw.train_images.dtype == np.uint8 else 1.0
    mean, std = channel_stats(raw.train_images, scale)
    # (v * scale - mean) / std == v * a - b, two float32 passes over the data.
    a = (scale / std).astype(np.float32).reshape(1, -1, 1, 1)
    b = (mean / std).astype(np.float32).reshape(1, -1, 1, 1)
    # uint8 pixels take one of 256 values: a per-channel lookup table, computed in float64
    # and rounded once, is exact and the fastest pass; chunks keep the index temporaries in cache.
    luts = ((np.arange(256.0)[None, :] * scale - mean[:, None]) / std[:, None]).astype(np.float32)

    def apply(images):
        x = np.empty(images.shape, dtype=np.float32)
        for start in range(0, len(images), 512):
            rows = slice(start, start + 512)
            if images.dtype == np.uint8:
                for c in range(images.shape[1]):
                    np.take(luts[c], images[rows, c], out=x[rows, c])
            else:
                np.multiply(images[rows], a, out=x[rows], casting="unsafe")
                x[rows] -= b
        x.flags.writeable = False
        return x

    def labels(y):
        y = np.asarray(y, dtype=np.int64).copy()
        y.flags.writeable = False
        return y

    test_scale = 1.0 / 255.0 if raw.test_images.dtype == np.uint8 else 1.0
    if test_scale != scale:
        raise UserError(f"{raw.source}: train images are {raw.train_images.dtype} but test images "
                        f"{raw.test_images.dtype}; store both splits with the same dtype")
    return Dataset(raw.name, apply(raw.train_images), labels(raw.train_labels), apply(raw.test_images),
                   labels(raw.test_labels), tuple(int(s) for s in raw.train_images.shape[1:]), int(raw.num_classes),
                   tuple(float(m) for m in mean), tuple(float(s) for s in std), raw.source,
                   float(raw.raw_scale * scale))


# ----------------------------------------------------------------------------- the entry point

_CACHE: dict = {}


def _signature(name: str, where: str) -> tuple:
    """Sizes and modification times of the files ``name`` is read from (part of the cache key).

    The directory's own files only (not recursive: ``path`` may be a large parent directory).
    """
    if not where or not os.path.exists(where):
        return ()   # the reader will say what is missing
    if name == "cifar10":
        from ssdmpi.data.cifar import batches_dir
        where = batches_dir(where)
    if os.path.isfile(where):
        st = os.stat(where)
        return ((where, st.st_size, st.st_mtime_ns),)
    with os.scandir(where) as entries:
        return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries if e.is_file()))


def _read_text(name: str, where: str):
    from ssdmpi.data import corpora
    from ssdmpi.data.text import encode, from_tokens

    if name == "text":
        from ssdmpi.data.text_hdf5 import read_text_hdf5
        return read_text_hdf5(where)
    if name == "devils-dictionary":
        where, data = corpora.DEVIL_FILE, corpora.read_devil()
        licence, description = corpora.DEVIL_LICENCE, corpora.DEVIL_DESCRIPTION
    else:
        data, licence, description = corpora.read_kjv(where), corpora.KJV_LICENCE, corpora.KJV_DESCRIPTION
    train, val = corpora.split(encode(data), corpora.VAL_FRACTION)
    return from_tokens(name, train, val, source=where, licence=licence, description=description)


def load_dataset(name: str, path: str | None = None, **options):
    """Load, validate and normalise dataset ``name`` (see the module docstring); cached per process.

    ``path``: the dataset's directory (IDX, CIFAR-10) or file (HDF5, text HDF5, ``kjv``); None to
    search the default places. ``options``: only for ``synthetic``. Returns a ``Dataset``, or a
    ``TextDataset`` for a text dataset (``ssdmpi/data/text.py``). Raises ``UserError`` (one line)
    on missing or malformed data. Every rank calling this gets identical arrays.
    """
    name = canonical_name(name)
    reject_options(name, options)
    where = locate(name, path)
    if name == "synthetic":
        key_options = tuple(sorted(synthetic_options(options).items()))
    else:
        key_options = tuple(sorted(options.items()))
    key = (name, where, key_options, _signature(name, where))
    dataset = _CACHE.get(key)
    if dataset is None:
        dataset = _read_text(name, where) if name in TEXT_DATASETS else normalise(load_raw(name, path, **options))
        if name != "hdf5":      # an HDF5 file keeps its own name (``_read_hdf5``)
            dataset.name = name
        _CACHE[key] = dataset
    return dataset


def clear_cache() -> None:
    """Forget every cached dataset (frees their memory once no one else holds them)."""
    _CACHE.clear()
