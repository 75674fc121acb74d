"""Every layer's backward against finite differences (float64), plus im2col/col2im adjointness.

``check_layer`` wraps a layer in a float64 model, evaluates ``sum(forward(x) * R)``
for a fixed random ``R``, and compares its backward with central differences on
up to 40 coordinates of the input and of each parameter tensor.
"""

import numpy as np
import pytest

from ssdmpi.nn.conv import Conv2d, GlobalAvgPool2d, MaxPool2d, col2im, im2col
from ssdmpi.nn.layers import Dropout, Flatten, Linear, ReLU, ToBatchMajor, ToChannelMajor
from ssdmpi.nn.norm import BatchNorm
from ssdmpi.nn.residual import BasicBlock
from ssdmpi.nn.workspace import Workspace
from ssdmpi.verify.gradcheck import check_layer

TOLERANCE = 1e-6

# (id, layer factory, per-sample input shape, train mode)
LAYERS = [
    ("linear", lambda: Linear(5, 4, name="fc"), (5,), True),
    ("linear-nobias-xavier", lambda: Linear(5, 3, bias=False, init="xavier", name="fc"), (5,), True),
    ("relu", lambda: ReLU(), (6,), True),
    ("flatten", lambda: Flatten(), (2, 3, 3), True),
    ("to-channel-major", lambda: ToChannelMajor(), (2, 3, 3), True),
    ("to-batch-major", lambda: ToBatchMajor(), (2, 3, 3), True),
    ("dropout", lambda: Dropout(0.3), (10,), True),
    ("conv3x3-pad1", lambda: Conv2d(2, 3, 3, 1, 1, name="conv"), (2, 5, 5), True),     # dx by flipped conv
    ("conv3x3-stride2", lambda: Conv2d(2, 3, 3, 2, 1, name="conv"), (2, 7, 6), True),
    ("conv5x5-pad2", lambda: Conv2d(1, 2, 5, 1, 2, name="conv"), (1, 6, 6), True),
    ("conv5x5-nopad", lambda: Conv2d(2, 2, 5, 1, 0, name="conv"), (2, 7, 7), True),    # dx by col2im
    ("conv5x5-6to16", lambda: Conv2d(6, 16, 5, 1, 0, name="conv"), (6, 9, 9), True),  # LeNet conv2 shape
    ("conv3x3-pad3", lambda: Conv2d(2, 2, 3, 1, 3, name="conv"), (2, 4, 4), True),   # padding > k-1: col2im path
    ("conv1x1", lambda: Conv2d(2, 3, 1, 1, 0, name="conv"), (2, 4, 4), True),
    ("conv1x1-stride2-nobias", lambda: Conv2d(2, 3, 1, 2, 0, bias=False, name="conv"), (2, 5, 5), True),
    ("maxpool2", lambda: MaxPool2d(2), (2, 6, 6), True),
    ("maxpool3-stride2", lambda: MaxPool2d(3, 2), (2, 7, 7), True),
    ("global-avgpool", lambda: GlobalAvgPool2d(), (3, 4, 4), True),
    ("batchnorm2d-train", lambda: BatchNorm(3, name="bn"), (3, 4, 4), True),
    ("batchnorm2d-eval", lambda: BatchNorm(3, name="bn"), (3, 4, 4), False),
    ("batchnorm1d-train", lambda: BatchNorm(4, name="bn"), (4,), True),
    ("block-identity", lambda: BasicBlock(2, 2, 1, name="block"), (2, 5, 5), True),
    ("block-optionA", lambda: BasicBlock(2, 4, 2, "A", name="block"), (2, 6, 6), True),
    ("block-optionB", lambda: BasicBlock(2, 4, 2, "B", name="block"), (2, 6, 6), True),
]


@pytest.mark.parametrize("make, shape, train", [c[1:] for c in LAYERS], ids=[c[0] for c in LAYERS])
def test_layer_gradients_match_finite_differences(make, shape, train):
    errors = check_layer(make(), shape, batch=4, train=train)
    assert "input" in errors
    bad = {k: v for k, v in errors.items() if not v < TOLERANCE}
    assert not bad, f"relative errors above {TOLERANCE}: {bad}"


