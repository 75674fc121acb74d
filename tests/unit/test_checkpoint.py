"""Checkpoints on disk: the sharded layout (round trips, checksums that catch damage), the
background writer and its commit, resume selection, best/last links and retention, format 1.

Checkpoints of N ranks are built here serially, rank by rank, with the same functions the
ranks call (``HostBuffers.take``, ``sharded.write_rank_file``, then the manifest and
``store.commit``); the writer itself runs on a one-rank stand-in for the Communicator.
tests/mpi/test_checkpoint_writer.py runs it on real ranks.
"""

import json
import os
import threading
import time

import h5py
import numpy as np
import pytest

from ssdmpi import checkpoint
from ssdmpi.checkpoint import format as format1
from ssdmpi.checkpoint import sharded, store
from ssdmpi.checkpoint.snapshot import HostBuffers
from ssdmpi.checkpoint.writer import CheckpointWriter
from ssdmpi.errors import UserError
from tests.fakes import FakeDeviceArray, FakeGPU

N_PARAMS = 1001   # not a multiple of the rank counts: pieces of different lengths


def global_state() -> dict:
    rng = np.random.default_rng(99)
    return {name: rng.standard_normal(N_PARAMS).astype(np.float32) for name in ("W", "M")}


def state_of(rank: int) -> dict:
    """One rank's tree as TrainingState.state_dict() makes it (W and M the same on every rank)."""
    rng = np.random.default_rng(rank)
    return {
        "algo": {"algo": "ssd", "t": 27, "s": 26, "stage": "delay", **global_state(),
                 "L": rng.standard_normal(N_PARAMS).astype(np.float32),
                 "local.P": rng.standard_normal(N_PARAMS).astype(np.float32),
                 "lr": np.float32(0.1), "count": np.int64(3), "none": None},
        "model": {"buffers": {"bn.running_mean": rng.standard_normal(4).astype(np.float32)}},
        "loader": {"epoch": 1, "sample_offset": 40, "step_in_epoch": 5, "seed": 0},
        "trainer": {"step": 27, "last_eval": {"test_acc": 0.5}, "resizes": []},
        "rng": {"bit_generator": "PCG64", "state": {"state": 2 ** 120 + 7, "inc": 2 ** 100 + 1}},
        "history": [np.arange(3, dtype=np.float64), {"a": 1}],
    }


REPLICATED = ("algo/W", "algo/M")


def meta(step: int, n: int, **extra) -> dict:
    return {"step": step, "epoch": step / 10, "stage": "delay", "model": "mlp", "num_params": N_PARAMS, "algo": "ssd",
            "config": {"model": "mlp", "lr": 0.1, "batch_size": 8}, "reason": "epoch", **extra}


def write(directory, step: int, n: int = 3, acc=None, **more) -> str:
    """A complete checkpoint of ``n`` ranks, each rank's file written as that rank writes it
    (``more``: more metadata, e.g. ``workers``)."""
    partial = write_partial(directory, step, n, acc, **more)
    return store.commit(partial, os.path.join(str(directory), store.checkpoint_name(step)))


def write_partial(directory, step: int, n: int = 3, acc=None, **more) -> str:
    """``write``'s partial directory, complete with its manifest, not yet committed."""
    partial = store.partial_name(str(directory), step, store.new_token())
    os.makedirs(partial)
    files, shared, aliases = {}, {}, {}
    for rank in range(n):
        snap = HostBuffers().take(state_of(rank), REPLICATED, rank, n)
        report = sharded.write_rank_file(os.path.join(partial, sharded.rank_file(rank)), snap.state, snap.pieces)
        files[sharded.rank_file(rank)] = {"rank": rank, **report}
        shared, aliases = snap.shared, snap.aliases
    extra = dict(more, **({"eval": {"test_acc": acc}} if acc is not None else {}))
    sharded.write_manifest(partial, dict(meta(step, n, **extra), world_size=n), files, shared, aliases)
    return partial


def assert_same(a, b):
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, (np.ndarray, np.generic)):
        assert type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b and type(a) is type(b)


# --- the layout ------------------------------------------------------------------------------------

