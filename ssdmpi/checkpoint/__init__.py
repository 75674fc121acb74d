"""HDF5 checkpoints of the complete training state: atomic, checksummed, resumable bit-for-bit.

- ``format.py``: what a file holds (layout, state trees <-> HDF5 groups, sha256 checksums),
  reading, verifying, describing. Serial (no MPI).
- ``store.py``: files on disk: names (``ckpt-<step:08d>.h5``), atomic writes, listing,
  resume selection, retention, compatibility with a job. Serial (no MPI).
- ``collective.py``: ``save_collective``/``load_collective``, collective over a
  Communicator: rank 0 writes and reads the one file, one rank's state at a time.

The public names are re-exported here (``from ssdmpi import checkpoint``;
``checkpoint.select_resume(...)``).
"""

from ssdmpi.checkpoint.collective import load_collective, save_collective
from ssdmpi.checkpoint.format import (
    DEDUPE_MIN_SIZE,
    FORMAT,
    FORMAT_VERSION,
    CheckpointError,
    describe,
    read_meta,
    read_rank_state,
    read_shared,
    read_tree,
    verify,
    write_contents,
    write_tree,
)
from ssdmpi.checkpoint.store import (
    check_compatible,
    checkpoint_name,
    list_checkpoints,
    resolve_path,
    retain,
    select_resume,
    write_checkpoint,
)

__all__ = ["DEDUPE_MIN_SIZE", "FORMAT", "FORMAT_VERSION", "CheckpointError", "check_compatible", "checkpoint_name",
           "describe", "list_checkpoints", "load_collective", "read_meta", "read_rank_state", "read_shared",
           "read_tree", "resolve_path", "retain", "save_collective", "select_resume", "verify", "write_checkpoint",
           "write_contents", "write_tree"]
