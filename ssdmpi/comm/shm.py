"""MPI shared-memory segments in ``/dev/shm``: which are in use, which are stale, cleanup.

MPICH (4.x and later) keeps the ranks of one node in a POSIX shared-memory segment named
``mpich_shm_<id>_<node>`` (and ``mpich_vci_<id>_<node>``), where ``<id>`` is a hash of the
launcher's job name (the PMI kvsname: for ``srun --mpi=pmi2`` the Slurm job and step id).
``MPI_Finalize`` removes it; a job that ends by ``MPI_Abort``, ``kill -9`` or a timeout does
not. A later job whose id hashes to the same name attaches to the stale segment and fails in
``MPI_Init`` (seen as "Message truncated" or UCX address errors), typically after a Slurm
whose job ids started again from 1. Open MPI's segments (``sm_segment.*``, ``vader_segment.*``)
can be left behind the same way.

A segment is *stale* when no process maps it and it is older than a few seconds (a segment
being created is mapped within microseconds). ``python -m ssdmpi.comm.shm --clean`` removes
this user's stale segments; a Slurm prolog/epilog can run it as root for a node.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PATTERN = re.compile(r"^(mpich_(shm|vci)_|sm_segment\.|vader_segment\.)")
MIN_AGE_S = 5.0


def is_mpi_segment(name: str) -> bool:
    """Whether a ``/dev/shm`` file name is one of MPICH's or Open MPI's node segments."""
    return bool(PATTERN.match(name))


def mapped_segments(pid: int | str = "self", shm_dir: Path = SHM_DIR) -> set[str]:
    """Names of the MPI segments under ``shm_dir`` that process ``pid`` maps (empty if unreadable)."""
    prefix = str(shm_dir).rstrip("/") + "/"
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    names = set()
    for line in lines:
        parts = line.split(maxsplit=5)       # address perms offset dev inode [path]
        path = parts[5] if len(parts) == 6 else ""
        if path.startswith(prefix):
            name = path[len(prefix):].split(" ", 1)[0]   # "name (deleted)" once unlinked
            if is_mpi_segment(name):
                names.add(name)
    return names


def segments_in_use(shm_dir: Path = SHM_DIR) -> set[str]:
    """Names of MPI segments mapped by any process whose memory map this user can read."""
    used = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            used |= mapped_segments(proc.name, shm_dir)
    return used


def stale_segments(shm_dir: Path = SHM_DIR, min_age_s: float = MIN_AGE_S, uid: int | None = None) -> list[Path]:
    """MPI segments owned by ``uid`` (default: this user; root: anyone) that no process maps
    and that were last modified at least ``min_age_s`` seconds ago."""
    if uid is None and os.geteuid() != 0:
        uid = os.geteuid()
    now = time.time()
    candidates = []
    for path in sorted(shm_dir.glob("*")):
        if not is_mpi_segment(path.name):
            continue
        try:
            st = path.stat()
        except OSError:
            continue
        if (uid is None or st.st_uid == uid) and now - st.st_mtime >= min_age_s:
            candidates.append(path)
    if not candidates:
        return []
    used = segments_in_use(shm_dir)
    return [p for p in candidates if p.name not in used]


def remove_stale_segments(shm_dir: Path = SHM_DIR, min_age_s: float = MIN_AGE_S, uid: int | None = None) -> list[str]:
    """Remove :func:`stale_segments`; return the names removed."""
    removed = []
    for path in stale_segments(shm_dir, min_age_s, uid):
        try:
            path.unlink()
            removed.append(path.name)
        except OSError:
            pass
    return removed


def unlink_own_segments(shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink the MPI segments this process maps; for the abort path only.

    ``MPI_Abort`` kills the node's ranks before MPI can remove its segment. Unlinking the
    name first is harmless to ranks still running (their mappings stay valid) and leaves
    nothing behind for a later job to attach to."""
    removed = []
    for name in mapped_segments("self", shm_dir):
        try:
            (shm_dir / name).unlink()
            removed.append(name)
        except OSError:
            pass
    return removed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m ssdmpi.comm.shm",
                                     description="List (or remove) stale MPI shared-memory segments in /dev/shm.")
    parser.add_argument("--clean", action="store_true", help="remove them (default: only list them)")
    parser.add_argument("--min-age", type=float, default=MIN_AGE_S, metavar="S",
                        help=f"only segments unmodified for S seconds (default {MIN_AGE_S:g})")
    parser.add_argument("--dir", type=Path, default=SHM_DIR, help=f"shared-memory directory (default {SHM_DIR})")
    args = parser.parse_args(argv)
    if args.min_age < 0:
        parser.error("--min-age must be >= 0")
    if args.clean:
        names = remove_stale_segments(args.dir, args.min_age)
        verb = "removed"
    else:
        names = [p.name for p in stale_segments(args.dir, args.min_age)]
        verb = "stale"
    for name in names:
        print(f"{verb}: {args.dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
