"""Checkpoint files on disk: names, atomic writes, listing, resume selection, retention.

Files are ``<run_dir>/checkpoints/ckpt-<step:08d>.h5`` (``checkpoint_name``); the layout
inside is ``format.py``'s. Writes are atomic: a temporary file in the same directory,
flushed and fsynced, renamed over the final name, then the directory fsynced; an existing
file is never written in place. ``retain(directory, keep)`` deletes all but the newest
``keep`` files. ``select_resume(directory)`` picks the newest checkpoint that verifies and
warns about each corrupt one it skips. Plain file functions: rank 0 or a serial tool.
"""

from __future__ import annotations

import os
import re
import sys

from ssdmpi.checkpoint.format import CheckpointError, verify, write_contents
from ssdmpi.errors import UserError

NAME_RE = re.compile(r"^ckpt-(\d{8,})\.h5$")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{int(step):08d}.h5"


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
    """Write one checkpoint file atomically (contents: ``format.write_contents``); return ``path``."""
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
        _fsync_dir(directory)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


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
    for _step, path in reversed(found):
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


