"""The logged learning rates (``lr``, ``lr_local`` of metrics.jsonl, from ``algo.lr_global`` and
``algo.lr_local``) are the ones each algorithm really steps with, against the schedule.

Every lr-scaled update an iteration makes is captured (momentum SGD, the fused delta-own step,
the local updates). Before the iteration the algorithm states its ``lr_global`` and ``lr_local``;
the schedule (a step decay every 3 steps) makes ``eta(s)`` and ``eta(t)`` differ once the delay
stage starts, so reporting the wrong counter shows.
"""

import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi.algos import AlgoConfig, build_algorithm
from ssdmpi.comm.communicator import Communicator
from ssdmpi.data import ShardedLoader
from ssdmpi.nn import build_model
from ssdmpi.optim import fused

SCHEDULE = {"kind": "step", "every": 3, "gamma": 0.5}
# (settings, whether the delay stage has a local update of its own, with its own lr)
CASES = [
    (dict(algo="ssgd"), False),
    (dict(algo="ssd", comm="step", local_update="global-momentum"), True),
    (dict(algo="ssd", comm="step", local_update="sgd"), True),
    (dict(algo="ssd", comm="period", period_rule="replay"), True),
    (dict(algo="ssd", comm="period", period_rule="delta-own"), False),
    (dict(algo="localsgd"), False),
]


@pytest.fixture
def communicator():
    c = Communicator(MPI.COMM_WORLD)
    yield c
    c.free()


@pytest.mark.parametrize("settings, own_local", CASES, ids=lambda v: "-".join(map(str, v.values()))
                         if isinstance(v, dict) else str(v))
def test_logged_lr_is_the_lr_the_algorithm_steps_with(communicator, monkeypatch, settings, own_local):
    N, rank = communicator.size, communicator.rank
    delay = {} if settings["algo"] == "ssgd" else {"delay": 3, "warmup_steps": 4}
    cfg = AlgoConfig(lr=0.1, lr_schedule=SCHEDULE, **delay, **settings)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(240, 6)), rng.integers(0, 3, size=240)
    model = build_model("mlp", (6,), 3, widths=(5,), dtype=np.float64, seed=1)
    algo = build_algorithm(cfg, model, communicator)
    schedule = cfg.validate(N).global_schedule()
    used = []     # (what, lr) of this iteration's lr-scaled updates

    def spy(what, fn, lr_at):
        def wrapped(*args, **kwargs):
            used.append((what(args), args[lr_at]))
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(algo.optimizer, "update", spy(lambda a: "W" if a[0] is algo.W else "L",
                                                      algo.optimizer.update, 3))
    monkeypatch.setattr(fused, "momentum_sgd_expanded", spy(lambda a: "L", fused.momentum_sgd_expanded, 6))
    loader = ShardedLoader(x, y, 4, rank, N, seed=2)
    counters_differ = False
    for t in range(20):
        counters_differ |= schedule(algo.s) != schedule(algo.t)
        if getattr(algo, "local", None) is not None and not hasattr(algo.local.step, "spied"):
            algo.local.step = spy(lambda a: "local", algo.local.step, 3)
            algo.local.step.spied = True
        lr, lr_local = algo.lr_global, algo.lr_local
        used.clear()
        algo.step(*loader.next_batch())
        on_W = [v for what, v in used if what == "W"]
        if on_W:                                     # a global update: it starts at the reported lr
            assert on_W[0] == lr == schedule(algo.s - len(on_W)), (t, on_W, lr)
        elif used and not own_local:                 # the only steps are on L: they use the reported lr
            assert {v for _, v in used} == {lr}, (t, used, lr)
        if own_local and algo.stage == "delay" and t >= 4:
            assert [v for what, v in used if what == "local"] == [lr_local], (t, used, lr_local)
        if algo.stage == "delay" and not own_local and t >= 4:
            assert lr == schedule(t)                 # localsgd, delta-own: eta(t), not eta(s)
    assert counters_differ or settings["algo"] == "ssgd"      # the test tells eta(s) from eta(t)
