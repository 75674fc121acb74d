"""State trees <-> HDF5 groups with checksums (both formats), and format 1: one file per checkpoint.

Format 1 (read, resumed on its own number of ranks; ``sharded.py`` is format 2, what
``ssdmpi train`` writes) is one HDF5 file ``ckpt-<step>.h5``:

    /                               attrs: format="ssdmpi-checkpoint", format_version=1,
                                           world_size, step, epoch, stage, model, algo, dataset,
                                           reason, created (informational copies of /meta)
    /meta                           JSON string: the fields above, the resolved config, and
                                    "manifest": {dataset path: sha256} of every other dataset
    /model/global_weights           float [n]   the global model W (from rank 0)
    /model/buffers/<name>           rank 0's BatchNorm running statistics (what ``ssdmpi eval`` uses)
    /rank_0000/ ... /rank_<N-1>/    one group per rank: that rank's whole state, a tree of
        model/params                    the flat parameter buffer (W in the warm-up, L after)
        model/buffers/<name>            this rank's BN statistics
        algo/...                        algo.state_dict() (W, M, L, P, accumulators, counters t, s,
                                        stage, ...; see ssdmpi/algos/__init__.py)
        loader/...                      loader.state_dict()
        trainer/...                     step, elapsed and training seconds, last evaluation

Inside a tree, arrays are datasets (contiguous, uncompressed, so offsets are stable),
nested dicts are groups, and every other value of a group (numbers, strings, lists, None)
is kept in that group's ``_values`` dataset as a JSON string. An array equal to one
already in the file (W and M are the same on every rank; model/params is W or L) is
stored once: the later name is an HDF5 soft link to the first (h5py and h5dump follow
it), which keeps a checkpoint near one copy of each distinct buffer. NumPy scalars are 0-d
datasets with attr ``scalar=1`` so they come back with their dtype (bitwise resume).
Every dataset carries attr ``sha256`` (of dtype, shape and raw bytes); ``/meta`` lists all
of them again, so a truncated file, a flipped byte or a missing dataset is detected.

Example: ``h5py.File(path)["rank_0001/algo/L"][()]`` is rank 1's local model of a format-1 file.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from ssdmpi.errors import UserError

FORMAT = "ssdmpi-checkpoint"
FORMAT_VERSION = 1
VALUES = "_values"


class CheckpointError(UserError):
    """A checkpoint that cannot be used (corrupt, wrong world size or model, missing)."""


# --- trees of state <-> HDF5 groups -----------------------------------------------------------

def digest(a: np.ndarray) -> str:
    """sha256 of an array's dtype, shape and bytes (what every dataset's ``sha256`` attr holds)."""
    h = hashlib.sha256(f"{a.dtype.str}{tuple(a.shape)}".encode())
    h.update(memoryview(np.ascontiguousarray(a)).cast("B"))
    return h.hexdigest()


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _host(a):
    """A NumPy array of ``a`` (device arrays are copied to the host)."""
    from ssdmpi.backend import to_host

    return np.ascontiguousarray(to_host(a))


def _is_array(v) -> bool:
    return isinstance(v, np.ndarray) or hasattr(v, "__cuda_array_interface__")


def _check_key(key) -> str:
    key = str(key)
    if not key or "/" in key or key == VALUES or key == ".":
        raise ValueError(f"checkpoint: state key {key!r} cannot be an HDF5 name")
    return key


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


DEDUPE_MIN_SIZE = 256   # arrays at least this long are stored once per file (see write_tree)


def write_tree(group, tree: dict, manifest: dict, seen: dict | None = None) -> None:
    """Write the nested dict ``tree`` under ``group`` (see the module docstring).

    ``manifest`` collects ``{dataset name: sha256}``. ``seen`` (``{sha256: dataset name}``,
    shared across calls) makes an array equal to one already in the file a soft link to
    it: ``W`` and ``M`` are the same on every rank, and ``model/params`` is ``W`` or ``L``,
    so this keeps a checkpoint near one copy of each distinct buffer.
    """
    import h5py

    seen = {} if seen is None else seen
    values = {}
    for key, value in tree.items():
        key = _check_key(key)
        if isinstance(value, dict):
            write_tree(group.create_group(key), value, manifest, seen)
        elif _is_array(value) or isinstance(value, np.generic):
            a = _host(value) if _is_array(value) else np.asarray(value)
            if a.ndim >= 1 and a.size >= DEDUPE_MIN_SIZE:
                sha = digest(a)
                if sha in seen:
                    group[key] = h5py.SoftLink(seen[sha])
                    continue
            ds = group.create_dataset(key, data=a)
            ds.attrs["sha256"] = sha = digest(a)
            if isinstance(value, np.generic):
                ds.attrs["scalar"] = 1
            manifest[ds.name] = sha
            if a.ndim >= 1 and a.size >= DEDUPE_MIN_SIZE:
                seen[sha] = ds.name
        elif isinstance(value, (list, tuple)) and any(_is_array(x) or isinstance(x, dict) for x in value):
            sub = group.create_group(key)
            sub.attrs["list"] = len(value)
            write_tree(sub, {str(i): x for i, x in enumerate(value)}, manifest, seen)
        else:
            values[key] = _jsonable(value)
    if values:
        text = json.dumps(values, sort_keys=True)
        ds = group.create_dataset(VALUES, data=text)
        ds.attrs["sha256"] = sha = _text_digest(text)
        manifest[ds.name] = sha


def read_dataset(ds):
    """A dataset written by ``write_tree``: an array, or a NumPy scalar of its dtype."""
    a = ds[()]
    if ds.attrs.get("scalar", 0):
        return a if isinstance(a, np.generic) else np.asarray(a)[()]
    return a if isinstance(a, np.ndarray) else np.asarray(a)


class ArrayInfo(tuple):
    """``(shape, dtype)`` of an array ``read_tree(..., arrays=False)`` did not read."""

    shape = property(lambda self: self[0])
    dtype = property(lambda self: self[1])


def read_tree(group, arrays: bool = True) -> dict | list:
    """The nested dict (or list) written by ``write_tree``; NumPy arrays on the host.
    ``arrays=False``: arrays of one or more dimensions are not read, only described (``ArrayInfo``)."""
    import h5py

    out = {}
    for key, item in group.items():
        if key == VALUES:
            out.update(json.loads(item.asstr()[()]))
        elif isinstance(item, h5py.Group):
            out[key] = read_tree(item, arrays)
        elif not arrays and item.ndim >= 1:
            out[key] = ArrayInfo((tuple(item.shape), np.dtype(item.dtype)))
        else:
            out[key] = read_dataset(item)
    if "list" in group.attrs:
        return [out[str(i)] for i in range(int(group.attrs["list"]))]
    return out


# --- writing --------------------------------------------------------------------------------

def write_contents(f, meta: dict, rank_states, shared: dict | None = None) -> None:
    """Write a whole checkpoint into the open, empty ``h5py.File`` ``f``.

    ``meta``: JSON-able fields (step, epoch, stage, world_size, config, ...).
    ``rank_states``: iterable of ``(rank, state tree)``, consumed one at a time (so a
    generator can receive them from other ranks while the file is written).
    ``shared``: trees written at the top level (``{"model": {"global_weights": W, ...}}``).
    """
    manifest: dict = {}
    seen: dict = {}
    for rank, state in rank_states:
        write_tree(f.create_group(f"rank_{rank:04d}"), state, manifest, seen)
    if shared:
        for key, tree in shared.items():
            write_tree(f.create_group(_check_key(key)), tree, manifest, seen)
    full = dict(_jsonable(meta), format=FORMAT, format_version=FORMAT_VERSION, manifest=manifest)
    text = json.dumps(full, sort_keys=True)
    ds = f.create_dataset("meta", data=text)
    ds.attrs["sha256"] = _text_digest(text)
    f.attrs["format"] = FORMAT
    f.attrs["format_version"] = FORMAT_VERSION
    for key in ("world_size", "step", "epoch", "stage", "model", "algo", "dataset", "reason", "created"):
        if meta.get(key) is not None:
            f.attrs[key] = meta[key]


def write_checkpoint(path: str, meta: dict, rank_states, shared: dict | None = None) -> str:
    """Write one format-1 checkpoint file atomically (a temporary file in the same directory,
    fsynced, renamed over ``path``, the directory fsynced); return ``path``."""
    import h5py

    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            write_contents(f, meta, rank_states, shared)
            f.flush()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


# --- reading and verifying --------------------------------------------------------------------

def dataset_digest(ds) -> str:
    """The sha256 of a stored dataset, as ``write_tree`` computed it (JSON text or array)."""
    if ds.dtype.kind in "OSU":
        return _text_digest(ds.asstr()[()])
    return digest(np.asarray(ds[()]))


def not_a_checkpoint(path: str) -> str | None:
    """Why the existing file ``path`` is no ssdmpi checkpoint at all, or None when it claims to be one
    (``verify`` then says whether it is intact). Not an HDF5 file (its signature is missing), or an
    HDF5 file with neither the ``format`` attribute nor ``/meta``: such a file is something else,
    not a damaged checkpoint. A file h5py cannot open past its signature is a damaged one (None)."""
    import h5py

    if not h5py.is_hdf5(path):
        return "not an HDF5 file"
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT and "meta" not in f:
                return "an HDF5 file without an ssdmpi checkpoint's format attribute and /meta"
    except Exception:   # h5py raises OSError/KeyError/RuntimeError on damaged files
        return None
    return None


def read_meta(path: str) -> dict:
    """The ``/meta`` record (config, step, world size, manifest, ...); ``CheckpointError`` if unreadable."""
    import h5py

    if os.path.isfile(path) and (why := not_a_checkpoint(path)):
        raise CheckpointError(f"{path} is not an ssdmpi checkpoint ({why})")
    try:
        with h5py.File(path, "r") as f:
            return _meta(f, path)
    except CheckpointError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable checkpoint ({error_line(exc)})") from None


def error_line(exc) -> str:
    """The first line of an exception's message (its type name if it has none)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _meta(f, path: str) -> dict:
    if f.attrs.get("format") != FORMAT or "meta" not in f:
        raise CheckpointError(f"{path} is not an ssdmpi checkpoint (no format attribute or /meta)")
    ds = f["meta"]
    text = ds.asstr()[()]
    if _text_digest(text) != ds.attrs.get("sha256"):
        raise CheckpointError(f"{path}: /meta checksum mismatch (corrupt file)")
    meta = json.loads(text)
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format version {meta.get('format_version')} is not supported "
                              f"(this ssdmpi reads version {FORMAT_VERSION})")
    return meta


