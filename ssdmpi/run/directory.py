"""The run directory (rank 0): a new one claimed (unique even for runs started in the same second),
prepared (a fresh run never starts over an old one), undone after a failed start, and its metrics
trimmed to a resumed step."""

from __future__ import annotations

import os
import time

from ssdmpi import checkpoint
from ssdmpi.errors import UserError
from ssdmpi.loggers import record_lines
from ssdmpi.metrics import atomic_write


def claim_run_dir(base: str) -> tuple[str, list]:
    """A new, empty run directory: ``base``, or ``base-2``, ``base-3``, ... when that is taken.

    Each name is tried with ``os.mkdir``, which fails when the name exists, so runs started in
    the same second (a shell loop over seeds with ``&``) each get their own directory, whatever
    the order. Returns ``(path, the directories made)``, deepest first, for ``remove_created``.
    """
    made, parent = [], os.path.abspath(os.path.dirname(base) or ".")
    while not os.path.exists(parent):           # the parents this call makes, deepest first
        made.append(parent)
        parent = os.path.dirname(parent)
    try:
        os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
        for n in range(1, 10_000):
            path = base if n == 1 else f"{base}-{n}"
            try:
                os.mkdir(path)
            except FileExistsError:
                continue
            return path, [os.path.abspath(path)] + made
        raise FileExistsError(f"{base}-2 to {base}-9999 exist")
    except OSError as exc:
        remove_created(made)
        raise UserError(f"cannot create a run directory under {os.path.dirname(base) or '.'}: "
                        f"{exc.strerror or exc}; choose a writable one with --run-dir") from None


def prepare_run_dir(run_dir: str, resuming: bool, auto: bool = False) -> list:
    """Create ``run_dir`` and ``checkpoints/``; refuse to start a fresh run over an old one.

    ``auto`` (``--resume auto`` found no checkpoint): a ``metrics.jsonl`` left by an attempt
    that died before its first checkpoint is moved aside, not appended to. Returns the
    directories this call created, deepest first (none that existed before).
    """
    created = []
    try:
        path = os.path.abspath(os.path.join(run_dir, "checkpoints"))
        while not os.path.exists(path):
            created.append(path)
            path = os.path.dirname(path)
        os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
        probe = os.path.join(run_dir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        remove_created(created)
        raise UserError(f"cannot use run directory {run_dir}: {exc.strerror or exc}; "
                        "choose a writable one with --run-dir") from None
    if not resuming:
        old = checkpoint.list_checkpoints(os.path.join(run_dir, "checkpoints"))
        metrics = os.path.join(run_dir, "metrics.jsonl")
        if auto and not old and os.path.exists(metrics):
            os.replace(metrics, f"{metrics}.{time.strftime('%Y%m%d-%H%M%S')}.old")
        elif old or os.path.exists(metrics):
            remove_created(created)
            raise UserError(f"run directory {run_dir} already holds a run; continue it with --resume auto "
                            "or choose another --run-dir")
    return created


def remove_created(created) -> None:
    """Undo ``prepare_run_dir`` after a failed start: remove the directories it created, if
    still empty. Never touches a directory that existed before, nor anything written into one."""
    for path in created or ():
        try:
            os.rmdir(path)
        except OSError:
            return     # not empty (or gone): it, and every parent, is kept


def trim_metrics(path: str, step: int) -> None:
    """Drop records of steps after ``step`` (logged before a crash, redone after resuming)."""
    if not os.path.exists(path):
        return
    kept = [line if line.endswith("\n") else line + "\n" for line, record in record_lines(path)
            if record.get("step") is None or record["step"] <= step]
    atomic_write(path, "".join(kept))
