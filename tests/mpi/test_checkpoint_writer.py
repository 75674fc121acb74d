"""The checkpoint writer on real ranks: every rank writes its own file in the background, the
commit records what each wrote, and a writer that fails on one rank stops every rank with the
same one-line error instead of leaving the others waiting; a checkpoint of the same step written
again replaces the old one only once it is in place; retention keeps ``best``'s checkpoint; the
global model read back joins every rank's piece and checks each (run under mpiexec -n 1/2/4)."""

import json
import os

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi import checkpoint
from ssdmpi.checkpoint import sharded, store
from ssdmpi.checkpoint.writer import CheckpointWriter
from ssdmpi.cli import main
from tests.checkpoints import differences, fields
from tests.mpi.test_resume import shared_tmpdir

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
ARGS = ["--dataset", "digits", "--model", "mlp", "--widths", "32", "--batch-size", "8", "--lr", "0.05",
        "--algo", "ssd", "--comm", "period", "--delay", "3", "--warmup-steps", "6", "--steps", "40",
        "--checkpoint-every", "10", "--log-every", "5", "--eval-every", "0", "--keep-checkpoints", "0",
        "--no-progress-bar"]


def with_flags(args: list, **values) -> list:
    """``args`` with each ``--flag``'s value replaced (``eval_every="10"`` for ``--eval-every 10``)."""
    args = list(args)
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        args[args.index(flag) + 1] = str(value)
    return args


def on_every_rank(value):
    return MPI.COMM_WORLD.allgather(value)


def checkpoint_records(run_dir: str) -> list:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "checkpoint"]


@pytest.mark.timeout(300)
def test_every_rank_writes_its_own_file_and_the_commit_records_them():
    run_dir = os.path.join(shared_tmpdir(), "run")
    assert MPI.COMM_WORLD.allgather(main(["train", "--run-dir", run_dir] + ARGS)) == [0] * SIZE
    records = MPI.COMM_WORLD.bcast(checkpoint_records(run_dir) if RANK == 0 else None, root=0)
    assert [(r["step"], r["reason"], r["background"]) for r in records] == [
        (10, "periodic", True), (20, "periodic", True), (30, "periodic", True), (40, "final", False)]
    for record in records:
        path = record["path"]
        assert sorted(os.listdir(path)) == ["manifest.json"] + [sharded.rank_file(r) for r in range(SIZE)]
        sizes = [os.path.getsize(os.path.join(path, sharded.rank_file(r))) for r in range(SIZE)]
        assert record["bytes_per_rank"] == sizes and record["bytes"] == sum(sizes)
        assert 0 <= record["copy_s"] <= record["stall_s"] and record["write_s"] > 0
        assert checkpoint.verify(path) == []
    assert os.path.realpath(os.path.join(run_dir, "checkpoints", "last")) == os.path.realpath(records[-1]["path"])


@pytest.mark.timeout(300)
def test_a_writer_failing_on_one_rank_stops_every_rank_with_one_error(monkeypatch, capsys):
    run_dir = os.path.join(shared_tmpdir(), "run")
    write = sharded.write_rank_file

    def full_disk(path, state, pieces):
        if "ckpt-00000020." in path:
            raise OSError(28, "No space left on device")
        return write(path, state, pieces)

    if RANK == SIZE - 1:
        monkeypatch.setattr(sharded, "write_rank_file", full_disk)
    assert MPI.COMM_WORLD.allgather(main(["train", "--run-dir", run_dir] + ARGS)) == [2] * SIZE
    err = capsys.readouterr().err
    if RANK == 0:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines == [f"ssdmpi: error: cannot write checkpoint ckpt-00000020: rank {SIZE - 1}: "
                         "No space left on device"], lines
        directory = os.path.join(run_dir, "checkpoints")
        assert sorted(os.listdir(directory)) == ["ckpt-00000010", "last"]       # nothing half-written left
        assert checkpoint.select_resume(directory) == os.path.join(directory, "ckpt-00000010")
    MPI.COMM_WORLD.Barrier()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("failure", [None, "exchange", "rename"])