def test_round_trip_is_exact_and_shared_arrays_are_stored_once_in_pieces(tmp_path):
    path = write(tmp_path, 10, n=3)
    assert sorted(os.listdir(path)) == ["manifest.json", "rank-0000.h5", "rank-0001.h5", "rank-0002.h5"]
    manifest = checkpoint.read_meta(path)
    for rank in range(3):
        expected = state_of(rank)
        for key in ("W", "M"):
            expected["algo"].pop(key)
        assert_same(expected, sharded.read_rank_state(path, rank))
        with h5py.File(os.path.join(path, sharded.rank_file(rank)), "r") as f:
            assert "W" not in f["state/algo"]            # the shared arrays live in /shared, once
            part = sharded.piece(N_PARAMS, rank, 3)
            assert f["shared/algo/W"].shape == (part.stop - part.start,)
    for name in ("algo/W", "algo/M"):
        assert np.array_equal(sharded.read_shared(path, manifest, name), global_state()[name[-1]])
    assert np.array_equal(sharded.read_shared(path, manifest, "model/global_weights"), global_state()["W"])
    assert manifest["aliases"] == {"model/global_weights": "algo/W"}
    assert checkpoint.verify(path) == [] and manifest["step"] == 10 and manifest["world_size"] == 3
    assert checkpoint.read_meta(path)["format_version"] == checkpoint.FORMAT_VERSION == 2


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def data_offset(path, name):
    with h5py.File(path, "r") as f:
        return f[name].id.get_offset()


@pytest.mark.parametrize("name", ["state/algo/L", "shared/algo/W", "state/loader/_values"])
def test_a_flipped_byte_in_any_dataset_of_any_rank_is_detected(tmp_path, name):
    path = write(tmp_path, 10)
    rank_file = os.path.join(path, "rank-0002.h5")
    offset = data_offset(rank_file, name)
    if name.endswith("_values"):   # a variable-length string: flip inside its heap instead
        with h5py.File(rank_file, "r") as f:
            text = f[name].asstr()[()].encode()
        offset = open(rank_file, "rb").read().index(text) + 3
    flip_byte(rank_file, offset + 5)
    problems = checkpoint.verify(path)
    assert problems and "rank-0002.h5" in problems[0], problems
    assert "checksum mismatch" in problems[0] or "unreadable" in problems[0]
    assert checkpoint.verify(path, deep=False) == []    # the quick check sees sizes only


def test_a_truncated_or_missing_rank_file_and_a_missing_manifest_are_detected(tmp_path):
    path = write(tmp_path, 10)
    rank_file = os.path.join(path, "rank-0001.h5")
    with open(rank_file, "r+b") as f:
        f.truncate(os.path.getsize(rank_file) - 10)
    assert "rank-0001.h5 has" in checkpoint.verify(path, deep=False)[0]
    os.unlink(rank_file)
    assert checkpoint.verify(path, deep=False) == ["rank-0001.h5 is missing"]
    os.unlink(os.path.join(path, "manifest.json"))
    assert "not a complete checkpoint (no manifest.json)" in checkpoint.verify(path)[0]


def test_selection_skips_corrupt_checkpoints_with_a_warning_and_ignores_partial_ones(tmp_path):
    good = write(tmp_path, 10)
    truncated = write(tmp_path, 20)
    flipped = write(tmp_path, 30)
    os.makedirs(store.partial_name(str(tmp_path), 40, "dead"))     # a crash while writing step 40
    with open(os.path.join(truncated, "rank-0000.h5"), "r+b") as f:
        f.truncate(100)
    flip_byte(os.path.join(flipped, "rank-0001.h5"), data_offset(os.path.join(flipped, "rank-0001.h5"),
                                                                  "state/algo/L") + 17)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [10, 20, 30]
    warnings = []
    assert checkpoint.select_resume(tmp_path, warn=warnings.append) == good
    assert len(warnings) == 2
    assert "ckpt-00000030" in warnings[0] and "checksum mismatch" in warnings[0]
    assert "ckpt-00000020" in warnings[1]


def test_selection_with_no_checkpoints_and_with_only_corrupt_ones(tmp_path):
    assert checkpoint.select_resume(tmp_path / "none") is None
    bad = write(tmp_path, 10)
    os.unlink(os.path.join(bad, "rank-0000.h5"))
    with pytest.raises(checkpoint.CheckpointError, match="none of the 1 checkpoints .* verifies"):
        checkpoint.select_resume(tmp_path)


