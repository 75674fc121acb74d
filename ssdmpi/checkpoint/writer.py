"""Writing checkpoints: every rank its own file, in the background, committed by a manifest.

``CheckpointWriter.save(comm, step, meta, tree, replicated)`` is collective:

1. the previous checkpoint, if still being written, is waited for and committed (``complete``);
2. each rank copies its part of the state into host buffers (``snapshot.py``; the stall the
   training sees: a memory copy, or on a GPU the enqueueing of device-to-host copies);
3. a writer thread of each rank writes ``rank-RRRR.h5`` into the hidden partial directory
   ``.ckpt-<step>.partial-<token>`` (``store.py``; the token, agreed at the first checkpoint,
   is this job's) and fsyncs it while training goes on; ``background=False`` (a preemption
   signal, the end of the run) waits for it and commits at once.

Nothing in ``save`` waits for another rank unless the previous checkpoint is still pending
(and once, at the first checkpoint, for the token).

The commit (``complete``; ``poll`` does it at a synchronisation point once every rank's
thread is done) is collective: each rank reports its file's size and checksums, or its
error, to rank 0 (a few hundred bytes; the state itself never travels), which writes
``manifest.json``, renames the directory to ``ckpt-<step>`` (``store.commit``), points the
``last`` and ``best`` links, applies retention, and tells every rank the outcome. A failed
write on any rank is a collective ``UserError`` at the commit, on every rank: no rank waits
for another. A crash before the rename leaves only a partial directory, which no reader takes
for a checkpoint, so the previous checkpoint stays the one selected.

Each commit returns the ``checkpoint`` metrics record: ``bytes`` (all files), ``bytes_per_rank``,
``copy_s`` (the longest copy into host memory), ``stall_s`` (the longest time a rank's training
waited for this checkpoint), ``write_s`` (the longest writer-thread time), ``background``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor

from ssdmpi.checkpoint import sharded, store
from ssdmpi.checkpoint.format import error_line
from ssdmpi.checkpoint.snapshot import HostBuffers
from ssdmpi.errors import UserError


@dataclasses.dataclass
class _Pending:
    step: int
    partial: str
    future: object
    meta: dict          # rank 0's manifest fields
    shared: dict
    aliases: dict
    copy_s: float
    copied: int
    stall_s: float = 0.0
    background: bool = True


class CheckpointWriter:
    """This rank's checkpoint writing into ``directory`` (the run's ``checkpoints/``); ``keep``:
    retention (``store.retain``). Every method taking ``comm`` is collective. A context manager:
    leaving waits for this rank's thread (nothing is committed: a run that ends normally calls
    ``complete`` first)."""

    def __init__(self, directory: str, keep: int = 0, streams=None):
        self.directory, self.keep = directory, int(keep)
        self.buffers = HostBuffers(streams)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ssdmpi-checkpoint")
        self._pending: _Pending | None = None
        self._evaluated: dict = {}
        self._token = None

    @property
    def pending(self) -> int | None:
        """The step of the checkpoint being written, or None."""
        return None if self._pending is None else self._pending.step

    def evaluated(self, step: int, result: dict) -> None:
        """The test results of the global model at ``step``: a checkpoint of that step records them
        in its manifest (``eval``), and ``best`` points to the best of those (rank 0 uses them)."""
        self._evaluated = {int(step): {k: v for k, v in result.items() if isinstance(v, (int, float))}}

    def save(self, comm, step: int, meta: dict, tree: dict, replicated, weights=None,
             background: bool = True) -> list:
        """Collective: start writing checkpoint ``step`` (see the module docstring); return the
        ``checkpoint`` records of the checkpoints committed during this call (the previous one;
        this one too when not ``background``). ``tree``: this rank's state (live buffers are
        fine: they are copied before this returns); ``replicated``, ``weights``: ``HostBuffers.take``."""
        t0 = time.perf_counter()
        records = self.complete(comm)
        if self._token is None:
            self._token = comm.broadcast_object(store.new_token() if comm.rank == 0 else None, root=0)
        partial = store.partial_name(self.directory, step, self._token)
        snap = self.buffers.take(tree, replicated, comm.rank, comm.size, weights)
        future = self._thread.submit(_write, partial, comm.rank, snap)
        self._pending = _Pending(int(step), partial, future, meta if comm.rank == 0 else {}, snap.shared,
                                 snap.aliases, snap.copy_s, snap.nbytes, background=background)
        self._pending.stall_s = time.perf_counter() - t0
        if not background:
            records += self.complete(comm, since=t0)
        return records

    def poll(self, comm) -> list:
        """Collective, at a synchronisation point: commit the checkpoint being written if every
        rank's thread has finished (one small allreduce while one is pending; nothing otherwise)."""
        if self._pending is None:
            return []
        busy = comm.allreduce_scalars({"busy": 0.0 if self._pending.future.done() else 1.0}, op="max")["busy"]
        return [] if busy else self.complete(comm)

    def complete(self, comm, since: float | None = None) -> list:
        """Collective: wait for this rank's write of the pending checkpoint, then commit it (or, if
        any rank failed, remove it and raise the collective ``UserError``). Returns its record."""
        p, self._pending = self._pending, None
        if p is None:
            return []
        try:
            report = p.future.result()
        except BaseException as exc:   # the thread's error: reported to rank 0, raised on every rank
            report = {"error": f"rank {comm.rank}: {getattr(exc, 'strerror', None) or error_line(exc)}"}
        if since is not None:
            p.stall_s = time.perf_counter() - since
        report.update(copy_s=p.copy_s, stall_s=p.stall_s, copied=p.copied)
        outcome = None
        if comm.rank == 0:
            reports = [r for _, r in comm.gather_trees(report, root=0)]   # always drained in full
            try:
                outcome = {"record": self._commit(comm.size, p, reports)}
            except Exception as exc:
                store.remove_partial(p.partial)
                outcome = {"error": f"cannot write checkpoint {store.checkpoint_name(p.step)}: "
                                    f"{getattr(exc, 'strerror', None) or error_line(exc)}"}
        else:
            comm.gather_trees(report, root=0)
        outcome = comm.broadcast_object(outcome, root=0)
        if "error" in outcome:
            raise UserError(outcome["error"], collective=True)
        return [outcome["record"]]

    def _commit(self, size: int, p: _Pending, reports: list) -> dict:
        """Rank 0: the manifest, the rename into place, links and retention; the metrics record."""
        failed = [r["error"] for r in reports if "error" in r]
        if failed:
            raise RuntimeError(failed[0] + (f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""))
        files = {sharded.rank_file(r): {"rank": r, "bytes": rep["bytes"], "datasets": rep["datasets"]}
                 for r, rep in enumerate(reports)}
        per_rank = [rep["bytes"] for rep in reports]
        write = {"bytes": sum(per_rank), "bytes_per_rank": per_rank,
                 "copy_s": max(rep["copy_s"] for rep in reports), "stall_s": max(rep["stall_s"] for rep in reports),
                 "write_s": max(rep["write_s"] for rep in reports), "background": p.background}
        meta = dict(p.meta, world_size=size, step=p.step, created=sharded.created_now(), write=write)
        if p.step in self._evaluated:
            meta["eval"] = self._evaluated[p.step]
        sharded.write_manifest(p.partial, meta, files, p.shared, p.aliases)
        path = store.commit(p.partial, os.path.join(self.directory, store.checkpoint_name(p.step)))
        store.publish(self.directory, path, self.keep)
        return {"kind": "checkpoint", "step": p.step, "epoch": meta.get("epoch"), "path": path,
                "reason": meta.get("reason"), **write}

    def close(self) -> None:
        """Wait for this rank's thread (a write in progress finishes; nothing is committed)."""
        self._thread.shutdown(wait=True)

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write(partial: str, rank: int, snap) -> dict:
    """The writer thread: wait for the device copies, write and fsync this rank's file."""
    t0 = time.perf_counter()
    os.makedirs(partial, exist_ok=True)
    snap.ready.synchronize()
    report = sharded.write_rank_file(os.path.join(partial, sharded.rank_file(rank)), snap.state, snap.pieces)
    report["write_s"] = time.perf_counter() - t0
    return report