def test_a_checkpoint_of_the_same_step_written_again_stays_listed_until_the_new_one_replaced_it(
        monkeypatch, capsys, failure):
    """A run of 20 steps, then the same run resumed from its step-10 checkpoint: its step-20 checkpoint
    is committed over the first run's. When that commit's rename fails on rank 0 (the exchange of the
    two names, or, where there is none, the rename into place), every rank exits 2 with the error and
    the first step-20 checkpoint is still listed, whole and bitwise the first run's; otherwise the new
    one has replaced it (bitwise the same state: the resume is exact)."""
    run_dir = os.path.join(shared_tmpdir(), "run")
    args = ["--run-dir", run_dir] + with_flags(ARGS, steps=20)
    assert on_every_rank(main(["train"] + args)) == [0] * SIZE
    directory = os.path.join(run_dir, "checkpoints")
    final = os.path.join(directory, "ckpt-00000020")
    first, inode = fields(final), os.stat(os.path.join(final, sharded.rank_file(0))).st_ino
    MPI.COMM_WORLD.Barrier()
    rename = os.rename

    def failing(*_):
        raise OSError(5, "Input/output error")

    def rename_into_place(src, dst):
        if os.path.basename(src).startswith(".ckpt-00000020.partial-"):
            failing()
        return rename(src, dst)

    if RANK == 0 and failure == "exchange":
        monkeypatch.setattr(store, "_exchange", failing)
    if RANK == 0 and failure == "rename":
        monkeypatch.setattr(store, "_exchange", lambda a, b: False)
        monkeypatch.setattr(os, "rename", rename_into_place)
    code = main(["train", "--resume", os.path.join(directory, "ckpt-00000010")] + args)
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert on_every_rank(code) == [2 if failure else 0] * SIZE
    if failure and RANK == 0:
        assert "ssdmpi: error: cannot write checkpoint ckpt-00000020: Input/output error" in err, err
    assert checkpoint.list_checkpoints(directory) == [(10, os.path.join(directory, "ckpt-00000010")), (20, final)]
    assert checkpoint.verify(final) == [] and differences(first, fields(final)) == []
    assert (os.stat(os.path.join(final, sharded.rank_file(0))).st_ino == inode) == bool(failure)
    assert [n for n in os.listdir(directory) if n.startswith(".")] == []        # nothing aside or partial left
    MPI.COMM_WORLD.Barrier()


@pytest.mark.timeout(300)
def test_retention_keeps_the_checkpoint_best_points_to_and_the_newest(monkeypatch):
    """Each checkpoint's step evaluated with an accuracy that falls step by step (injected: the
    writer is told so as rank 0 commits it), so the first checkpoint stays the best:
    ``--keep-checkpoints 1`` keeps it and the newest, and deletes the others."""
    commit = CheckpointWriter._commit

    def evaluated_then_committed(self, size, pending, reports):
        self.evaluated(pending.step, {"test_acc": 1.0 - pending.step / 100})
        return commit(self, size, pending, reports)

    monkeypatch.setattr(CheckpointWriter, "_commit", evaluated_then_committed)
    run_dir = os.path.join(shared_tmpdir(), "run")
    assert on_every_rank(main(["train", "--run-dir", run_dir] + with_flags(ARGS, keep_checkpoints=1))) == [0] * SIZE
    directory = os.path.join(run_dir, "checkpoints")
    assert sorted(os.listdir(directory)) == ["best", "ckpt-00000010", "ckpt-00000040", "last"]
    assert os.readlink(os.path.join(directory, "best")) == "ckpt-00000010"
    assert os.readlink(os.path.join(directory, "last")) == "ckpt-00000040"
    for name in ("ckpt-00000010", "ckpt-00000040"):
        assert checkpoint.verify(os.path.join(directory, name)) == []
        with open(os.path.join(directory, name, "manifest.json")) as f:
            assert json.load(f)["eval"]["test_acc"] == 1.0 - int(name[5:]) / 100
    MPI.COMM_WORLD.Barrier()


@pytest.mark.timeout(300)
def test_the_global_model_read_back_joins_every_ranks_piece_and_checks_each():
    """``read_model`` of a checkpoint of N ranks gives the global model as the pieces hold it, in rank
    order (joined here with plain h5py); a flipped byte in the last rank's piece is a checksum error."""
    run_dir = os.path.join(shared_tmpdir(), "run")
    assert on_every_rank(main(["train", "--run-dir", run_dir] + with_flags(ARGS, steps=20))) == [0] * SIZE
    path = os.path.join(run_dir, "checkpoints", "ckpt-00000020")
    with open(os.path.join(path, "manifest.json")) as f:
        name = json.load(f)["aliases"].get("model/global_weights", "model/global_weights")
    pieces = []
    for r in range(SIZE):
        with h5py.File(os.path.join(path, sharded.rank_file(r)), "r") as f:
            pieces.append(f[f"shared/{name}"][()])
    _, weights, _ = checkpoint.read_model(path)
    assert weights.dtype == pieces[0].dtype and np.array_equal(weights, np.concatenate(pieces))
    assert np.array_equal(weights, fields(path)[f"shared/{name}"])
    MPI.COMM_WORLD.Barrier()
    last = os.path.join(path, sharded.rank_file(SIZE - 1))
    if RANK == 0:
        with h5py.File(last, "r") as f:
            offset = f[f"shared/{name}"].id.get_offset()
        with open(last, "r+b") as f:
            f.seek(offset + 1)
            byte = f.read(1)
            f.seek(offset + 1)
            f.write(bytes([byte[0] ^ 0x01]))
    MPI.COMM_WORLD.Barrier()
    with pytest.raises(checkpoint.CheckpointError,
                       match=f"{sharded.rank_file(SIZE - 1)}: /shared/{name} checksum mismatch"):
        checkpoint.read_model(path)
    MPI.COMM_WORLD.Barrier()