def test_read_model_reads_only_w_and_the_buffers_and_checks_them(tmp_path):
    """``W`` with the 3 ranks' BatchNorm statistics averaged; ``L`` with rank 0's own."""
    path = write(tmp_path, 10)
    rank1 = os.path.join(path, "rank-0001.h5")
    flip_byte(rank1, data_offset(rank1, "state/algo/L") + 3)          # not read: not noticed
    meta_, weights, buffers = checkpoint.read_model(path)
    assert np.array_equal(weights, global_state()["W"]) and meta_["step"] == 10
    ranks = [state_of(r)["model"]["buffers"]["bn.running_mean"].astype(np.float64) for r in range(3)]
    mean = ((ranks[0] + ranks[1] + ranks[2]) / 3).astype(np.float32)
    assert buffers["bn.running_mean"].dtype == np.float32 and np.array_equal(buffers["bn.running_mean"], mean)
    _, local, own = checkpoint.read_model(path, local=True)
    assert np.array_equal(local, state_of(0)["algo"]["L"])
    assert np.array_equal(own["bn.running_mean"], state_of(0)["model"]["buffers"]["bn.running_mean"])
    os.makedirs(tmp_path / "asgd")
    asgd = write(tmp_path / "asgd", 10, workers=2)                    # 2 workers and a server: the workers'
    _, _, buffers = checkpoint.read_model(asgd)
    assert np.array_equal(buffers["bn.running_mean"], ((ranks[0] + ranks[1]) / 2).astype(np.float32))
    flip_byte(rank1, data_offset(rank1, "shared/algo/W") + 3)         # a piece of W: noticed
    with pytest.raises(checkpoint.CheckpointError, match="rank-0001.h5: /shared/algo/W checksum mismatch"):
        checkpoint.read_model(path)


# --- commit, links, retention -------------------------------------------------------------------------

def test_commit_replaces_a_checkpoint_of_the_same_step_whole_and_never_in_place(tmp_path):
    first = write(tmp_path, 10, n=2)
    inode = os.stat(os.path.join(first, "rank-0000.h5")).st_ino
    again = write(tmp_path, 10, n=3)
    assert again == first and checkpoint.read_meta(again)["world_size"] == 3
    assert os.stat(os.path.join(again, "rank-0000.h5")).st_ino != inode
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000010"]


def listed(directory) -> list:
    """``(step, world size)`` of every listed checkpoint, each verified (deep)."""
    out = []
    for step, path in checkpoint.list_checkpoints(directory):
        assert checkpoint.verify(path) == [], path
        out.append((step, checkpoint.read_meta(path)["world_size"]))
    return out


def test_a_failing_commit_over_the_same_step_keeps_the_old_checkpoint_listed(tmp_path, monkeypatch):
    """The atomic exchange of the two names fails (the file system's error): the old checkpoint of
    step 10 is still the one listed, whole; the new one stays in its partial directory."""
    final = write(tmp_path, 10, n=2)
    partial = write_partial(tmp_path, 10, n=3)

    def failing(a, b):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store, "_exchange", failing)
    with pytest.raises(OSError, match="Input/output error"):
        store.commit(partial, final)
    assert listed(tmp_path) == [(10, 2)] and checkpoint.select_resume(tmp_path) == final
    assert checkpoint.read_meta(partial)["world_size"] == 3
    monkeypatch.undo()
    assert store.commit(partial, final) == final and listed(tmp_path) == [(10, 3)]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000010"]


def test_without_an_exchange_the_old_checkpoint_is_listed_aside_and_renamed_back_if_the_rename_fails(
        tmp_path, monkeypatch):
    """Where the file system cannot exchange two names: while the new checkpoint is renamed into
    place, the old one is listed (renamed aside); if that rename fails, it is back at its name."""
    final = write(tmp_path, 10, n=2)
    monkeypatch.setattr(store, "_exchange", lambda a, b: False)
    rename, seen = os.rename, []

    def rename_into_place(src, dst, fail):
        if src.startswith(str(tmp_path / ".ckpt-00000010.partial-")):
            seen.append(listed(tmp_path))        # the old one, renamed aside: still listed and whole
            if fail:
                raise OSError(28, "No space left on device")
        return rename(src, dst)

    monkeypatch.setattr(os, "rename", lambda src, dst: rename_into_place(src, dst, fail=True))
    partial = write_partial(tmp_path, 10, n=3)
    with pytest.raises(OSError, match="No space left"):
        store.commit(partial, final)
    assert seen == [[(10, 2)]] and listed(tmp_path) == [(10, 2)]
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith(".ckpt-00000010.partial-")) == ["ckpt-00000010"]
    monkeypatch.setattr(os, "rename", lambda src, dst: rename_into_place(src, dst, fail=False))
    assert store.commit(partial, final) == final
    assert seen[1:] == [[(10, 2)]] and listed(tmp_path) == [(10, 3)]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000010"]


