"""One rank's training state as a checkpoint holds it, and the run's clock.

The model, the algorithm and the loader own their state (each has ``state_dict()`` /
``load_state_dict()``); ``TrainingState`` adds the trainer's own counters and assembles the
tree a checkpoint stores for this rank (layout: ``ssdmpi/checkpoint/format.py``)::

    {"algo": algo.state_dict(), "model": {"params", "buffers"}, "loader": loader.state_dict(),
     "trainer": {"step", "elapsed", "train_s", "last_eval"}}

A rank without a loader (``loader=None``: an asgd server, which trains on no data) has no
``"loader"`` entry.

Clock: ``time_s()`` is the run's wall time across resumes (evaluations and checkpoints
included), ``train_s()`` the same counting training steps only (the sync-point intervals
summed in ``totals["wall"]``).
"""

from __future__ import annotations

import time

from ssdmpi.errors import UserError

TOTAL_KEYS = ("steps", "wall", "compute_s", "inflight_s", "wait_s", "bytes_sent")


class TrainingState:
    """The trainer's counters over ``model``, ``algo`` and ``loader`` (see the module docstring).

    ``step``: iterations done; ``last_eval``: the latest evaluation's results;
    ``totals``: this attempt's sums over its logged intervals (``TOTAL_KEYS``; for the summary).
    """

    def __init__(self, model, algo, loader):
        self.model, self.algo, self.loader = model, algo, loader
        self.step = 0
        self.last_eval: dict = {}
        self.elapsed0 = 0.0      # wall seconds of the attempts before this one
        self.train_s0 = 0.0      # their training seconds
        self.totals = dict.fromkeys(TOTAL_KEYS, 0.0)
        self.totals["steps"] = 0
        self.t_start = time.monotonic()

    def start_clock(self) -> None:
        self.t_start = time.monotonic()

    def time_s(self) -> float:
        return self.elapsed0 + (time.monotonic() - self.t_start)

    def train_s(self) -> float:
        return self.train_s0 + self.totals["wall"]

    def state_dict(self) -> dict:
        """This rank's whole state (host copies). Call after ``algo.drain()``."""
        from ssdmpi import backend

        return {"algo": self.algo.state_dict(),
                "model": {"params": backend.to_host(self.model.params).copy(),
                          "buffers": {k: backend.to_host(v).copy() for k, v in self.model.buffers().items()}},
                **({"loader": self.loader.state_dict()} if self.loader is not None else {}),
                "trainer": {"step": self.step, "elapsed": self.time_s(), "train_s": self.train_s(),
                            "last_eval": self.last_eval}}

    def shared(self, state: dict) -> dict:
        """The checkpoint's top-level trees (rank 0): the global model W and these BN statistics."""
        from ssdmpi import backend

        return {"model": {"global_weights": backend.to_host(self.algo.global_weights()).copy(),
                          "buffers": state["model"]["buffers"]}}

    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict()``'s tree (arrays on the host); ``UserError`` if it does not fit."""
        from ssdmpi import backend

        self.algo.load_state_dict(state["algo"])
        if state.get("model", {}).get("buffers"):
            self.model.load_buffers({k: backend.to_device(v) for k, v in state["model"]["buffers"].items()})
        if self.loader is not None:
            self.loader.load_state_dict(state["loader"])
        trainer = state.get("trainer", {})
        self.step, self.elapsed0 = int(trainer.get("step", self.algo.t)), float(trainer.get("elapsed", 0.0))
        self.train_s0 = float(trainer.get("train_s", 0.0))
        self.last_eval = dict(trainer.get("last_eval") or {})

    def check_consistent(self, source: str) -> None:
        """Collective ``UserError`` unless trainer, algorithm and loader agree on the step."""
        position = self.step if self.loader is None else self.loader.iteration
        if self.step != self.algo.t or self.step != position:
            raise UserError(f"{source} is inconsistent: trainer step {self.step}, algorithm t {self.algo.t}, "
                            f"loader position {position}", collective=True)
