"""HDF5 checkpoints of the complete training state: atomic, checksummed, resumable bit-for-bit.

One file per checkpoint, ``<run_dir>/checkpoints/ckpt-<step:08d>.h5``, written by rank 0
alone (every other rank sends it its state over the control communicator, one rank at a
time, so rank 0 holds at most two ranks' state). Plain h5py or ``h5dump`` can read it:

    /                               attrs: format="ssdmpi-checkpoint", format_version=1,
                                           world_size, step, epoch, stage, model, algo, dataset,
                                           reason, created (informational copies of /meta)
    /meta                           JSON string: the fields above, the resolved config, and
                                    "manifest": {dataset path: sha256} of every other dataset
    /model/global_weights           float [n]   the global model W (from rank 0)
    /model/buffers/<name>           rank 0's BatchNorm running statistics (what ``ssdmpi eval`` uses)
    /rank_0000/ ... /rank_<N-1>/    one group per rank: that rank's whole state, a tree of
        model/params                    the flat parameter buffer as the model held it (W in the
                                        warm-up, this rank's L in the delay stage)
        model/buffers/<name>            this rank's BN statistics
        algo/...                        algo.state_dict() (W, M, L, P, accumulators, counters t, s,
                                        stage, ...; see ssdmpi/algos/__init__.py)
        loader/...                      loader.state_dict() (epoch, position, seeds: the data order
                                        and augmentation draws are functions of these)
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

Example: ``h5py.File(path)["rank_0001/algo/L"][()]`` is rank 1's local model;
``ssdmpi ckpt inspect PATH`` lists everything; ``ssdmpi ckpt verify PATH`` checks it.

Writes are atomic: a temporary file in the same directory, flushed and fsynced, renamed
over the final name, then the directory fsynced; an existing file is never written in
place. ``retain(directory, keep)`` deletes all but the newest ``keep`` files.
``select_resume(directory)`` picks the newest checkpoint that verifies and warns about
each corrupt one it skips.

Which rank: functions named ``*_collective`` are collective over the control
communicator; the others are plain file functions (rank 0 or a serial tool).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time

import numpy as np

from ssdmpi.errors import UserError

FORMAT = "ssdmpi-checkpoint"
FORMAT_VERSION = 1
NAME_RE = re.compile(r"^ckpt-(\d{8,})\.h5$")
VALUES = "_values"
_TAG = 7301   # point-to-point tag on the control communicator


class CheckpointError(UserError):
    """A checkpoint that cannot be used (corrupt, wrong world size or model, missing)."""


def checkpoint_name(step: int) -> str:
    return f"ckpt-{int(step):08d}.h5"


# --- trees of state <-> HDF5 groups -----------------------------------------------------------

def _digest(a: np.ndarray) -> str:
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
                digest = _digest(a)
                if digest in seen:
                    group[key] = h5py.SoftLink(seen[digest])
                    continue
            ds = group.create_dataset(key, data=a)
            ds.attrs["sha256"] = digest = _digest(a)
            if isinstance(value, np.generic):
                ds.attrs["scalar"] = 1
            manifest[ds.name] = digest
            if a.ndim >= 1 and a.size >= DEDUPE_MIN_SIZE:
                seen[digest] = ds.name
        elif isinstance(value, (list, tuple)) and any(_is_array(x) or isinstance(x, dict) for x in value):
            sub = group.create_group(key)
            sub.attrs["list"] = len(value)
            write_tree(sub, {str(i): x for i, x in enumerate(value)}, manifest, seen)
        else:
            values[key] = _jsonable(value)
    if values:
        text = json.dumps(values, sort_keys=True)
        ds = group.create_dataset(VALUES, data=text)
        ds.attrs["sha256"] = digest = _text_digest(text)
        manifest[ds.name] = digest


def read_tree(group) -> dict | list:
    """The nested dict (or list) written by ``write_tree``; NumPy arrays on the host."""
    import h5py

    out = {}
    for key, item in group.items():
        if key == VALUES:
            out.update(json.loads(item.asstr()[()]))
        elif isinstance(item, h5py.Group):
            out[key] = read_tree(item)
        else:
            a = item[()]
            if item.attrs.get("scalar", 0):
                a = a if isinstance(a, np.generic) else np.asarray(a)[()]
            elif not isinstance(a, np.ndarray):
                a = np.asarray(a)
            out[key] = a
    if "list" in group.attrs:
        return [out[str(i)] for i in range(int(group.attrs["list"]))]
    return out


# --- writing --------------------------------------------------------------------------------

def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_checkpoint(path: str, meta: dict, rank_states, shared: dict | None = None) -> str:
    """Write one checkpoint file atomically and return ``path``.

    ``meta``: JSON-able fields (step, epoch, stage, world_size, config, ...).
    ``rank_states``: iterable of ``(rank, state tree)``, consumed one at a time (so a
    generator can receive them over MPI while the file is written).
    ``shared``: trees written at the top level (``{"model": {"global_weights": W, ...}}``).
    """
    import h5py

    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    manifest: dict = {}
    seen: dict = {}
    try:
        with h5py.File(tmp, "w") as f:
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
            f.flush()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(directory)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


# --- reading and verifying --------------------------------------------------------------------

def read_meta(path: str) -> dict:
    """The ``/meta`` record (config, step, world size, manifest, ...); ``CheckpointError`` if unreadable."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return _meta(f, path)
    except CheckpointError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable checkpoint ({_short(exc)})") from None


