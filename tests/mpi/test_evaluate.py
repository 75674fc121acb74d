"""The trainer's evaluation of ``W`` uses the BatchNorm statistics of every rank that trains,
averaged; rank 0's ``L`` uses rank 0's own; training continues bit for bit afterwards.

ResNet-20 (BatchNorm after every convolution) on the 8x8 digits, a few steps per rank on
its own shard, so every rank's running statistics differ. The oracle gathers every rank's
statistics with mpi4py, averages them in NumPy and evaluates ``W`` with them through a
second model; the trainer's ``Evaluator`` must give the same loss and accuracy bit for bit.
Run at 1, 2 and 4 ranks (tests/run.py); the asgd case needs a server and a worker.
"""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import ssdmpi
from ssdmpi.algos import AlgoConfig, build_algorithm
from ssdmpi.cli import main
from ssdmpi.comm.communicator import Communicator
from ssdmpi.data import ShardedLoader, load_dataset
from ssdmpi.nn import build_model
from ssdmpi.run.evaluation import Evaluator, evaluate
from tests.mpi.test_resume import shared_tmpdir
from tests.mpi.test_train import records

SIZE, RANK = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
B, STEPS, MORE = 4, 6, 3
CONFIGS = {
    "ssd": dict(algo="ssd", comm="step", delay=2, warmup_steps=3, lr=0.05),
    "asgd": dict(algo="asgd", servers=1, asgd_order="round-robin", warmup_steps=2, lr=0.05),
}


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    ds.test_x, ds.test_y = ds.test_x[:120], ds.test_y[:120]     # a quick evaluation, still sharded
    return ds


@pytest.fixture
def communicator():
    c = Communicator(MPI.COMM_WORLD)
    yield c
    c.free()


def build(name, digits, communicator):
    """(model, algorithm, loader or None) of one rank, trained for nothing yet."""
    model = build_model("resnet20", digits.input_shape, digits.num_classes, seed=3)
    algo = build_algorithm(AlgoConfig(**CONFIGS[name]), model, communicator)
    workers = SIZE - CONFIGS[name].get("servers", 0)
    loader = ShardedLoader(digits.train_x, digits.train_y, B, RANK, workers, seed=4) if RANK < workers else None
    return model, algo, loader, workers


def train(algo, loader, steps):
    for _ in range(steps):
        algo.step(*(loader.next_batch() if loader is not None else (None, None)))


def snapshot(model, algo) -> dict:
    """Every array of this rank's training state, host copies."""
    state = {f"algo.{k}": np.array(v, copy=True) for k, v in algo.state_dict().items() if isinstance(v, np.ndarray)}
    state.update({f"buffer.{k}": np.array(v, copy=True) for k, v in model.buffers().items()})
    state["params"] = np.array(model.params, copy=True)
    return state


def float_buffers(model) -> dict:
    return {k: np.array(v, copy=True) for k, v in model.buffers().items() if np.asarray(v).dtype.kind == "f"}


