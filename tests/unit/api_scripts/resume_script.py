"""Train longer from a script: 2 epochs, then resume auto to 4, against one 4-epoch run (argv: a directory)."""
import json
import sys

import numpy as np

import ssdmpi
from ssdmpi.nn import build_model


def factory(input_shape, num_classes, **kw):
    return build_model("mlp", input_shape, num_classes, widths=(16,), **kw)


rng = np.random.default_rng(0)
y = rng.integers(0, 4, 400)
x = (rng.normal(size=(400, 12)) + y[:, None]).astype(np.float32)
data = {"train_x": x[:320], "train_y": y[:320], "test_x": x[320:], "test_y": y[320:], "name": "mine"}
base = {"batch_size": 8, "warmup_steps": 5, "delay": 3, "progress_bar": False, "eval_every": 0}
root = sys.argv[1]
one = ssdmpi.train({**base, "epochs": 4, "run_dir": f"{root}/one"}, model=factory, dataset=data)
first = ssdmpi.train({**base, "epochs": 2, "run_dir": f"{root}/two"}, model=factory, dataset=data)
more = ssdmpi.train({**base, "epochs": 4, "run_dir": f"{root}/two", "resume": "auto"}, model=factory, dataset=data)
from mpi4py import MPI  # noqa: E402

with open(f"{root}/rank{MPI.COMM_WORLD.Get_rank()}.json", "w") as f:   # not stdout: ranks' lines interleave
    json.dump({"codes": [one.exit_code, first.exit_code, more.exit_code], "steps": [one.summary["step"],
               first.summary["step"], more.summary["step"]], "dataset": more.summary["dataset"],
               "same": bool(np.array_equal(one.model.params, more.model.params))}, f)