def _short(exc) -> str:
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

    problems = []
    try:
        with h5py.File(path, "r") as f:
            meta = _meta(f, path)
            manifest = meta.get("manifest", {})
            for name, digest in manifest.items():
                if name not in f:
                    problems.append(f"dataset {name} is missing")
                    continue
                ds = f[name]
                if ds.dtype.kind in "OSU":
                    actual = _text_digest(ds.asstr()[()])
                else:
                    actual = _digest(np.asarray(ds[()]))
                if actual != digest:
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
        problems.append(f"unreadable ({_short(exc)})")
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


def describe(path: str, datasets: bool = True) -> str:
    """Human-readable listing of a checkpoint (``ssdmpi ckpt inspect``)."""
    import h5py

    meta = read_meta(path)
    cfg = meta.get("config", {})
    lines = [f"checkpoint {path}",
             f"  format {meta.get('format')} v{meta.get('format_version')}, written {meta.get('created', '?')} "
             f"({meta.get('reason', '?')})",
             f"  step {meta.get('step')}, epoch {meta.get('epoch')}, stage {meta.get('stage')}, "
             f"world size {meta.get('world_size')}",
             f"  model {meta.get('model')} ({meta.get('num_params', '?')} parameters, {cfg.get('dtype', '?')}), "
             f"dataset {meta.get('dataset')}, algo {meta.get('algo')}",
             f"  last test accuracy {meta.get('test_acc')}" if meta.get("test_acc") is not None else "",
             "  config: " + ", ".join(f"{k}={v}" for k, v in cfg.items() if v is not None)]
    lines = [line for line in lines if line]
    if datasets:
        lines.append("  datasets:")
        with h5py.File(path, "r") as f:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset) and name != "meta":
                    if obj.dtype.kind in "OSU":
                        lines.append(f"    /{name}  json {len(obj.asstr()[()])} chars")
                    else:
                        lines.append(f"    /{name}  {obj.dtype} {tuple(obj.shape)}")
            f.visititems(visit)

            def visit_link(name):
                link = f.get(name, getlink=True)
                if isinstance(link, h5py.SoftLink):
                    lines.append(f"    /{name}  -> {link.path} (same values, stored once)")
            f.visit_links(visit_link)
    return "\n".join(lines)


# --- directories: listing, selection, retention -----------------------------------------------

