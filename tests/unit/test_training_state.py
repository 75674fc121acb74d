"""``TrainingState``: the tree a checkpoint stores for one rank, and its restoration."""

import numpy as np
import pytest

from ssdmpi.errors import UserError
from ssdmpi.run.state import TrainingState


class Algo:
    def __init__(self, t=0):
        self.t, self.W = t, np.arange(4.0)

    def state_dict(self, copy=True):
        return {"t": self.t, "W": self.W.copy() if copy else self.W}

    def replicated(self):
        return ("W",)

    def load_state_dict(self, d):
        self.t, self.W = int(d["t"]), d["W"].copy()

    def global_weights(self):
        return self.W


class Model:
    def __init__(self):
        self.params = np.ones(4, dtype=np.float32)
        self._buffers = {"bn.mean": np.zeros(2)}

    def buffers(self):
        return self._buffers

    def load_buffers(self, buffers):
        self._buffers = {k: v.copy() for k, v in buffers.items()}


class Loader:
    def __init__(self, iteration=0):
        self.iteration = iteration

    def state_dict(self):
        return {"iteration": self.iteration}

    def load_state_dict(self, d):
        self.iteration = int(d["iteration"])


def test_state_dict_holds_every_part_and_load_state_dict_restores_it():
    source = TrainingState(Model(), Algo(t=7), Loader(7))
    source.step, source.last_eval, source.elapsed0 = 7, {"test_acc": 0.5}, 10.0
    source.model._buffers["bn.mean"][:] = 3.0
    tree = source.state_dict()
    assert list(tree) == ["algo", "model", "loader", "trainer"]
    assert tree["algo"]["W"] is not source.algo.W                      # copies, not the live buffers
    assert tree["model"]["buffers"]["bn.mean"] is not source.model.buffers()["bn.mean"]
    assert source.state_dict(copy=False)["model"]["buffers"]["bn.mean"] is source.model.buffers()["bn.mean"]
    assert "params" not in tree["model"]                                # W or L: the algorithm restores them
    assert tree["trainer"]["step"] == 7 and tree["trainer"]["elapsed"] >= 10.0
    assert source.replicated() == ("algo/W",)

    target = TrainingState(Model(), Algo(), Loader())
    target.load_state_dict(tree)
    assert (target.step, target.algo.t, target.loader.iteration) == (7, 7, 7)
    assert target.last_eval == {"test_acc": 0.5} and target.elapsed0 == tree["trainer"]["elapsed"]
    np.testing.assert_array_equal(target.model.buffers()["bn.mean"], [3.0, 3.0])
    target.check_consistent("ckpt")


def test_an_inconsistent_checkpoint_is_a_collective_user_error():
    state = TrainingState(Model(), Algo(t=5), Loader(6))
    state.step = 5
    with pytest.raises(UserError, match="ckpt-5.h5 is inconsistent: trainer step 5, algorithm t 5, "
                                        "loader position 6") as info:
        state.check_consistent("ckpt-5.h5")
    assert info.value.collective


def test_the_clock_counts_earlier_attempts():
    state = TrainingState(Model(), Algo(), Loader())
    state.elapsed0, state.train_s0 = 100.0, 60.0
    state.start_clock()
    state.totals["wall"] = 2.5
    assert state.time_s() >= 100.0 and state.train_s() == 62.5