def test_a_checkpoint_renamed_aside_by_a_commit_that_crashed_is_listed_and_put_back(tmp_path):
    """A crash between the fallback's two renames leaves the old checkpoint under its aside name
    only: it is listed (resume finds it), and the next publish renames it back."""
    old = write(tmp_path, 10, n=2)
    aside = str(tmp_path / ".ckpt-00000010.old-0123abcd")
    os.rename(old, aside)
    assert checkpoint.list_checkpoints(tmp_path) == [(10, aside)]
    assert checkpoint.select_resume(tmp_path) == aside
    newer = write(tmp_path, 20, n=2)
    store.publish(str(tmp_path), newer, keep=0)
    assert checkpoint.list_checkpoints(tmp_path) == [(10, old), (20, newer)] and listed(tmp_path) == [(10, 2), (20, 2)]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000010", "ckpt-00000020", "last"]


def test_best_and_last_links_and_retention_of_whole_checkpoints(tmp_path):
    accuracies = {5: 0.5, 10: 0.9, 15: None, 20: 0.7, 25: 0.6}
    for step, acc in accuracies.items():
        path = write(tmp_path, step, n=2, acc=acc)
        store.publish(str(tmp_path), path, keep=2)
    assert os.path.realpath(tmp_path / "last") == os.path.realpath(tmp_path / "ckpt-00000025")
    assert os.path.realpath(tmp_path / "best") == os.path.realpath(tmp_path / "ckpt-00000010")
    # the newest 2, plus best (never deleted by retention); whole directories gone, nothing partial left
    assert sorted(os.listdir(tmp_path)) == ["best", "ckpt-00000010", "ckpt-00000020", "ckpt-00000025", "last"]
    assert checkpoint.resolve_path(str(tmp_path / "best")) == str(tmp_path / "best")
    assert checkpoint.read_meta(str(tmp_path / "best"))["step"] == 10
    assert checkpoint.retain(str(tmp_path), 0) == []


def test_compatibility_checks_are_one_line_errors(tmp_path):
    meta_ = checkpoint.read_meta(write(tmp_path, 10))
    checkpoint.check_compatible(meta_, "mlp", N_PARAMS)
    with pytest.raises(UserError, match="holds model 'mlp', not 'lenet5'"):
        checkpoint.check_compatible(meta_, "lenet5")
    with pytest.raises(UserError, match=f"has {N_PARAMS} parameters but this one has 50"):
        checkpoint.check_compatible(meta_, "mlp", 50)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "ckpt-00000001.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(UserError, match="not an ssdmpi checkpoint"):
        checkpoint.read_meta(str(path))
    with pytest.raises(UserError, match="does not exist"):
        checkpoint.resolve_path(str(tmp_path / "missing"))
    (tmp_path / "ckpt-00000002").mkdir()
    with pytest.raises(UserError, match="not a complete checkpoint"):
        checkpoint.resolve_path(str(tmp_path / "ckpt-00000002"))


# --- format 1 still reads ----------------------------------------------------------------------------

def test_format_1_files_are_listed_verified_and_read(tmp_path):
    path = str(tmp_path / "ckpt-00000005.h5")
    shared = {"model": {"global_weights": global_state()["W"], "buffers": {}}}
    format1.write_checkpoint(path, dict(meta(5, 2), world_size=2), ((r, state_of(r)) for r in range(2)), shared)
    newer = write(tmp_path, 10, n=2)
    assert checkpoint.list_checkpoints(tmp_path) == [(5, path), (10, newer)]
    assert checkpoint.verify(path) == [] and checkpoint.read_meta(path)["format_version"] == 1
    assert_same(state_of(1), format1.read_rank_state(path, 1))
    _, weights, _ = checkpoint.read_model(path)
    assert np.array_equal(weights, global_state()["W"])
    flip_byte(path, data_offset(path, "rank_0001/algo/L") + 2)
    assert checkpoint.select_resume(tmp_path) == newer
    os.unlink(os.path.join(newer, "manifest.json"))
    with pytest.raises(checkpoint.CheckpointError, match="none of the 2"):
        checkpoint.select_resume(tmp_path)


