"""Printing a model shows its layers and sizes; printing an algorithm shows its key settings."""

import re

import pytest

from ssdmpi.nn import build_model


@pytest.mark.parametrize("name, shape, total", [("mlp", (1, 28, 28), 784 * 256 + 256 + 256 * 10 + 10),
                                                ("lenet5", (1, 28, 28), 61_706),     # the classic LeNet-5's count
                                                ("resnet20", (3, 32, 32), 269_722)])  # He et al.'s 0.27 M
def test_model_repr_lists_each_layer_and_the_total(name, shape, total):
    model = build_model(name, shape, 10)
    lines = repr(model).splitlines()
    assert lines[0].startswith(f"{name}: input (B, ")
    rows = lines[1:-1]
    assert [row.split()[0] for row in rows] == [layer.name for layer in model.layers]
    counts = [int(re.search(r"([\d,]+) params$", row).group(1).replace(",", "")) for row in rows]
    assert sum(counts) == total
    assert lines[-1] == f"  total: {total:,} parameters"
    assert f"(B, {', '.join(map(str, model.output_shape))})" in rows[-1]


def test_algorithm_repr_names_the_algorithm_and_its_settings():
    from mpi4py import MPI

    from ssdmpi.algos import AlgoConfig, build_algorithm
    from ssdmpi.comm.communicator import Communicator

    comm = Communicator(MPI.COMM_SELF, progress="blocking")
    try:
        model = build_model("mlp", (1, 8, 8), 10)
        algo = build_algorithm(AlgoConfig(algo="ssd", delay=3, warmup_steps=7, comm="step"), model, comm)
        text = repr(algo)
        assert text.startswith("SSDStep(ssd, N=1, k=3, T_w=7, comm=step, local_update=global-momentum, lr=0.1")
        assert text.endswith("t=0, stage=warmup)")
    finally:
        comm.free()
