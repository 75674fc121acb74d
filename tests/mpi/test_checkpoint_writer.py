"""The checkpoint writer on real ranks: every rank writes its own file in the background, the
commit records what each wrote, and a writer that fails on one rank stops every rank with the
same one-line error instead of leaving the others waiting (run under mpiexec -n 1/2/4)."""

import json
import os

import pytest
from mpi4py import MPI

from ssdmpi import checkpoint
from ssdmpi.checkpoint import sharded
from ssdmpi.cli import main
from tests.mpi.test_resume import shared_tmpdir

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
ARGS = ["--dataset", "digits", "--model", "mlp", "--widths", "32", "--batch-size", "8", "--lr", "0.05",
        "--algo", "ssd", "--comm", "period", "--delay", "3", "--warmup-steps", "6", "--steps", "40",
        "--checkpoint-every", "10", "--log-every", "5", "--eval-every", "0", "--keep-checkpoints", "0",
        "--no-progress-bar"]


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
