"""mymodels.py: your own model, in a module of its own so that ssdmpi can import it again
(``ssdmpi eval``, ``--resume``, ``ssdmpi.load_model`` rebuild it as ``mymodels:net``)."""

import numpy as np

from ssdmpi.nn import Model
from ssdmpi.nn.layers import Flatten, Linear, ReLU


def net(input_shape, num_classes, *, xp, dtype, seed):
    n = int(np.prod(input_shape))       # images (C, H, W) or features (D,), flattened
    return Model([Flatten(), Linear(n, 64, name="fc1"), ReLU(name="relu"),
                  Linear(64, num_classes, name="fc2")], input_shape, xp=xp, dtype=dtype, seed=seed, name="net")
