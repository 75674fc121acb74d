"""Checkpoints on disk: names, listing, resume selection, the commit rename, links, retention.

A run's ``checkpoints/`` holds

    ckpt-00000120/      a checkpoint (format 2, ``sharded.py``): complete once it has its
                        manifest, which is written before the directory gets this name
    ckpt-00000060.h5    a checkpoint of format 1 (one file, ``format.py``), still read
    last -> ckpt-00000120     the newest checkpoint (a relative symbolic link)
    best -> ckpt-00000100     the checkpoint whose global model had the best test accuracy
    .ckpt-00000140.partial-<token>/    being written (or left by a crash): never a checkpoint

``commit`` renames a partial directory into place; a checkpoint of the same step already there
stays listed and readable until the new one has replaced it, and stays if that fails (it is
never overwritten in place: see ``commit``); ``publish`` then
points ``last`` and ``best`` and applies ``retain``: all but the newest ``keep`` checkpoints are
deleted, whole, except those ``best`` and ``last`` point to. Every check here is serial (rank
0 or a tool); ``select_resume(directory)`` picks the newest checkpoint that verifies and warns
about each one it skips.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import sys

from ssdmpi.checkpoint import format as format1
from ssdmpi.checkpoint import sharded
from ssdmpi.checkpoint.format import CheckpointError
from ssdmpi.errors import UserError
from ssdmpi.metrics import best_eval

NAME_RE = re.compile(r"^ckpt-(\d{8,})(\.h5)?$")
PARTIAL_RE = re.compile(r"^\.ckpt-\d{8,}\.(partial|old)-[0-9a-f]+$")
LAST, BEST = "last", "best"


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint of ``step`` (``ckpt-00000120``)."""
    return f"ckpt-{int(step):08d}"


# --- one checkpoint, either format ------------------------------------------------------------

def read_meta(path: str) -> dict:
    """The checkpoint's metadata (step, epoch, stage, world size, model, config, ...): its
    manifest (format 2) or its ``/meta`` (format 1). ``CheckpointError`` if unreadable."""
    return sharded.read_manifest(path) if os.path.isdir(path) else format1.read_meta(path)


def verify(path: str, deep: bool = True) -> list:
    """Problems found in the checkpoint (empty: it verifies). ``deep=False``: format 2 checks
    only the manifest and the file sizes (what a reader of a few arrays needs first)."""
    if os.path.isdir(path):
        return sharded.verify(path, deep)
    return format1.verify(path)


def size_of(path: str) -> int:
    """Bytes on disk of a checkpoint (all its files)."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


# --- listing and selecting ----------------------------------------------------------------------

def list_checkpoints(directory: str) -> list:
    """``[(step, path)]`` of the checkpoints in ``directory``, oldest first (partial directories
    and the ``best``/``last`` links are not listed)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise UserError(f"cannot list checkpoints in {directory}: {exc.strerror or exc}") from None
    found = [(int(m.group(1)), m.group(2) is None, os.path.join(directory, n))
             for n in names if (m := NAME_RE.match(n)) and not os.path.islink(os.path.join(directory, n))]
    steps = {step for step, _, _ in found}
    found += [(step, True, os.path.join(directory, n)) for n, step in _aside(names).items() if step not in steps]
    return [(step, path) for step, _, path in sorted(found)]


ASIDE_RE = re.compile(r"^\.ckpt-(\d{8,})\.old-[0-9a-f]+$")


def _aside(names) -> dict:
    """``{name: step}`` of the checkpoints ``commit`` renamed aside (where the file system cannot
    exchange two names): listed under that name while no ``ckpt-<step>`` exists (a crash between
    ``commit``'s two renames), so that the old checkpoint is never lost to its replacement."""
    return {n: int(m.group(1)) for n in names if (m := ASIDE_RE.match(n))}


def select_resume(directory: str, warn=None, deep: bool = True) -> str | None:
    """Path of the newest checkpoint in ``directory`` that verifies (None if there are none;
    ``deep=False``: that is complete, ``verify``).

    Each corrupt one skipped is reported through ``warn(message)``. If checkpoints exist but
    none verifies, ``CheckpointError``.
    """
    found = list_checkpoints(directory)
    for _step, path in reversed(found):
        problems = verify(path, deep)
        if not problems:
            return path
        if warn is not None:
            warn(f"warning: skipping corrupt checkpoint {path}: {problems[0]}"
                 + (f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""))
    if found:
        raise CheckpointError(f"none of the {len(found)} checkpoints in {directory} verifies; "
                              "remove them or start a new run directory")
    return None


def containing_checkpoint(path: str) -> str:
    """``path``, or the format-2 checkpoint directory that holds the file ``path`` (one of its rank
    files or its manifest: each stands for the whole checkpoint, since ``W`` is split across them)."""
    parent, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if os.path.isfile(path) and os.path.exists(os.path.join(parent, sharded.MANIFEST)) \
            and (name == sharded.MANIFEST or re.fullmatch(r"rank-\d{4,}\.h5", name)):
        return os.path.dirname(path) or parent
    return path


def resolve_path(path: str, deep: bool = True) -> str:
    """A checkpoint from PATH: a checkpoint (directory, its ``best``/``last`` link, a file of it, or
    a format-1 file), or the newest valid one of a run directory or its ``checkpoints/``.
    ``deep=False``: checked for completeness only (the caller verifies what it reads).
    ``CheckpointError`` (one line) for a path that is missing, not a checkpoint or corrupt."""
    path = containing_checkpoint(path)
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, sharded.MANIFEST)) \
            and not NAME_RE.match(os.path.basename(os.path.normpath(path))):
        directory = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path
        chosen = select_resume(directory, warn=lambda m: print(m, file=sys.stderr, flush=True), deep=deep)
        if chosen is None:
            raise CheckpointError(f"no checkpoint in {directory}")
        return chosen
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    if os.path.isfile(path) and (why := format1.not_a_checkpoint(path)):
        raise CheckpointError(f"{path} is not an ssdmpi checkpoint ({why}); give a checkpoint directory "
                              "(RUN/checkpoints/ckpt-<step>) or a run directory")
    problems = verify(path, deep)
    if problems:
        raise CheckpointError(f"checkpoint {path} is corrupt: {problems[0]}")
    return path