def verify(path: str) -> list:
    """Problems found in the checkpoint at ``path`` (empty list: every checksum verifies)."""
    import h5py

    if os.path.isfile(path) and (why := not_a_checkpoint(path)):
        return [f"not an ssdmpi checkpoint ({why})"]
    problems = []
    try:
        with h5py.File(path, "r") as f:
            meta = _meta(f, path)
            manifest = meta.get("manifest", {})
            for name, expected in manifest.items():
                if name not in f:
                    problems.append(f"dataset {name} is missing")
                    continue
                if dataset_digest(f[name]) != expected:
                    problems.append(f"dataset {name} checksum mismatch")
            for rank in range(int(meta.get("world_size", 0))):
                if f"rank_{rank:04d}" not in f:
                    problems.append(f"group /rank_{rank:04d} is missing")
            links = []
            f.visit_links(lambda name: links.append(name) if isinstance(f.get(name, getlink=True), h5py.SoftLink)
                          else None)
            for name in links:
                target = f.get(name, getlink=True).path
                if target not in manifest:
                    problems.append(f"link /{name} points to {target}, which is not a checksummed dataset")
    except CheckpointError as exc:
        problems.append(str(exc).replace(f"{path}: ", "").replace(f"{path} ", ""))
    except Exception as exc:   # h5py raises OSError/KeyError/RuntimeError/ValueError on damaged files
        problems.append(f"unreadable ({error_line(exc)})")
    return problems


def read_rank_state(path: str, rank: int) -> dict:
    """Rank ``rank``'s state tree."""
    import h5py

    with h5py.File(path, "r") as f:
        return read_tree(f[f"rank_{rank:04d}"])


def read_shared(path: str, key: str = "model") -> dict:
    """A top-level tree (``model``: global weights and rank 0's buffers)."""
    import h5py

    with h5py.File(path, "r") as f:
        return read_tree(f[key])
