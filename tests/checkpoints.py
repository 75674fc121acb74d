"""Reading every saved field of a checkpoint (either format) with plain h5py and json, for tests
that compare two checkpoints field by field, integers and strings included."""

import json
import os

import h5py
import numpy as np

# Wall-clock fields: they differ between any two runs (the manifest's and the trainer's times).
VOLATILE = {"trainer/elapsed", "trainer/train_s"}


def _flatten(group, prefix: str, out: dict) -> None:
    for key, item in group.items():
        if key == "_values":
            for name, value in json.loads(item.asstr()[()]).items():
                out[f"{prefix}{name}"] = value
        elif isinstance(item, h5py.Group):
            _flatten(item, f"{prefix}{key}/", out)
        else:
            out[f"{prefix}{key}"] = item[()]


def fields(path: str) -> dict:
    """``{name: value}`` of every saved field: ``rank_RRRR/<state path>`` per rank, and for a
    directory checkpoint ``shared/<name>`` (the shared arrays, pieces joined) and ``meta/<key>``
    for the manifest's step, stage, epoch and world size. Wall-clock fields are left out."""
    out: dict = {}
    if os.path.isdir(path):
        with open(os.path.join(path, "manifest.json")) as fh:
            manifest = json.load(fh)
        n = manifest["world_size"]
        pieces: dict = {}
        for rank in range(n):
            with h5py.File(os.path.join(path, f"rank-{rank:04d}.h5"), "r") as f:
                state: dict = {}
                _flatten(f["state"], "", state)
                out.update({f"rank_{rank:04d}/{k}": v for k, v in state.items() if k not in VOLATILE})
                _flatten(f["shared"], "", pieces.setdefault(rank, {}))
        for name in manifest["shared"]:
            out[f"shared/{name}"] = np.concatenate([pieces[r][name] for r in range(n)])
        out.update({f"meta/{k}": manifest[k] for k in ("step", "stage", "epoch", "world_size")})
    else:
        with h5py.File(path, "r") as f:
            state = {}
            _flatten(f, "", state)
        out.update({k: v for k, v in state.items() if k.split("/", 1)[-1] not in VOLATILE and k != "meta"})
    return out


def differences(a: dict, b: dict) -> list:
    """Names whose values differ between two ``fields()`` results (arrays: dtype and every bit)."""
    diff = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            diff.append(name)
            continue
        x, y = a[name], b[name]
        if isinstance(x, (np.ndarray, np.generic)) or isinstance(y, (np.ndarray, np.generic)):
            same = (type(x) is type(y) and np.asarray(x).dtype == np.asarray(y).dtype
                    and np.array_equal(np.asarray(x), np.asarray(y)))
        else:
            same = type(x) is type(y) and x == y
        if not same:
            diff.append(name)
    return diff


def newest(run_dir: str) -> str:
    """The newest checkpoint of a run (by name; the ``best``/``last`` links and partial directories excluded)."""
    names = sorted(n for n in os.listdir(os.path.join(run_dir, "checkpoints")) if n.startswith("ckpt-"))
    return os.path.join(run_dir, "checkpoints", names[-1])
