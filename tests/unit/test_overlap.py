"""The backward pass's ``grads_ready`` hook and the bucket plan of the overlapped allreduce
(ssdmpi/nn/model.py, ssdmpi/algos/overlap.py); the MPI side is tests/mpi/test_overlap.py."""

import numpy as np
import pytest

from ssdmpi.algos.overlap import DEFAULT_BUCKET_BYTES, BackwardAllreduce, bucket_cuts
from ssdmpi.nn import build_model

MODELS = [("mlp", (12,), {"widths": (8, 6)}), ("lenet5", (1, 12, 12), {}), ("resnet20", (3, 8, 8), {})]


@pytest.mark.parametrize("name,shape,options", MODELS, ids=[m[0] for m in MODELS])
def test_grads_ready_is_told_each_final_suffix_before_the_earlier_layers_run(name, shape, options):
    """After each top-level layer's backward, ``grads[offset:]`` already holds this backward's final
    gradient and ``grads[:offset]`` is still untouched; the offsets fall to 0."""
    model = build_model(name, shape, 4, dtype=np.float64, seed=1, **options)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(3,) + shape), rng.integers(0, 4, 3)
    seen = []
    model.grads_ready = lambda offset: seen.append((offset, model.grads.copy()))
    model.grads[...] = np.nan
    model.loss_and_grad(x, y)
    final = model.grads.copy()
    offsets = [offset for offset, _ in seen]
    assert offsets == sorted(offsets, reverse=True) and offsets[-1] == 0
    assert len(set(offsets)) >= 3
    for offset, grads in seen:
        np.testing.assert_array_equal(grads[offset:], final[offset:])
        assert np.isnan(grads[:offset]).all(), f"layers below offset {offset} ran before it was reported"


def test_a_linear_layers_gradient_is_reported_before_its_input_gradient_is_computed():
    """Linear writes dW and db, then computes dx: ``grads_ready`` hears of its slice in between,
    so the allreduce of that slice overlaps the dx GEMM too."""
    model = build_model("mlp", (12,), 4, widths=(8, 6), dtype=np.float64, seed=1)
    events = []
    for layer in model.layers:
        layer.backward = returning(layer.backward, events, layer.name)
    model.grads_ready = lambda offset: events.append(("ready", offset))
    rng = np.random.default_rng(0)
    model.loss_and_grad(rng.normal(size=(3, 12)), rng.integers(0, 4, 3))
    starts = dict(zip([layer.name for layer in model.layers], model.layer_offsets))
    for name in ("fc3", "fc2", "fc1"):
        assert events.index(("ready", starts[name])) < events.index(("returned", name)), events
    assert all(layer.params_done is None for layer in model.layers)


def returning(backward, events, name):
    def wrapper(dy):
        out = backward(dy)
        events.append(("returned", name))
        return out
    return wrapper


def test_layer_offsets_are_where_each_top_level_layer_starts():
    model = build_model("mlp", (12,), 4, widths=(8, 6), seed=0)
    names = [layer.name for layer in model.layers]
    starts = dict(zip(names, model.layer_offsets))
    assert starts["fc1"] == 0 and starts["fc2"] == 12 * 8 + 8 and starts["fc3"] == starts["fc2"] + 8 * 6 + 6
    assert starts["relu1"] == starts["fc2"] and starts["flatten"] == 0      # no tensors: the next layer's


def test_buckets_are_whole_layers_of_at_least_the_bucket_size_from_the_end():
    # layers start at 0, 10, 30, 35 (4-byte elements), buffer of 40: sizes 10, 20, 5, 5 elements
    offsets, size = [0, 0, 10, 30, 35, 35], 40
    assert bucket_cuts(offsets, size, 4, 40) == [(30, 40), (10, 30), (0, 10)]     # 40 B, then 80 B, then the rest
    assert bucket_cuts(offsets, size, 4, 20) == [(35, 40), (30, 35), (10, 30), (0, 10)]
    assert bucket_cuts(offsets, size, 4, 41) == [(10, 40), (0, 10)]     # 20 B, 40 B < 41: grows to 120 B
    assert bucket_cuts(offsets, size, 4, 1 << 30) == [(0, 40)]           # one bucket: no overlap
    assert bucket_cuts(offsets, size, 4, 1) == [(35, 40), (30, 35), (10, 30), (0, 10)]


class Posts:
    """A Communicator stand-in that records each posted slice's (start, values) and sums nothing."""

    def __init__(self):
        self.posted = []

    def allreduce_start(self, buf, average=True):
        assert average is False
        self.posted.append((buf, buf.copy()))
        return self

    def wait(self):
        return None


def test_a_copy_is_posted_when_a_destination_is_given():
    model = build_model("mlp", (12,), 4, widths=(8, 6), dtype=np.float64, seed=0)
    comm, dest = Posts(), np.zeros(model.num_params)
    overlap = BackwardAllreduce(model, comm, bucket_bytes=8)
    assert len(overlap.buckets) == 3
    overlap.start(dest)
    rng = np.random.default_rng(0)
    model.loss_and_grad(rng.normal(size=(3, 12)), rng.integers(0, 4, 3))
    pending = overlap.finish()
    assert model.grads_ready is None and len(comm.posted) == 3
    assert all(np.shares_memory(buf, dest) for buf, _ in comm.posted)
    np.testing.assert_array_equal(dest, model.grads)
    assert pending.wait() is dest


def test_the_default_bucket_is_ddps():
    model = build_model("mlp", (12,), 4, widths=(8, 6), seed=0)
    assert BackwardAllreduce(model, Posts()).bucket_bytes == DEFAULT_BUCKET_BYTES == 25 * 2**20