def check_compatible(meta: dict, model: str, num_params: int | None = None) -> None:
    """``CheckpointError`` (one line) unless the checkpoint holds this model."""
    if meta.get("model") != model:
        raise CheckpointError(f"the checkpoint holds model {meta.get('model')!r}, not {model!r}")
    if num_params is not None and meta.get("num_params") is not None and int(meta["num_params"]) != num_params:
        raise CheckpointError(f"the checkpoint's model has {meta['num_params']} parameters but this one has "
                              f"{num_params} (different --widths?)")


# --- writing: partial directories, the commit, links, retention ------------------------------------

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


def new_token() -> str:
    """A random name part, so that two jobs' (or attempts') partial directories never collide."""
    return secrets.token_hex(4)


def partial_name(directory: str, step: int, token: str) -> str:
    """The hidden directory checkpoint ``step`` is written into before its commit."""
    return os.path.join(directory, f".{checkpoint_name(step)}.partial-{token}")



def remove_partial(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def commit(partial: str, final: str) -> str:
    """Rename the complete ``partial`` directory to ``final``; fsync; return ``final``.

    A checkpoint already at ``final`` (the same step written again) is replaced whole and never
    lost to its replacement: where the file system can (Linux ``renameat2``), the two names are
    exchanged in one atomic rename and the old one, now at ``partial``'s name, is deleted after;
    elsewhere it is renamed aside (``.ckpt-<step>.old-<token>``, listed while ``final`` is
    missing), the new one renamed into place, and the old one deleted after, or renamed back if
    that rename fails. If the rename fails, the old checkpoint is where it was and the error is
    raised."""
    directory = os.path.dirname(final)
    _fsync_dir(partial)
    if not os.path.lexists(final):
        os.rename(partial, final)
        _fsync_dir(directory)
        return final
    if _exchange(partial, final):
        old = partial
    else:
        old = os.path.join(directory, f".{os.path.basename(final)}.old-{secrets.token_hex(4)}")
        os.rename(final, old)
        try:
            os.rename(partial, final)
        except BaseException:
            os.rename(old, final)
            raise
    _fsync_dir(directory)
    _remove(old)
    return final


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100     # linux/fs.h, fcntl.h


def _exchange(a: str, b: str) -> bool:
    """Swap the names ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``); False where the
    system or the file system cannot (then nothing changed). Another failure is raised."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"{os.strerror(err)}: cannot exchange {a} and {b}")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def link_target(directory: str, name: str) -> str | None:
    """The checkpoint ``directory/name`` (``best`` or ``last``) points to, if it exists."""
    link = os.path.join(directory, name)
    if not os.path.islink(link):
        return None
    target = os.path.join(directory, os.readlink(link))
    return target if os.path.exists(target) else None


def _point(directory: str, name: str, target: str) -> None:
    """``directory/name`` -> ``target`` (relative), replaced atomically. A directory of that name
    (a link turned into a copy by ``cp -r``) is removed first."""
    link = os.path.join(directory, name)
    if os.path.isdir(link) and not os.path.islink(link):
        shutil.rmtree(link)
    tmp = os.path.join(directory, f".{name}.tmp-{secrets.token_hex(4)}")
    os.symlink(os.path.basename(target), tmp)
    os.replace(tmp, link)


def _evaluation(path: str) -> dict:
    """The evaluation of this checkpoint's own global model ({} if it was not evaluated)."""
    try:
        return read_meta(path).get("eval") or {}
    except CheckpointError:
        return {}


def publish(directory: str, newest: str, keep: int) -> None:
    """After ``newest`` was committed: ``last`` points to it, ``best`` to the checkpoint with the
    best evaluation (``ssdmpi.metrics.best_eval``: the highest test accuracy, a language model's lowest
    validation loss; the newer on a tie), then ``retain``; stale partial directories go (a
    checkpoint ``commit`` renamed aside and whose replacement never arrived is renamed back first)."""
    for name, step in _aside(os.listdir(directory)).items():
        if not os.path.lexists(os.path.join(directory, checkpoint_name(step))):
            os.rename(os.path.join(directory, name), os.path.join(directory, checkpoint_name(step)))
    _point(directory, LAST, newest)
    paths = dict(enumerate(path for _step, path in list_checkpoints(directory)))
    best = best_eval([dict(_evaluation(path), step=i) for i, path in paths.items()])
    if best is not None:
        _point(directory, BEST, paths[best["step"]])
    retain(directory, keep)
    for name in os.listdir(directory):
        if PARTIAL_RE.match(name):
            _remove(os.path.join(directory, name))
    _fsync_dir(directory)


def retain(directory: str, keep: int) -> list:
    """Delete all but the newest ``keep`` checkpoints (``keep=0``: keep all), whole, never those
    ``best`` and ``last`` point to; return the deleted."""
    if keep <= 0:
        return []
    protected = {os.path.realpath(t) for t in (link_target(directory, LAST), link_target(directory, BEST)) if t}
    deleted = []
    for _, path in list_checkpoints(directory)[:-keep]:
        if os.path.realpath(path) not in protected:
            _remove(path)
            deleted.append(path)
    return deleted
