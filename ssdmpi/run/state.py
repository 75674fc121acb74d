"""One rank's training state as a checkpoint holds it, and the run's clock.

The model, the algorithm and the loader own their state (each has ``state_dict()`` /
``load_state_dict()``); ``TrainingState`` adds the trainer's own counters and assembles the
tree a checkpoint stores for this rank (layout: ``ssdmpi/checkpoint/sharded.py``)::

    {"algo": algo.state_dict(), "model": {"buffers"}, "loader": loader.state_dict(),
     "trainer": {"step", "elapsed", "train_s", "last_eval", "resizes"}}

The model's parameters are not in it: they are ``W`` (warm-up) or ``L`` (delay stage), which
the algorithm restores. ``replicated()`` names the arrays identical on every rank (the
checkpoint stores them once, split across ranks). A rank without a loader (``loader=None``: an
asgd server, which trains on no data) has no ``"loader"`` entry. ``resized_state`` builds this
rank's tree from a checkpoint of another number of ranks; ``resizes`` lists every such resume
of the run (``step``, ``from_ranks``, ``to_ranks``, ``batch_size``: per rank before and after,
``merged``: what happened to the per-rank state).

Clock: ``time_s()`` is the run's wall time across resumes (evaluations and checkpoints
included), ``train_s()`` the same counting training steps only (the sync-point intervals
summed in ``totals["wall"]``).
"""

from __future__ import annotations

import time

from ssdmpi import backend
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
        self.resizes: list = []
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

    def state_dict(self, copy: bool = True) -> dict:
        """This rank's whole state (drains the algorithm first): host copies, or with ``copy=False``
        the live buffers (device arrays on a GPU), valid until the next step."""
        buffers = self.model.buffers()
        return {"algo": self.algo.state_dict(copy=copy),
                "model": {"buffers": {k: backend.to_host(v).copy() for k, v in buffers.items()} if copy
                          else dict(buffers)},
                **({"loader": self.loader.state_dict()} if self.loader is not None else {}),
                "trainer": {"step": self.step, "elapsed": self.time_s(), "train_s": self.train_s(),
                            "last_eval": dict(self.last_eval), "resizes": list(self.resizes)}}

    def replicated(self) -> tuple:
        """Paths in ``state_dict()`` of the arrays identical on every rank (``algo/W``, ...)."""
        return tuple(f"algo/{k}" for k in self.algo.replicated())

    def resized_state(self, ranks) -> tuple[dict, dict]:
        """Collective: this rank's tree from the ranks of a checkpoint written by another number of
        ranks (``ranks``: ``ssdmpi/checkpoint/load.py``'s ``OldRanks``), and the ``resize`` record.

        The algorithm's part follows ``ssdmpi/algos/resize.py``; model buffers: float ones (BatchNorm
        statistics) averaged over the old ranks, others (Dropout RNG states) those of old rank
        ``rank % old ranks``; the loader position (the same on every rank: an offset into the global
        sample order) and the trainer's counters: old rank 0's."""
        algo, merged = self.algo.resized_state(ranks)
        buffers = {}
        for key, info in sorted(ranks.arrays("model/buffers").items()):
            path = f"model/buffers/{key}"
            buffers[key] = ranks.mean(path) if info.dtype.kind == "f" else ranks.of_rank(ranks.rank % ranks.old_size,
                                                                                        path)
        trainer = dict(ranks.values("trainer"))
        record = {"step": int(trainer.get("step", algo["t"])), "from_ranks": ranks.old_size,
                  "to_ranks": ranks.new_size, "merged": merged}
        if self.loader is not None:      # the global batch stays; its split over the ranks changes
            record["batch_size"] = [int(ranks.values("loader")["batch_size"]), self.loader.batch_size]
        trainer["resizes"] = list(trainer.get("resizes") or []) + [record]
        tree = {"algo": algo, "model": {"buffers": buffers}, "trainer": trainer}
        if self.loader is not None:
            tree["loader"] = dict(ranks.values("loader"))
        return tree, {"kind": "resize", **record}

    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict()``'s tree (arrays on the host); ``UserError`` if it does not fit."""
        self.algo.load_state_dict(state["algo"])
        if state.get("model", {}).get("buffers"):
            self.model.load_buffers({k: backend.to_device(v) for k, v in state["model"]["buffers"].items()})
        if self.loader is not None:
            self.loader.load_state_dict(state["loader"])
        trainer = state.get("trainer", {})
        self.step, self.elapsed0 = int(trainer.get("step", self.algo.t)), float(trainer.get("elapsed", 0.0))
        self.train_s0 = float(trainer.get("train_s", 0.0))
        self.last_eval = dict(trainer.get("last_eval") or {})
        self.resizes = list(trainer.get("resizes") or [])

    def check_consistent(self, source: str) -> None:
        """Collective ``UserError`` unless trainer, algorithm and loader agree on the step."""
        position = self.step if self.loader is None else self.loader.iteration
        if self.step != self.algo.t or self.step != position:
            raise UserError(f"{source} is inconsistent: trainer step {self.step}, algorithm t {self.algo.t}, "
                            f"loader position {position}", collective=True)
