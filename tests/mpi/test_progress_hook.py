"""With the `test` progress strategy, an allreduce in flight is driven between layers.

MPI moves a nonblocking collective only inside MPI calls; with ``--progress test`` the
algorithms hook ``Communicator.progress`` into the model so every layer of the forward
and backward pass gives it a turn. These tests pin that wiring down.
"""

import numpy as np

from ssdmpi.algos import AlgoConfig, build_algorithm
from ssdmpi.comm.communicator import Communicator
from ssdmpi.nn import build_model


def test_model_calls_the_hook_after_every_training_layer_only_in_training():
    model = build_model("mlp", (1, 8, 8), 10, widths=(16, 16), seed=0)
    calls = []
    model.between_layers = lambda: calls.append(1)
    x = np.random.default_rng(0).standard_normal((4, 1, 8, 8)).astype(np.float32)
    y = np.arange(4) % 10
    model.evaluate(x, y)
    assert calls == []                       # inference never pokes MPI
    model.loss_and_grad(x, y)
    # flatten, fc1, relu1, fc2, relu2, fc3 forward; backward skips flatten (no parameters before it)
    assert len(calls) == len(model.layers) + len(model.layers) - 1


def test_ssd_with_test_progress_drives_the_request_in_flight_between_layers():
    comm = Communicator(progress="test", stall_timeout=60)
    try:
        model = build_model("mlp", (1, 8, 8), 10, widths=(16,), seed=0)
        algo = build_algorithm(AlgoConfig(algo="ssd", comm="step", delay=2, warmup_steps=1, lr=0.05),
                               model, comm)
        assert model.between_layers == comm.progress
        counted = []
        real_progress = comm.progress
        model.between_layers = lambda: (counted.append(len(comm.grads.pending)), real_progress())
        rng = np.random.default_rng(comm.rank)
        for _ in range(4):
            algo.step(rng.standard_normal((8, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 8))
        algo.drain()
        # In the delay stage each step's compute overlaps the previous step's Iallreduce:
        # the hook ran while a request was outstanding.
        assert any(n > 0 for n in counted)
    finally:
        comm.free()


def test_other_strategies_leave_the_model_alone():
    comm = Communicator(progress="thread", stall_timeout=60)
    try:
        model = build_model("mlp", (1, 8, 8), 10, widths=(16,), seed=0)
        build_algorithm(AlgoConfig(algo="ssd", comm="step", delay=2, warmup_steps=1, lr=0.05), model, comm)
        assert model.between_layers is None
    finally:
        comm.free()
