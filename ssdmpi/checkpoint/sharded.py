"""Format 2: a checkpoint is a directory with one HDF5 file per rank and a manifest written last.

    checkpoints/ckpt-00000120/
        manifest.json     the commit: format, step, epoch, stage, world size, model, config, ...;
                          every file's size and every dataset's sha256; where each piece of a
                          shared array lies; the write's bytes and times
        rank-0000.h5      rank 0's own state and its piece of every shared array
        rank-0001.h5      ...

Inside ``rank-RRRR.h5`` (plain h5py or ``h5dump`` reads it):

    /state/...            this rank's state tree in ``format.write_tree``'s layout: ``algo`` (its
                          local model L, local momentum, accumulators, counters t, s, stage, ...),
                          ``model/buffers`` (BatchNorm statistics, Dropout RNG states),
                          ``loader`` (the position in the global sample order), ``trainer``
    /shared/<name>        piece ``r`` of each shared array: elements ``[start, stop)``
                          (attrs ``start``, ``stop``, ``size``), with ``<name>`` one of
                          ``algo/W``, ``algo/M``, ``model/global_weights``, ...

Shared arrays are the 1-D arrays identical on every rank (the global model ``W``, the global
momentum ``M``, a held mean; the algorithm names them: ``replicated()``): each is written once,
split in ``N`` contiguous pieces, the first ``size % N`` one element longer (piece ``r`` by rank
``r``). ``model/global_weights`` is the model that evaluation reads; when it is ``algo/W`` the
manifest says so in ``aliases`` instead of storing it twice. Each dataset carries attr
``sha256`` (of dtype, shape and bytes), listed again in the manifest with the file's size, so a
truncated file, a flipped byte or a missing file is detected (``verify``).

A directory is a checkpoint only once its ``manifest.json`` exists; ``writer.py`` writes the
rank files into a hidden partial directory and renames it into place after the manifest
(``store.py``: names, listing, retention). Serial code, no MPI.

Example: ``h5py.File("ckpt-00000120/rank-0001.h5")["state/algo/L"][()]`` is rank 1's local
model; ``ssdmpi.checkpoint.read_weights(path)`` reads W alone.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from ssdmpi.checkpoint.format import FORMAT, CheckpointError, digest, error_line, read_dataset, read_tree, write_tree
from ssdmpi.data.loader import evaluation_shard

FORMAT_VERSION = 2
MANIFEST = "manifest.json"


def rank_file(rank: int) -> str:
    return f"rank-{int(rank):04d}.h5"


def piece(size: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous piece of a shared array of ``size`` elements."""
    return evaluation_shard(size, rank, world_size)


# --- writing (each rank its own file; rank 0 the manifest) -------------------------------------

def write_rank_file(path: str, state: dict, pieces: dict) -> dict:
    """Write one rank's file (its ``state`` tree and ``pieces``: ``{name: (array, start, stop, size)}``),
    fsync it; return ``{"bytes": file size, "datasets": {dataset: sha256}}`` for the manifest."""
    import h5py

    datasets: dict = {}
    with h5py.File(path, "w") as f:
        write_tree(f.create_group("state"), state, datasets)
        shared = f.create_group("shared")
        for name, (array, start, stop, size) in pieces.items():
            ds = shared.create_dataset(name, data=array)
            ds.attrs.update(start=int(start), stop=int(stop), size=int(size))
            ds.attrs["sha256"] = datasets[ds.name] = digest(array)
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
    return {"bytes": os.path.getsize(path), "datasets": datasets}


