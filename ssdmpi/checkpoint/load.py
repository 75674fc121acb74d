"""Reading checkpoints back: a job's state on the same or another number of ranks (``restore``),
and the model to evaluate (``read_model``).

``restore`` is collective and moves no state through rank 0: each rank reads its own file, and
each piece of a shared array is read by one rank (the old piece ``p`` by new rank ``p % N'``) and
broadcast from it. On the same number of ranks every rank gets back exactly what it saved (bit
for bit); on another number (format 2 only) ``TrainingState.resized_state`` builds each rank's
state from the old ranks' through ``OldRanks`` (the rules: ``ssdmpi/algos/resize.py``).
"""

from __future__ import annotations

import os

import numpy as np

from ssdmpi.checkpoint import format as format1
from ssdmpi.checkpoint import sharded, store
from ssdmpi.checkpoint.format import ArrayInfo, CheckpointError, error_line
from ssdmpi.checkpoint.snapshot import WEIGHTS
from ssdmpi.errors import UserError


def _reading(path: str, fn):
    """``fn()``, with a damaged or missing file reported as one ``CheckpointError`` line."""
    try:
        return fn()
    except UserError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {error_line(exc)}") from None


# --- the model to evaluate ------------------------------------------------------------------------

def read_model(path: str, local: bool = False) -> tuple[dict, np.ndarray, dict]:
    """``(meta, weights, buffers)``: the global model ``W`` with the model buffers (BatchNorm
    statistics) of the ranks that trained averaged as the run's evaluation averaged them
    (``ssdmpi/nn/buffers.py``; a format-1 file holds rank 0's only), or (``local``) rank 0's
    local model ``L`` with rank 0's own buffers; reading only those, their checksums verified
    (format 2). ``path`` is a checkpoint (``store.resolve_path``)."""
    from ssdmpi.nn.buffers import average

    meta = store.read_meta(path)
    if not os.path.isdir(path):
        shared = _reading(path, lambda: format1.read_shared(path, "model"))
        weights, buffers = shared["global_weights"], shared.get("buffers", {})
        if local:
            weights = _reading(path, lambda: format1.read_rank_state(path, 0)).get("algo", {}).get("L")
    else:
        sums = meta["files"][sharded.rank_file(0)]["datasets"]
        buffers = _reading(path, lambda: sharded.read_value(path, 0, "model/buffers", sums))
        if local:
            try:
                weights = _reading(path, lambda: sharded.read_value(path, 0, "algo/L", sums))
            except CheckpointError:
                weights = None
        else:
            weights = _reading(path, lambda: sharded.read_shared(path, meta, WEIGHTS))
            if buffers:
                workers = int(meta.get("workers") or meta["world_size"])
                buffers = {**buffers, **average([buffers] + _rank_buffers(path, meta, range(1, workers)))}
    if weights is None:
        raise UserError(f"{path} was written in the {meta.get('stage')} stage: there is no local model L; "
                        "drop --local")
    return meta, np.asarray(weights), dict(buffers)


def _rank_buffers(path: str, meta: dict, ranks) -> list:
    """The model buffers of each of ``ranks`` (format 2), checksums verified."""
    out = []
    for rank in ranks:
        sums = meta["files"][sharded.rank_file(rank)]["datasets"]
        out.append(dict(_reading(path, lambda r=rank, s=sums: sharded.read_value(path, r, "model/buffers", s))))
    return out


# --- resuming ---------------------------------------------------------------------------------------

def restore(comm, path: str, meta: dict, state) -> dict | None:
    """Collective: load checkpoint ``path`` (``meta``: its metadata, the same on every rank) into
    ``state`` (a ``TrainingState``). Returns the ``resize`` metrics record when the checkpoint was
    written by another number of ranks, else None. Errors are collective ``UserError``s."""
    old = int(meta["world_size"])
    if not os.path.isdir(path):
        if old != comm.size:
            raise CheckpointError(f"{path} (format 1) was written by {old} ranks; resume it with mpiexec -n {old}",
                                  collective=True)
        tree = comm.agree(lambda: _reading(path, lambda: format1.read_rank_state(path, comm.rank)))
        comm.agree(lambda: state.load_state_dict(tree))
        return None
    ranks = OldRanks(comm, path, meta)
    if old == comm.size:
        tree = comm.agree(lambda: _reading(path, lambda: sharded.read_rank_state(path, comm.rank)))
        for name in ranks.shared_names("algo"):
            tree["algo"][name.split("/", 1)[1]] = ranks.shared(name)
        record = None
    else:
        tree, record = state.resized_state(ranks)
    comm.agree(lambda: state.load_state_dict(tree))
    return record