# --- snapshots ---------------------------------------------------------------------------------------

def test_a_snapshot_copies_only_this_ranks_piece_of_the_shared_arrays_into_reused_buffers():
    buffers = HostBuffers()
    tree = state_of(1)
    first = buffers.take(tree, REPLICATED, 1, 4)
    part = sharded.piece(N_PARAMS, 1, 4)
    own = sum(a.nbytes for a in (tree["algo"]["L"], tree["algo"]["local.P"], tree["history"][0],
                                 tree["model"]["buffers"]["bn.running_mean"]))
    assert first.nbytes == own + 2 * (part.stop - part.start) * 4
    W, _, _, _ = first.pieces["algo/W"]
    assert np.array_equal(W, tree["algo"]["W"][part]) and W is not tree["algo"]["W"]
    tree["algo"]["L"] += 1                               # training goes on: the copy keeps the old values
    assert np.array_equal(first.state["algo"]["L"], state_of(1)["algo"]["L"])
    second = buffers.take(tree, REPLICATED, 1, 4)
    assert second.state["algo"]["L"] is first.state["algo"]["L"]    # the same buffer, reused
    assert np.array_equal(second.state["algo"]["L"], tree["algo"]["L"])


def test_device_arrays_are_copied_on_the_compute_stream_before_later_kernels():
    gpu = FakeGPU()
    host_L = np.arange(8, dtype=np.float32)
    L = FakeDeviceArray(host_L, gpu)
    W = FakeDeviceArray(np.ones(8, dtype=np.float32), gpu)
    snap = HostBuffers(streams=gpu).take({"algo": {"L": L, "W": W, "t": 3}}, ("algo/W",), 0, 2)
    L *= 10.0                                            # a kernel queued after the checkpoint
    snap.ready.synchronize()                             # what the writer thread waits for
    assert np.array_equal(snap.state["algo"]["L"], np.arange(8)) and snap.state["algo"]["t"] == 3
    assert np.array_equal(snap.pieces["algo/W"][0], np.ones(4))
    gpu.run_all()
    assert np.array_equal(host_L, 10 * np.arange(8)) and np.array_equal(snap.state["algo"]["L"], np.arange(8))


# --- the writer, on one rank --------------------------------------------------------------------------

class OneRank:
    """The Communicator's control calls the writer uses, for a world of one rank."""

    rank, size = 0, 1

    def __init__(self):
        self.calls = []

    def broadcast_object(self, obj, root=0):
        self.calls.append("broadcast_object")
        return obj

    def gather_trees(self, tree, root=0):
        self.calls.append("gather_trees")
        return iter([(0, tree)])

    def allreduce_scalars(self, values, op="sum"):
        self.calls.append("allreduce_scalars")
        return dict(values)


def one_rank_state(value: float) -> dict:
    return {"algo": {"algo": "ssgd", "t": 3, "s": 3, "stage": "warmup", "W": np.full(50, value, np.float32),
                     "M": np.zeros(50, np.float32)}, "model": {"buffers": {}}, "trainer": {"step": 3}}


def test_a_background_checkpoint_is_committed_at_a_sync_point_once_written(tmp_path):
    comm, release = OneRank(), threading.Event()
    real = sharded.write_rank_file

    def slow(*args):
        release.wait(30)
        time.sleep(0.5)                      # the write takes longer than the copy into host memory
        return real(*args)

    with CheckpointWriter(str(tmp_path), keep=0) as writer:
        sharded.write_rank_file, original = slow, sharded.write_rank_file
        try:
            state = one_rank_state(1.0)
            assert writer.save(comm, 3, meta(3, 1), state, ("algo/W", "algo/M")) == []
            state["algo"]["W"][:] = 2.0              # training goes on while the thread writes
            assert writer.pending == 3 and writer.poll(comm) == []       # not written yet: nothing committed
            assert checkpoint.list_checkpoints(tmp_path) == []
            release.set()
            writer._pending.future.result(30)
            records = writer.poll(comm)
        finally:
            sharded.write_rank_file = original
    assert [r["kind"] for r in records] == ["checkpoint"] and records[0]["step"] == 3 and records[0]["background"]
    assert records[0]["bytes"] == records[0]["bytes_per_rank"][0] == os.path.getsize(
        tmp_path / "ckpt-00000003" / "rank-0000.h5")
    assert records[0]["write_s"] >= 0.5 > records[0]["stall_s"]   # the write happened off the training's path
    _, weights, _ = checkpoint.read_model(str(tmp_path / "last"))
    assert np.array_equal(weights, np.full(50, 1.0))                 # the state when save() was called
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


