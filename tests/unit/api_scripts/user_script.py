"""A user's own training script: their model, their arrays, ssdmpi's trainer (run under mpiexec)."""
import json
import sys

import numpy as np

import ssdmpi
from ssdmpi.nn import Model
from ssdmpi.nn.layers import Linear, ReLU


def net(input_shape, num_classes, *, xp, dtype, seed):
    """A two-layer perceptron written by the user from ssdmpi.nn layers."""
    return Model([Linear(input_shape[0], 32, name="fc1"), ReLU(name="relu"), Linear(32, num_classes, name="fc2")],
                 input_shape, xp=xp, dtype=dtype, seed=seed, name="my-net")


def blobs(n, seed):
    """Tabular data: 3 classes of 20 features, Gaussian around fixed class centres."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(42).normal(size=(3, 20)) * 0.5
    y = rng.integers(0, 3, size=n)
    return (centres[y] + rng.normal(size=(n, 20))).astype(np.float32), y


(xtr, ytr), (xte, yte) = blobs(1200, 1), blobs(300, 2)
result = ssdmpi.train({"algo": "ssd", "delay": 3, "warmup_steps": 20, "epochs": 4, "batch_size": 16, "lr": 0.05,
                       "run_dir": sys.argv[1], "progress_bar": False, "log_every": 20},
                      model=net, dataset=(xtr, ytr, xte, yte))
# The returned model holds W: evaluate it here, with the same normalisation the run used.
mean, std = xtr.mean(0), xtr.std(0)
logits = result.model.forward(((xte - mean) / std).astype(np.float32), train=False)
from mpi4py import MPI  # noqa: E402

rank = MPI.COMM_WORLD.Get_rank()
with open(f"{sys.argv[1]}.rank{rank}.json", "w") as f:   # not stdout: the ranks' lines may interleave
    json.dump({"rank": rank, "exit_code": result.exit_code,
               "test_acc": result.summary.get("test_acc"), "own_acc": float(np.mean(logits.argmax(1) == yte)),
               "model": result.summary.get("model"), "world_size": result.summary.get("world_size"),
               "input_shape": list(result.model.input_shape)}, f)
