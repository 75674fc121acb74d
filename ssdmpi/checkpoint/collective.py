"""Collective save and load: every rank's state in one file, written and read by rank 0.

Both go through the Communicator's control calls (``gather_trees``/``scatter_trees``,
``broadcast_object``), which move one rank's state at a time, so rank 0 holds at most
two ranks' state (its own and the one in transit).
"""

from __future__ import annotations

import os
import time

from ssdmpi.checkpoint.format import CheckpointError, error_line, read_meta, read_tree
from ssdmpi.checkpoint.store import checkpoint_name, retain, write_checkpoint
from ssdmpi.errors import UserError


def save_collective(comm, directory: str, step: int, meta: dict, state: dict,
                    shared: dict | None = None, keep: int = 0) -> str:
    """Every rank passes its state tree; rank 0 writes ``directory/ckpt-<step>.h5``; all get its path.

    Collective over ``comm`` (a Communicator). Rank 0 receives each rank's state in turn
    and writes it at once. If rank 0 cannot write (disk full, permissions), every rank
    raises the same ``UserError`` (collective) after all sends have completed, so nobody hangs.
    """
    path = os.path.join(directory, checkpoint_name(step))
    error = None
    states = comm.gather_trees(state, root=0)
    if comm.rank == 0:
        try:
            meta = dict(meta, world_size=comm.size, step=int(step), created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            write_checkpoint(path, meta, states, shared)
            retain(directory, keep)
        except Exception as exc:
            error = f"cannot write checkpoint {path}: {getattr(exc, 'strerror', None) or error_line(exc)}"
            for _ in states:   # drain the remaining ranks' sends so they do not block forever
                pass
    error = comm.broadcast_object(error, root=0)
    if error:
        raise UserError(error, collective=True)
    return path


def load_collective(comm, path: str | None) -> tuple[dict, dict, dict]:
    """Rank 0 reads ``path`` and sends every rank its state: returns ``(meta, state, shared)``.

    Collective over ``comm`` (a Communicator); ``path`` matters on rank 0 only (it was
    verified there). ``shared`` (global weights, rank 0's buffers) is returned on rank 0
    only ({} elsewhere). Errors reading the file are raised on every rank (collective
    ``CheckpointError``).
    """
    meta, error = None, None
    if comm.rank == 0:
        try:
            meta = read_meta(path)
        except CheckpointError as exc:
            error = str(exc)
    meta, error = comm.broadcast_object((meta, error), root=0)
    if error:
        raise CheckpointError(error, collective=True)
    if int(meta.get("world_size", -1)) != comm.size:
        raise CheckpointError(f"the checkpoint was written by {meta.get('world_size')} ranks but this job has "
                              f"{comm.size}; resume with mpiexec -n {meta.get('world_size')}", collective=True)
    if comm.rank != 0:
        return meta, comm.scatter_trees(root=0), {}
    import h5py

    with h5py.File(path, "r") as f:
        state = comm.scatter_trees(lambda r: read_tree(f[f"rank_{r:04d}"]), root=0)
        shared = read_tree(f["model"]) if "model" in f else {}
    return meta, state, shared
