"""The examples of docs/API.md work as written: the model factory of its script builds for the
image datasets (``--model mymodels:net --dataset fashion-mnist``) and for tabular arrays.
(The script's training run itself is tests/unit/test_api.py's, under mpiexec.)"""

import re

import numpy as np

from tests.conftest import ROOT


def api_factory():
    """``net`` as docs/API.md's first Python block defines it (the lines before its data)."""
    block = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "API.md").read_text(), re.S).group(1)
    definitions = block.split("\ntrain_x, train_y, test_x, test_y = ...")[0]
    namespace = {}
    exec(compile(definitions, "docs/API.md", "exec"), namespace)
    return namespace["net"]


def test_the_api_factory_builds_for_images_and_for_tabular_features():
    from ssdmpi.nn import build_model

    net = api_factory()
    for shape in ((1, 8, 8), (1, 28, 28), (3, 32, 32), (20,)):
        model = build_model(net, shape, 10, seed=0)
        logits = model.forward(np.zeros((2,) + shape, np.float32), train=False)
        assert logits.shape == (2, 10), shape
