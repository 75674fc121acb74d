"""Checkpoints of the complete training state: sharded, written in the background, atomic,
checksummed, resumable bit for bit, or on another number of ranks.

- ``sharded.py``: format 2, what ``ssdmpi train`` writes: a directory per checkpoint, one HDF5
  file per rank (its own state and its piece of the shared arrays), a manifest. Serial.
- ``format.py``: state trees <-> HDF5 groups with checksums; format 1 (one file, still read).
- ``snapshot.py``: one rank's state copied into reused (pinned) host buffers.
- ``writer.py``: ``CheckpointWriter``: each rank writes its file on a thread while training
  goes on; the manifest, written by rank 0 once every rank's file is complete, commits it.
- ``load.py``: ``restore`` (collective: the same number of ranks, bit for bit, or another:
  the global state exact, the per-rank state merged by the rules of ``ssdmpi/algos/resize.py``,
  docs/ALGORITHM.md section 6) and ``read_model`` (the weights to evaluate, nothing else).
- ``store.py``: names, listing, resume selection, the commit rename, ``best``/``last`` links,
  retention. Serial.

The public names are re-exported here (``from ssdmpi import checkpoint``;
``checkpoint.select_resume(...)``).
"""

from ssdmpi.checkpoint.format import FORMAT, CheckpointError
from ssdmpi.checkpoint.load import read_model, restore
from ssdmpi.checkpoint.sharded import FORMAT_VERSION
from ssdmpi.checkpoint.store import (
    BEST,
    LAST,
    check_compatible,
    checkpoint_name,
    link_target,
    list_checkpoints,
    read_meta,
    resolve_path,
    retain,
    select_resume,
    size_of,
    verify,
)
from ssdmpi.checkpoint.writer import CheckpointWriter

__all__ = ["BEST", "FORMAT", "FORMAT_VERSION", "LAST", "CheckpointError", "CheckpointWriter", "check_compatible",
           "checkpoint_name", "link_target", "list_checkpoints", "read_meta", "read_model", "resolve_path", "restore",
           "retain", "select_resume", "size_of", "verify"]