def test_gradient_check_catches_a_wrong_backward():
    """The checker itself must be able to fail: a Linear whose weight gradient is doubled."""

    class BrokenLinear(Linear):
        def backward(self, dy):
            dx = super().backward(dy)
            self.g["weight"] *= 2
            return dx

    errors = check_layer(BrokenLinear(4, 3, name="fc"), (4,))
    assert errors["fc.weight"] > 0.1
    assert errors["input"] < TOLERANCE


@pytest.mark.parametrize("k, stride, padding", [(3, 1, 1), (3, 2, 1), (5, 1, 2), (2, 2, 0), (3, 2, 0)])
def test_col2im_is_the_adjoint_of_im2col(k, stride, padding):
    """<im2col(x), c> == <x, col2im(c)> for random x, c: what makes the convolution backward right."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 7, 6, 3))        # channel-major (C, H, W, N)
    cols = im2col(x, k, k, stride, padding, Workspace()).copy()
    c = rng.normal(size=cols.shape)
    back = col2im(c, x.shape[1:3], stride, padding)
    assert back.shape == x.shape
    np.testing.assert_allclose(np.sum(cols * c), np.sum(x * back), rtol=1e-12)


def test_im2col_reads_the_right_pixels():
    x = np.arange(2 * 3 * 3 * 1, dtype=np.float64).reshape(2, 3, 3, 1)   # C=2, N=1
    cols = im2col(x, 3, 3, 1, 1, Workspace())                          # (C, 3, 3, 3, 3, N)
    assert cols.shape == (2, 3, 3, 3, 3, 1)
    # centre tap (i=j=1) is the image itself; the top-left tap sees zero padding at the border
    np.testing.assert_array_equal(cols[:, 1, 1, :, :, 0], x[:, :, :, 0])
    assert cols[0, 0, 0, 0, 0, 0] == 0 and cols[0, 0, 0, 1, 1, 0] == x[0, 0, 0, 0]


def test_output_shape_errors_name_the_layer():
    with pytest.raises(ValueError, match=r"conv7: expected input of shape \(batch, 3, height, width\), "
                                         r"received \(batch, 1, 28, 28\)"):
        Conv2d(3, 8, 3, name="conv7").output_shape((1, 28, 28))
    with pytest.raises(ValueError, match=r"fc: expected input of shape \(batch, 10\), received \(batch, 12\)"):
        Linear(10, 2, name="fc").output_shape((12,))
    with pytest.raises(ValueError, match="smaller than the 5x5 kernel"):
        Conv2d(1, 2, 5, name="conv").output_shape((1, 3, 3))
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.0)


def test_relu_works_in_place_and_masks_the_gradient():
    x = np.array([[-1.0, 2.0, 0.0, 3.0]])
    relu = ReLU()
    y = relu.forward(x)
    assert y is x                                        # no activation copy
    np.testing.assert_array_equal(y, [[0, 2, 0, 3]])
    np.testing.assert_array_equal(relu.backward(np.ones((1, 4))), [[0, 1, 0, 1]])


def test_maxpool_matches_a_direct_computation():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 4, 6, 3))                    # channel-major (C, H, W, N)
    y = MaxPool2d(2).forward(x)
    expected = x.reshape(2, 2, 2, 3, 2, 3).max(axis=(2, 4))
    np.testing.assert_array_equal(y, expected)


def test_maxpool_ties_route_each_gradient_once():
    """A window of equal values (zeros after a ReLU) sends its gradient to exactly one element."""
    pool = MaxPool2d(2)
    x = np.zeros((1, 4, 4, 1))
    pool.forward(x)
    dx = pool.backward(np.ones((1, 2, 2, 1)))
    assert dx.sum() == 4 and set(np.unique(dx)) == {0.0, 1.0}
    np.testing.assert_array_equal(dx[0, ::2, ::2, 0], np.ones((2, 2)))   # the first element of each window
