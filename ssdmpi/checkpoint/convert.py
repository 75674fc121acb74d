"""``ssdmpi ckpt convert``: a format-1 checkpoint file rewritten as a format-2 directory.

A format-1 file resumes as it is, on its own number of ranks; converted, it also resumes on
another (``load.py``). Each rank's group becomes that rank's file; the algorithm arrays that
are bitwise the same on every rank (``W``, ``M``, a held mean) become the shared arrays,
written once in pieces; the global model evaluation reads (``/model/global_weights``) is
stored too, or named an alias of ``algo/W`` when equal to it. The model's parameters, which
format 1 kept per rank, are left out (they are ``W`` or ``L``). Serial, no MPI.
"""

from __future__ import annotations

import os

import numpy as np

from ssdmpi.checkpoint import format as format1
from ssdmpi.checkpoint import sharded, store
from ssdmpi.checkpoint.format import CheckpointError
from ssdmpi.checkpoint.snapshot import HostBuffers

# The keys a run shares (``Algorithm.replicated()``: ssdmpi/algos/base.py, period.py). Other arrays may be
# equal on every rank by chance (delta-merge's ``S`` right after a merge is ``W``): they stay per rank.
SHAREABLE = ("W", "M", "period.Rp")


def _replicated(states: list) -> tuple:
    """Paths ``algo/<key>`` of the ``SHAREABLE`` 1-D arrays equal on every rank."""
    first = states[0].get("algo", {})
    return tuple(f"algo/{key}" for key, value in first.items()
                 if key in SHAREABLE and isinstance(value, np.ndarray) and value.ndim == 1
                 and all(np.array_equal(s.get("algo", {}).get(key), value) for s in states[1:]))


def convert(path: str) -> str:
    """Write ``path`` (format 1, ``ckpt-<step>.h5``) as ``ckpt-<step>/`` beside it; return the new path.
    ``CheckpointError`` if ``path`` does not verify or ``ckpt-<step>/`` exists already."""
    problems = format1.verify(path)
    if problems:
        raise CheckpointError(f"{path} is corrupt: {problems[0]}")
    meta = format1.read_meta(path)
    directory = os.path.dirname(os.path.abspath(path))
    final = os.path.join(directory, store.checkpoint_name(int(meta["step"])))
    if os.path.lexists(final):
        raise CheckpointError(f"{final} exists already; remove it to convert {path} again")
    n = int(meta["world_size"])
    states = [format1.read_rank_state(path, rank) for rank in range(n)]
    for state in states:
        state.get("model", {}).pop("params", None)
    weights = format1.read_shared(path, "model")["global_weights"]
    replicated = _replicated(states)
    if "algo/W" in replicated and np.array_equal(weights, states[0]["algo"]["W"]):
        weights = None
    partial = store.partial_name(directory, int(meta["step"]), store.new_token())
    os.makedirs(partial)
    files, shared, aliases = {}, {}, {}
    for rank, state in enumerate(states):
        snap = HostBuffers().take(state, replicated, rank, n, weights)
        report = sharded.write_rank_file(os.path.join(partial, sharded.rank_file(rank)), snap.state, snap.pieces)
        files[sharded.rank_file(rank)] = {"rank": rank, **report}
        shared, aliases = snap.shared, snap.aliases
    fields = {k: v for k, v in meta.items() if k not in ("manifest", "format", "format_version")}
    sharded.write_manifest(partial, dict(fields, converted_from=os.path.basename(path)), files, shared, aliases)
    return store.commit(partial, final)