def evaluated_with(digits, communicator, weights, buffers) -> tuple:
    """(loss, accuracy) of a fresh ResNet-20 holding ``weights`` and the float ``buffers``, evaluated
    on the same shards as the trainer's evaluation."""
    model = build_model("resnet20", digits.input_shape, digits.num_classes, seed=99)
    model.params[...] = weights
    model.load_buffers({**model.buffers(), **buffers})
    loss, acc, _ = evaluate(model, digits.test_x, digits.test_y, communicator)
    return loss, acc


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_W_is_evaluated_with_the_mean_statistics_and_training_continues_bitwise(name, digits, communicator):
    if name == "asgd" and SIZE < 2:
        pytest.skip("asgd needs a server and a worker: at least 2 ranks")
    model, algo, loader, workers = build(name, digits, communicator)
    train(algo, loader, STEPS)
    algo.drain()
    before = snapshot(model, algo)

    # The oracle: every rank's statistics gathered, those of the ranks that train averaged.
    everyone = MPI.COMM_WORLD.allgather(float_buffers(model))
    trained = everyone[:workers]          # an asgd server (the last rank) never ran a forward pass
    mean = {k: (np.sum([np.asarray(b[k], np.float64) for b in trained], axis=0) / workers).astype(b0.dtype)
            for k, b0 in trained[0].items()}
    assert mean and all("running_" in k for k in mean)
    if workers > 1:      # otherwise the test could not tell the mean from one rank's statistics
        assert any(not np.array_equal(trained[0][k], trained[1][k]) for k in mean)
    W = np.array(algo.global_weights(), copy=True)

    result = Evaluator(communicator, model, algo, digits.test_x, digits.test_y)()

    assert (result["test_loss"], result["test_acc"]) == evaluated_with(digits, communicator, W, mean)
    if workers > 1:      # and not what rank 0's statistics give
        assert result["test_loss"] != evaluated_with(digits, communicator, W, trained[0])[0]
    if algo.local_weights() is not None:
        L0 = MPI.COMM_WORLD.bcast(np.array(algo.local_weights(), copy=True) if RANK == 0 else None, root=0)
        assert (result["test_loss_local"], result["test_acc_local"]) == \
            evaluated_with(digits, communicator, L0, everyone[0])
    # The training state is untouched, and training goes on as if there had been no evaluation.
    after = snapshot(model, algo)
    assert sorted(after) == sorted(before) and all(np.array_equal(after[k], before[k]) for k in before)
    train(algo, loader, MORE)
    algo.drain()
    model2, algo2, loader2, _ = build(name, digits, communicator)
    train(algo2, loader2, STEPS + MORE)
    algo2.drain()
    one, other = snapshot(model, algo), snapshot(model2, algo2)
    assert sorted(one) == sorted(other)
    assert [k for k in one if not np.array_equal(one[k], other[k])] == []


@pytest.mark.timeout(300)
def test_ssdmpi_eval_of_a_checkpoint_gives_the_runs_own_final_evaluation(capsys):
    """A checkpoint's model is ``W`` with every training rank's statistics averaged: ``ssdmpi eval``
    (and ``ssdmpi.load_model``) on as many ranks reproduces the run's final evaluation bit for bit;
    ``--local`` is rank 0's ``L`` with rank 0's own statistics, the run's ``test_loss_local``."""
    run = os.path.join(shared_tmpdir(), "run")
    args = ["train", "--run-dir", run, "--dataset", "digits", "--model", "resnet20", "--batch-size", "4",
            "--steps", "8", "--seed", "2", "--algo", "ssd", "--comm", "step", "--delay", "2", "--warmup-steps", "3",
            "--eval-every", "0", "--log-every", "1000", "--no-progress-bar"]
    assert MPI.COMM_WORLD.allgather(main(args)) == [0] * SIZE
    final = records(run, "eval")[-1]
    for extra, suffix in (([], ""), (["--local"], "_local")):
        capsys.readouterr()
        assert MPI.COMM_WORLD.allgather(main(["eval", "--checkpoint", run, "--json"] + extra)) == [0] * SIZE
        out = capsys.readouterr().out
        got = json.loads(out.strip().splitlines()[-1]) if RANK == 0 else None
        got = MPI.COMM_WORLD.bcast(got and (got["test_loss"], got["test_acc"]), root=0)   # asserted on every rank
        assert got == (final[f"test_loss{suffix}"], final[f"test_acc{suffix}"]), extra
    # ssdmpi.load_model: the same W and statistics (evaluated here on the run's shards)
    digits = load_dataset("digits")
    model = ssdmpi.load_model(run)
    with Communicator(MPI.COMM_WORLD) as comm:
        loss, acc, _ = evaluate(model, digits.test_x, digits.test_y, comm)
    assert (loss, acc) == (final["test_loss"], final["test_acc"])