def list_checkpoints(directory: str) -> list:
    """``[(step, path)]`` of checkpoint files in ``directory``, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise UserError(f"cannot list checkpoints in {directory}: {exc.strerror or exc}") from None
    found = [(int(m.group(1)), os.path.join(directory, n)) for n in names if (m := NAME_RE.match(n))]
    return sorted(found)


def select_resume(directory: str, warn=None) -> str | None:
    """Path of the newest checkpoint in ``directory`` that verifies (None if there are none).

    Each corrupt one skipped is reported through ``warn(message)``. If checkpoints exist but
    none verifies, ``CheckpointError``.
    """
    found = list_checkpoints(directory)
    for step, path in reversed(found):
        problems = verify(path)
        if not problems:
            return path
        if warn is not None:
            warn(f"warning: skipping corrupt checkpoint {path}: {problems[0]}"
                 + (f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""))
    if found:
        raise CheckpointError(f"none of the {len(found)} checkpoints in {directory} verifies; "
                              "remove them or start a new run directory")
    return None


def retain(directory: str, keep: int) -> list:
    """Delete all but the newest ``keep`` checkpoint files (``keep=0``: keep all); return the deleted."""
    if keep <= 0:
        return []
    found = list_checkpoints(directory)
    deleted = []
    for _, path in found[:-keep]:
        try:
            os.unlink(path)
            deleted.append(path)
        except OSError:
            pass
    return deleted


def resolve_path(path: str) -> str:
    """A checkpoint file from PATH: the file itself, or the newest valid one in a run or checkpoints directory."""
    if os.path.isdir(path):
        directory = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path
        chosen = select_resume(directory, warn=lambda m: print(m, file=sys.stderr, flush=True))
        if chosen is None:
            raise CheckpointError(f"no checkpoint in {directory}")
        return chosen
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    problems = verify(path)
    if problems:
        raise CheckpointError(f"checkpoint {path} is corrupt: {problems[0]}")
    return path


def check_compatible(meta: dict, world_size: int, model: str, num_params: int | None = None) -> None:
    """``CheckpointError`` (one line) unless the checkpoint fits this job."""
    if int(meta.get("world_size", -1)) != world_size:
        raise CheckpointError(f"the checkpoint was written by {meta.get('world_size')} ranks but this job has "
                              f"{world_size}; resume with mpiexec -n {meta.get('world_size')}")
    if meta.get("model") != model:
        raise CheckpointError(f"the checkpoint holds model {meta.get('model')!r}, not {model!r}")
    if num_params is not None and meta.get("num_params") is not None and int(meta["num_params"]) != num_params:
        raise CheckpointError(f"the checkpoint's model has {meta['num_params']} parameters but this one has "
                              f"{num_params} (different --widths?)")


# --- collective save/load over the control communicator ------------------------------------

def _split(tree, arrays: list):
    """``tree`` with each array replaced by a placeholder; the arrays appended to ``arrays``."""
    if isinstance(tree, dict):
        return {k: _split(v, arrays) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)) and any(_is_array(x) or isinstance(x, (dict, list, tuple)) for x in tree):
        return {"__list__": [_split(v, arrays) for v in tree]}
    if _is_array(tree):
        a = _host(tree)
        arrays.append(a)
        return {"__array__": len(arrays) - 1, "dtype": a.dtype.str, "shape": list(a.shape)}
    return tree


def _join(skeleton, arrays: list):
    if isinstance(skeleton, dict):
        if "__array__" in skeleton and set(skeleton) == {"__array__", "dtype", "shape"}:
            return arrays[skeleton["__array__"]]
        if set(skeleton) == {"__list__"}:
            return [_join(v, arrays) for v in skeleton["__list__"]]
        return {k: _join(v, arrays) for k, v in skeleton.items()}
    return skeleton


def send_tree(comm, tree, dest: int) -> None:
    """Send a state tree: the skeleton pickled, each array as a raw buffer (no pickling of data)."""
    arrays: list = []
    comm.send(_split(tree, arrays), dest=dest, tag=_TAG)
    for a in arrays:
        if a.size:
            comm.Send(a.reshape(-1).view(np.uint8), dest=dest, tag=_TAG)


def recv_tree(comm, source: int):
    skeleton = comm.recv(source=source, tag=_TAG)
    arrays = []

    def collect(node):
        if isinstance(node, dict):
            if "__array__" in node and set(node) == {"__array__", "dtype", "shape"}:
                a = np.empty(node["shape"], dtype=np.dtype(node["dtype"]))
                if a.size:
                    comm.Recv(a.reshape(-1).view(np.uint8), source=source, tag=_TAG)
                arrays.append(a)
                return
            for v in (node["__list__"] if set(node) == {"__list__"} else node.values()):
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    collect(skeleton)   # arrays arrive in the order _split appended them (depth-first, insertion order)
    return _join(skeleton, arrays)


def save_collective(control, directory: str, step: int, meta: dict, state: dict,
                    shared: dict | None = None, keep: int = 0) -> str:
    """Every rank passes its state tree; rank 0 writes ``directory/ckpt-<step>.h5``; all get its path.

    Collective over ``control``. Rank 0 receives each rank's state in turn and writes it at
    once. If rank 0 cannot write (disk full, permissions), every rank raises the same
    ``UserError`` (collective) after all sends have completed, so nobody hangs.
    """
    rank, size = control.Get_rank(), control.Get_size()
    path = os.path.join(directory, checkpoint_name(step))
    error = None
    if rank == 0:
        def states():
            yield 0, state
            for r in range(1, size):
                yield r, recv_tree(control, r)

        gen = states()
        try:
            meta = dict(meta, world_size=size, step=int(step),
                        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            write_checkpoint(path, meta, gen, shared)
            retain(directory, keep)
        except Exception as exc:
            error = f"cannot write checkpoint {path}: {getattr(exc, 'strerror', None) or _short(exc)}"
            for _ in gen:   # drain the remaining ranks' sends so they do not block forever
                pass
    else:
        send_tree(control, state, 0)
    error = control.bcast(error, root=0)
    if error:
        raise UserError(error, collective=True)
    return path


def load_collective(control, path: str | None) -> tuple[dict, dict, dict]:
    """Rank 0 reads ``path`` and sends every rank its state: returns ``(meta, state, shared)``.

    Collective over ``control``; ``path`` matters on rank 0 only (it was verified there).
    ``shared`` (global weights, rank 0's buffers) is returned on rank 0 only ({} elsewhere).
    Errors reading the file are raised on every rank (collective ``CheckpointError``).
    """
    rank, size = control.Get_rank(), control.Get_size()
    meta, error = None, None
    if rank == 0:
        try:
            meta = read_meta(path)
        except CheckpointError as exc:
            error = str(exc)
    meta, error = control.bcast((meta, error), root=0)
    if error:
        raise CheckpointError(error, collective=True)
    if int(meta.get("world_size", -1)) != size:
        raise CheckpointError(f"the checkpoint was written by {meta.get('world_size')} ranks but this job has "
                              f"{size}; resume with mpiexec -n {meta.get('world_size')}", collective=True)
    shared: dict = {}
    if rank == 0:
        import h5py

        with h5py.File(path, "r") as f:
            for r in range(1, size):
                send_tree(control, read_tree(f[f"rank_{r:04d}"]), r)
            state = read_tree(f["rank_0000"])
            if "model" in f:
                shared = read_tree(f["model"])
    else:
        state = recv_tree(control, 0)
    return meta, state, shared