def test_a_failing_writer_is_a_user_error_at_the_commit_and_the_previous_checkpoint_stays(tmp_path):
    comm = OneRank()
    with CheckpointWriter(str(tmp_path)) as writer:
        writer.save(comm, 3, meta(3, 1), one_rank_state(1.0), ("algo/W", "algo/M"), background=False)
        original = sharded.write_rank_file

        def full_disk(*args):
            raise OSError(28, "No space left on device")

        sharded.write_rank_file = full_disk
        try:
            writer.save(comm, 6, meta(6, 1), one_rank_state(2.0), ("algo/W", "algo/M"))
            with pytest.raises(UserError, match="cannot write checkpoint ckpt-00000006: rank 0: No space left") as info:
                writer.complete(comm)
        finally:
            sharded.write_rank_file = original
    assert info.value.collective
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000003", "last"]      # the partial directory removed
    assert checkpoint.select_resume(str(tmp_path)) == str(tmp_path / "ckpt-00000003")


@pytest.mark.parametrize("failure", ["write", "rename"])
def test_a_checkpoint_of_the_same_step_written_again_stays_when_the_write_or_the_rename_fails(
        tmp_path, monkeypatch, failure):
    """The writer commits step 3 again (a run resumed from an older checkpoint reaches it again):
    if the new write or its rename fails, the collective error says so and the first step-3
    checkpoint is still the one listed, with its own weights; a later commit replaces it."""
    comm = OneRank()
    with CheckpointWriter(str(tmp_path)) as writer:
        writer.save(comm, 3, meta(3, 1), one_rank_state(1.0), ("algo/W", "algo/M"), background=False)

        def full_disk(*args):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(sharded, "write_rank_file", full_disk) if failure == "write" else \
            monkeypatch.setattr(store, "_exchange", full_disk)
        with pytest.raises(UserError, match="cannot write checkpoint ckpt-00000003: .*No space left on device"):
            writer.save(comm, 3, meta(3, 1), one_rank_state(2.0), ("algo/W", "algo/M"), background=False)
        assert sorted(os.listdir(tmp_path)) == ["ckpt-00000003", "last"]
        assert checkpoint.list_checkpoints(tmp_path) == [(3, str(tmp_path / "ckpt-00000003"))]
        _, weights, _ = checkpoint.read_model(checkpoint.select_resume(str(tmp_path)))
        assert np.array_equal(weights, np.full(50, 1.0))
        monkeypatch.undo()
        writer.save(comm, 3, meta(3, 1), one_rank_state(3.0), ("algo/W", "algo/M"), background=False)
    _, weights, _ = checkpoint.read_model(str(tmp_path / "last"))
    assert np.array_equal(weights, np.full(50, 3.0)) and sorted(os.listdir(tmp_path)) == ["ckpt-00000003", "last"]


def test_the_manifest_records_the_evaluation_of_its_own_step_only(tmp_path):
    comm = OneRank()
    with CheckpointWriter(str(tmp_path)) as writer:
        writer.evaluated(3, {"test_acc": 0.75, "test_loss": 0.5})
        writer.save(comm, 3, meta(3, 1), one_rank_state(1.0), ("algo/W", "algo/M"))
        writer.evaluated(3, {"test_acc": 0.8, "test_loss": 0.4})        # after the save, before the commit
        writer.complete(comm)
        writer.save(comm, 6, meta(6, 1), one_rank_state(1.0), ("algo/W", "algo/M"), background=False)
    assert json.load(open(tmp_path / "ckpt-00000003" / "manifest.json"))["eval"]["test_acc"] == 0.8
    assert "eval" not in checkpoint.read_meta(str(tmp_path / "ckpt-00000006"))
    assert os.path.realpath(tmp_path / "best") == os.path.realpath(tmp_path / "ckpt-00000003")
