"""Convolutions computed a chunk of output rows at a time equal the one-chunk computation.

The CPU path splits every im2col + GEMM into chunks of about ``conv.CHUNK_BYTES``
(see ``ssdmpi/nn/conv.py``); the small layers of the gradient checks fit in one
chunk, so here ``CHUNK_BYTES`` is forced to 1 byte (one output row per chunk) and
the outputs, input gradients and parameter gradients are compared with a single
chunk (float64), and checked against finite differences.
"""

import numpy as np
import pytest

from ssdmpi.nn import Model
from ssdmpi.nn import conv as conv_module
from ssdmpi.nn.conv import Conv2d, row_chunks
from ssdmpi.verify.gradcheck import check_layer

# (id, layer factory, per-sample input shape); covers the three backward paths
CONVS = [
    ("3x3-pad1", lambda: Conv2d(3, 4, 3, 1, 1, name="conv"), (3, 7, 6)),              # dx by flipped conv
    ("3x3-stride2", lambda: Conv2d(3, 4, 3, 2, 1, name="conv"), (3, 9, 8)),            # dx by col2im
    ("5x5-pad2", lambda: Conv2d(2, 3, 5, 1, 2, bias=False, name="conv"), (2, 6, 7)),   # flipped conv, k=5
    ("5x5-6to16", lambda: Conv2d(6, 16, 5, 1, 0, name="conv"), (6, 9, 9)),             # col2im, stride 1
    ("1x1-stride2", lambda: Conv2d(3, 5, 1, 2, 0, bias=False, name="conv"), (3, 7, 7)),
]


def _run(make, shape, chunk_bytes, monkeypatch, batch=3):
    monkeypatch.setattr(conv_module, "CHUNK_BYTES", chunk_bytes)
    layer = make()
    model = Model([layer], shape, dtype=np.float64, seed=1)
    layer.input_grad = True
    rng = np.random.default_rng(2)
    x = rng.normal(size=tuple(shape) + (batch,))
    y = layer.forward(x)
    dx = layer.backward(rng.normal(size=y.shape))
    return y, dx, model.grads.copy()


@pytest.mark.parametrize("make, shape", [c[1:] for c in CONVS], ids=[c[0] for c in CONVS])
def test_row_chunks_give_the_one_chunk_result(make, shape, monkeypatch):
    whole = _run(make, shape, 1 << 40, monkeypatch)
    rows = _run(make, shape, 1, monkeypatch)
    for a, b in zip(whole, rows):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make, shape", [c[1:] for c in CONVS], ids=[c[0] for c in CONVS])
def test_row_chunked_gradients_match_finite_differences(make, shape, monkeypatch):
    monkeypatch.setattr(conv_module, "CHUNK_BYTES", 1)
    errors = check_layer(make(), shape, batch=3)
    assert "input" in errors
    bad = {k: v for k, v in errors.items() if not v < 1e-6}
    assert not bad, f"relative errors above 1e-6: {bad}"


def test_row_chunks_cover_the_rows_once(monkeypatch):
    monkeypatch.setattr(conv_module, "CHUNK_BYTES", 1000)
    assert row_chunks(np, 7, 300) == [(0, 3), (3, 6), (6, 7)]
    assert row_chunks(np, 7, 5000) == [(r, r + 1) for r in range(7)]      # at least one row per chunk
    monkeypatch.setattr(conv_module, "CHUNK_BYTES", 1 << 40)
    assert row_chunks(np, 7, 300) == [(0, 7)]