def write_manifest(directory: str, meta: dict, files: dict, shared: dict, aliases: dict) -> dict:
    """Rank 0, after every rank file is complete: write ``manifest.json`` (temporary name, fsync,
    rename). ``files``: ``{file name: {"rank", "bytes", "datasets"}}``; ``shared``: ``{name:
    {"dtype", "size"}}`` (pieces follow from the world size). Returns the manifest."""
    manifest = dict(meta, format=FORMAT, format_version=FORMAT_VERSION, files=files, shared=shared,
                    aliases=aliases)
    text = json.dumps(manifest, sort_keys=True, indent=1)
    tmp = os.path.join(directory, f".{MANIFEST}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(directory, MANIFEST))
    return manifest


# --- reading ----------------------------------------------------------------------------------

def read_manifest(directory: str) -> dict:
    """The manifest of the checkpoint directory; ``CheckpointError`` if missing or not format 2."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        raise CheckpointError(f"{directory} is not a complete checkpoint (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{directory}: {MANIFEST} is unreadable ({error_line(exc)})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{directory}: {MANIFEST} is not an ssdmpi checkpoint manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{directory}: format version {manifest.get('format_version')} is not supported "
                              f"(this ssdmpi reads versions 1 and {FORMAT_VERSION})")
    return manifest


def read_rank_state(directory: str, rank: int, arrays: bool = True) -> dict:
    """Rank ``rank``'s state tree (without the shared arrays); ``arrays=False``: arrays described,
    not read (``format.read_tree``)."""
    import h5py

    with h5py.File(os.path.join(directory, rank_file(rank)), "r") as f:
        return read_tree(f["state"], arrays)


def read_value(directory: str, rank: int, path: str, sums: dict | None = None):
    """One entry of rank ``rank``'s state tree, ``path`` like ``"algo/L"`` or ``"model/buffers"``
    (reads that part only); KeyError if absent. ``sums`` (the manifest's ``{dataset: sha256}`` of
    that file): ``CheckpointError`` unless every dataset read matches."""
    import h5py

    from ssdmpi.checkpoint.format import VALUES, dataset_digest

    parent, _, key = ("state/" + path).rpartition("/")
    with h5py.File(os.path.join(directory, rank_file(rank)), "r") as f:
        group = f[parent]
        if key in group:
            item = group[key]
            if sums is not None:
                found = []
                if isinstance(item, h5py.Group):
                    item.visititems(lambda _, obj: found.append(obj) if isinstance(obj, h5py.Dataset) else None)
                else:
                    found.append(item)
                for ds in found:
                    if sums.get(ds.name) != dataset_digest(ds):
                        raise CheckpointError(f"{directory}/{rank_file(rank)}: {ds.name} checksum mismatch "
                                              "(corrupt file)")
            return read_tree(item) if isinstance(item, h5py.Group) else read_dataset(item)
        if VALUES in group:
            values = json.loads(group[VALUES].asstr()[()])
            if key in values:
                return values[key]
    raise KeyError(path)


def read_piece(directory: str, name: str, rank: int, check: str | None = None) -> np.ndarray:
    """Piece ``rank`` of shared array ``name``; with ``check`` (its sha256 from the manifest):
    ``CheckpointError`` unless the bytes read match it."""
    import h5py

    with h5py.File(os.path.join(directory, rank_file(rank)), "r") as f:
        a = f[f"shared/{name}"][()]
    if check is not None and digest(a) != check:
        raise CheckpointError(f"{directory}/{rank_file(rank)}: /shared/{name} checksum mismatch (corrupt file)")
    return a


def read_shared(directory: str, manifest: dict, name: str, check: bool = True) -> np.ndarray:
    """The whole shared array ``name`` (following ``aliases``), read from every rank's piece."""
    name = manifest.get("aliases", {}).get(name, name)
    info = manifest["shared"][name]
    out = np.empty(int(info["size"]), dtype=np.dtype(info["dtype"]))
    n = int(manifest["world_size"])
    for rank in range(n):
        sums = manifest["files"][rank_file(rank)]["datasets"] if check else {}
        out[piece(out.size, rank, n)] = read_piece(directory, name, rank, sums.get(f"/shared/{name}"))
    return out


# --- verifying ----------------------------------------------------------------------------------

def verify(directory: str, deep: bool = True) -> list:
    """Problems found in the checkpoint directory (empty: complete and every checksum verifies).
    ``deep=False`` checks only that the manifest is there and every file has its size."""
    try:
        manifest = read_manifest(directory)
    except CheckpointError as exc:
        return [str(exc).replace(f"{directory}: ", "").replace(f"{directory} ", "")]
    problems = []
    files = manifest.get("files", {})
    n = int(manifest.get("world_size", 0))
    for rank in range(n):
        if rank_file(rank) not in files:
            problems.append(f"the manifest lists no {rank_file(rank)}")
    for name, info in sorted(files.items()):
        path = os.path.join(directory, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            problems.append(f"{name} is missing")
            continue
        if size != int(info.get("bytes", -1)):
            problems.append(f"{name} has {size} bytes, the manifest says {info.get('bytes')} (truncated or replaced)")
        elif deep:
            problems += [f"{name}: {p}" for p in _verify_datasets(path, info.get("datasets", {}))]
    return problems


def _verify_datasets(path: str, datasets: dict) -> list:
    import h5py

    from ssdmpi.checkpoint.format import dataset_digest

    problems = []
    try:
        with h5py.File(path, "r") as f:
            for name, expected in sorted(datasets.items()):
                if name not in f:
                    problems.append(f"dataset {name} is missing")
                elif dataset_digest(f[name]) != expected:
                    problems.append(f"dataset {name} checksum mismatch")
    except Exception as exc:   # h5py raises OSError/KeyError/RuntimeError/ValueError on damaged files
        problems.append(f"unreadable ({error_line(exc)})")
    return problems


def created_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