class OldRanks:
    """The ranks that wrote a format-2 checkpoint, as the ranks of this job read them (the
    ``ctx`` of ``ssdmpi/algos/resize.py``). Methods marked collective are called by every rank
    in the same order; a rank's read error is raised on every rank."""

    def __init__(self, comm, directory: str, manifest: dict):
        self.comm, self.directory, self.manifest = comm, directory, manifest
        self.old_size, self.new_size, self.rank = int(manifest["world_size"]), comm.size, comm.rank
        self.mine = [r for r in range(self.old_size) if r % self.new_size == self.rank]   # old ranks this one reads
        self._rank0 = None

    def _node(self, group: str) -> dict:
        if self._rank0 is None:   # old rank 0's tree without its arrays (collective: first use is by all)
            self._rank0 = self.comm.agree(lambda: _reading(self.directory, lambda: sharded.read_rank_state(
                self.directory, 0, arrays=False)))
        node = self._rank0
        for key in group.split("/"):
            node = node.get(key, {})
        return node

    def values(self, group: str) -> dict:
        """Old rank 0's plain values (numbers, strings, JSON) in ``group`` (``"algo"``, ``"loader"``)."""
        return {k: v for k, v in self._node(group).items() if not isinstance(v, ArrayInfo)}

    def arrays(self, group: str) -> dict:
        """``{name: ArrayInfo}`` of the per-rank arrays in ``group`` (as old rank 0 holds them)."""
        return {k: v for k, v in self._node(group).items() if isinstance(v, ArrayInfo)}

    def shared_names(self, group: str) -> list:
        """The shared (replicated) arrays stored under ``group``, e.g. ``["algo/M", "algo/W"]``."""
        return sorted(n for n in self.manifest.get("shared", {}) if n.startswith(group + "/"))

    def of_rank(self, rank: int, path: str):
        """Old rank ``rank``'s value at ``path`` (this rank reads it alone)."""
        return _reading(self.directory, lambda: sharded.read_value(self.directory, rank, path))

    def shared(self, name: str) -> np.ndarray:
        """Collective: the whole shared array ``name``, each piece read by one rank and broadcast."""
        name = self.manifest.get("aliases", {}).get(name, name)
        info = self.manifest["shared"][name]
        out = np.empty(int(info["size"]), dtype=np.dtype(info["dtype"]))
        parts = [sharded.piece(out.size, p, self.old_size) for p in range(self.old_size)]

        def read_mine():
            for p in self.mine:
                out[parts[p]] = sharded.read_piece(self.directory, name, p)

        self.comm.agree(lambda: _reading(self.directory, read_mine))
        for p, part in enumerate(parts):
            self.comm.broadcast(out[part], root=p % self.new_size)
        return out

    def weights(self) -> np.ndarray:
        """Collective: the global model ``W`` the checkpoint holds."""
        return self.shared(WEIGHTS)

    def mean(self, path: str) -> np.ndarray:
        """Collective: the mean over the old ranks of their per-rank array at ``path`` (summed in
        float64: each rank its own old ranks, then one allreduce), in its own dtype."""
        info = self._node(os.path.dirname(path))[os.path.basename(path)]
        total = np.zeros(info.shape, dtype=np.float64)

        def add_mine():
            for r in self.mine:
                total[...] += sharded.read_value(self.directory, r, path)

        self.comm.agree(lambda: _reading(self.directory, add_mine))
        self.comm.allreduce(total.reshape(-1), average=False)
        return (total / self.old_size).astype(info.dtype)
