"""``Algorithm``: the state and the SSGD warm-up shared by every training algorithm but asgd, and the
settings they share (the warm-up, the delay ``k``).

Buffers (1-D, the model's dtype and device):

- warm-up stage: ``W`` IS ``model.params`` (the model computes on the global weights);
- delay stage: ``L`` IS ``model.params`` (the model computes on the local weights) and ``W``
  is a separate buffer, created at the switch as a copy (so ``L <- W`` costs nothing).

``M`` is the global optimizer's state (``ssdmpi/optim/part.py``'s ``OptState``: momentum SGD's
velocity, ALGORITHM.md's ``M``), stepped by the inner optimizer ``optimizer`` the registry built.
``outer`` is the outer optimizer of the merged averages (``ssdmpi/optim/outer.py``; None: the plain
average) and ``B`` its momentum buffer, global like ``M`` (state key ``outer.momentum``).
Subclasses implement the delay stage (``_begin_delay``, ``_delay_step``) and their extra state; a
schedule that measures in the warm-up or chooses at the switch overrides ``_warmup_step`` and
``_switch`` (``--comm period``'s ``--delay auto``, ``ssd.py``).
"""

from __future__ import annotations

import functools

from ssdmpi.algos import auto_delay, resize
from ssdmpi.algos.contract import TrainingAlgorithm
from ssdmpi.algos.overlap import BackwardAllreduce
from ssdmpi.algos.period import Counts
from ssdmpi.errors import UserError
from ssdmpi.optim.outer import STATE_KEY as OUTER_KEY
from ssdmpi.phases import clock
from ssdmpi.spec import ALGORITHM, Setting
from ssdmpi.validate import is_int, nonnegative_int, number, positive_int


def delay_value(text: str):
    """``--delay``'s type: a positive integer k, or ``auto``."""
    import argparse

    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer k or auto, got {text!r}") from None


def _delay(flag: str, value) -> None:
    if value != "auto" and (not is_int(value) or value < 1):
        raise UserError(f"--{flag} must be a positive integer or auto, got {value!r}")


def _auto_warmup(run) -> None:
    """``--delay auto`` measures in the SSGD warm-up: it needs enough warm-up steps to measure."""
    if run.delay == "auto" and run.warmup_steps is not None and run.warmup_steps < auto_delay.MIN_WARMUP_STEPS:
        raise UserError(f"--delay auto measures compute and allreduce times during the SSGD warm-up and needs "
                        f"--warmup-steps >= {auto_delay.MIN_WARMUP_STEPS} (got {run.warmup_steps}); lengthen the "
                        "warm-up (--warmup-steps or --warmup-epochs) or give a fixed --delay K")


# The settings every algorithm with a delay stage shares (each algorithm's spec lists those it uses).
WARMUP_STEPS = Setting("warmup_steps", 0, "SSGD warm-up iterations", int, nonnegative_int, metavar="T",
                       group=ALGORITHM, argparse={"group": "warmup"})
WARMUP_EPOCHS = Setting("warmup_epochs", None, "SSGD warm-up in epochs (instead of --warmup-steps)", float,
                        functools.partial(number, low=0.0), metavar="E", group=ALGORITHM,
                        argparse={"group": "warmup"}, default_text="unset, --warmup-steps decides")
DELAY = Setting("delay", 5, "delay k, iterations between pulls of the global model (--comm period: the period; "
                "localsgd: between model averages); auto (--comm period with a rule that has a merge delay): the "
                "merge delay d that hides the allreduce and the period k that amortises it, within the rule's "
                "stable region, measured in the SSGD warm-up (needs --warmup-steps >= 5; docs/ALGORITHM.md section "
                "12)", delay_value, _delay, metavar="K|auto", group=ALGORITHM, context_check=_auto_warmup,
                structural=True, bench_tag="k{}")
DELAY_MAX = Setting("delay_max", auto_delay.DELAY_RANGE[1], "the largest k (and d) --delay auto may choose: a cap on "
                    "staleness (below what hiding the allreduce needs, part of it is exposed)", int, positive_int,
                    metavar="K", group=ALGORITHM, applies=lambda run: run.delay == "auto", where="--delay auto",
                    note="it caps the k auto chooses", bench_tag="max{}")


def refuse_auto(run) -> None:
    """``UserError`` for ``--delay auto`` given to an algorithm with nothing in flight across steps to hide."""
    if run.delay == "auto":
        raise UserError(f"--delay auto does not apply to --algo {run.algo} ({run.spec.why}: there is no allreduce "
                        "in flight to hide); give a fixed --delay K")


class Algorithm(TrainingAlgorithm):
    """Base class of the algorithms with the SSGD warm-up; see ``ssdmpi.algos`` for the public API."""

    name = "base"
    has_delay_stage = True

    def __init__(self, config, model, communicator, parts):
        super().__init__()
        from ssdmpi import backend  # late: the registry reads this module's settings for the CLI parser

        self.config, self.model, self.comm = config, model, communicator
        self.poll = None
        if getattr(communicator, "moved_by_caller", False):
            # A nonblocking allreduce that moves only inside MPI calls made by this thread: poke it
            # between layers, and every few MB of the fused update passes (``fused.POLL_BLOCKS``),
            # so it overlaps the compute.
            model.between_layers = self.poll = communicator.progress
        self.N = int(communicator.size)
        self.k = config.delay if self.has_delay_stage else None
        self.T_w = int(config.warmup_steps) if self.has_delay_stage else None
        self.xp = backend.array_module(model.params)
        self.mask = model.flat.decay_mask()
        self.schedule = config.global_schedule()
        self.optimizer = parts.optimizer
        self.optimizer.poll = self.poll
        self.W = model.params
        self.M = self.optimizer.init(model.params)
        self.outer = parts.outer
        self.B = None if self.outer is None else self.outer.init(model.params)
        if self.outer is not None:
            self.outer.poll = self.poll
        self.L = None
        self.counts = Counts()   # t, s (a period rule adds to s: ssdmpi/algos/period.py)
        # The gradient allreduce posted bucket by bucket during the backward pass (overlap.py),
        # in buckets of --bucket-size (the Communicator's bucket_bytes) or DDP's default 25 MiB.
        self.backward_allreduce = BackwardAllreduce(model, communicator, getattr(communicator, "bucket_bytes", None))
        self._stats = getattr(communicator, "stats", None)
        if self.has_delay_stage and self.T_w == 0:
            self._enter_delay()

    # --- public API ----------------------------------------------------------------------

    @property
    def t(self) -> int:
        """Iterations done (the index of the next one)."""
        return self.counts.t

    @t.setter
    def t(self, value: int) -> None:
        self.counts.t = value

    @property
    def s(self) -> int:
        """Global steps applied to ``W``."""
        return self.counts.s

    @s.setter
    def s(self, value: int) -> None:
        self.counts.s = value

    @property
    def stage(self) -> str:
        """``"warmup"`` (SSGD iterations ``t < T_w``; always for ssgd) or ``"delay"``."""
        return "delay" if self.L is not None else "warmup"

    @property
    def m(self) -> int | None:
        """Local-update counter of the NEXT iteration (``t - T_w``), None in the warm-up."""
        return self.t - self.T_w if self.stage == "delay" else None

    @property
    def lr_global(self) -> float:
        """``eta_g(s)``: the learning rate of the next global update."""
        return self.schedule(self.s)

    @property
    def lr_local(self) -> float | None:
        """The learning rate the next local update will use (None in the warm-up)."""
        return self.local_lr_at(self.t) if self.stage == "delay" else None

    def global_weights(self):
        """``W`` (a view; do not modify). Identical on every rank."""
        return self.W

    def local_weights(self):
        """``L`` (a view; do not modify), or None outside the delay stage."""
        return self.L

    def step(self, x, y) -> float:
        """Run iteration ``t`` on this rank's batch; return its mean loss (before the update).

        Adds to ``phases``: ``update_s`` is this call's time outside ``fb_s`` and outside the
        Communicator's exposed time (``wait_s``, progress calls included)."""
        return self.phases.time_step(self._stats, self._iteration, x, y)

    def _iteration(self, x, y) -> float:
        if self.stage == "warmup":
            loss = self._warmup_step(x, y)
            self.t += 1
            if self.has_delay_stage and self.t == self.T_w:
                self._switch()
        else:
            loss = self._delay_step(x, y)
            self.t += 1
        return loss

    def drain(self) -> None:
        """Complete any request in flight (see subclasses for when its result is applied)."""

    def finalize(self) -> None:
        """End of training: drain and apply every completed result to ``W`` at once.

        Unlike ``drain``, continuing afterwards is not the same trajectory as not calling it.
        """
        self.drain()

    def __repr__(self) -> str:
        """``SSDPeriod(ssd, N=4, k=5, T_w=500, comm=period, rule=delta-merge, merge_delay=1, lr=0.1, ...)``."""
        shown = ", ".join(f"{k}={v}" for k, v in self._shown() if v is not None)
        return f"{type(self).__name__}({self.name}, N={self.N}, {shown}, t={self.t}, stage={self.stage})"

    def _shown(self) -> list:
        """The key settings ``repr`` shows, as ``(name, value)`` pairs (None: left out)."""
        c = self.config
        return [("k", self.k), ("T_w", self.T_w), ("comm", c.comm), ("local_update", c.local_update),
                ("local_lr", c.local_lr), ("lr", c.lr), ("optimizer", self.optimizer)]

    def signature(self) -> dict:
        """Settings every rank must agree on (plain scalars)."""
        d = {f"algo.{k}": v for k, v in self.config.to_dict().items() if v is not None}
        d.update({"algo.world_size": self.N, "algo.num_params": int(self.model.params.size),
                  "algo.dtype": str(self.model.params.dtype)})
        return d

    def state_dict(self, copy: bool = True) -> dict:
        """Everything needed to continue bit for bit (drains first): NumPy copies and plain scalars;
        ``copy=False``: the live buffers (device arrays on a GPU), valid until the next step."""
        self.drain()
        d = {"algo": self.name, "t": int(self.t), "s": int(self.s), "stage": self.stage, "W": self.W,
             **self.M.entries("M"), **self._outer_entries()}
        if self.stage == "delay":
            d["L"] = self.L
            d.update(self._delay_state())
        d.update(self._schedule_state())
        return resize.host_copies(d) if copy else d

    def replicated(self) -> tuple:
        """Keys of ``state_dict()`` whose arrays are identical on every rank (a checkpoint stores
        them once, and resuming on another number of ranks keeps them exactly)."""
        return ("W", *(k for k, v in self.M.entries("M").items() if not isinstance(v, int)),
                *self._outer_entries()) + (self._replicated_delay() if self.stage == "delay" else ())

    def resized_state(self, ctx) -> tuple[dict, str]:
        """Collective: this rank's ``state_dict()`` from a checkpoint written by another number of
        ranks, and what was merged (``ssdmpi/algos/resize.py``)."""
        return resize.averaged(ctx)

    def load_state_dict(self, d: dict) -> None:
        """Restore ``state_dict()`` output (this object must have been built with the same config)."""
        import numpy as np

        if str(d.get("algo")) != self.name:
            raise UserError(f"the checkpoint holds the state of algorithm {d.get('algo')!r}, not {self.name!r}")
        arrays = ("W", *(k for k, v in self.M.entries("M").items() if not isinstance(v, int)),
                  *(k for k in self._outer_entries() if k in d))
        for key in arrays + (("L",) if str(d.get("stage")) == "delay" else ()):
            if key not in d or np.asarray(d[key]).shape != self.model.params.shape:
                raise UserError(f"the checkpoint's algorithm state {key} does not fit this model "
                                f"({self.model.params.size} parameters, --optimizer {self.config.optimizer}); was it "
                                "trained with another model or optimizer?")
        self.drain()
        self.t, self.s = int(d["t"]), int(d["s"])
        self._load_schedule_state(d)
        if str(d["stage"]) == "delay":
            if self.stage != "delay":
                self._enter_delay()
            self._reset_inflight()
            self.W[...] = self.xp.asarray(d["W"])
            self.L[...] = self.xp.asarray(d["L"])
            self._load_delay_state(d)
        else:
            if self.stage == "delay":
                raise UserError("cannot load a warm-up state into an algorithm already in its delay stage")
            self.W[...] = self.xp.asarray(d["W"])
        self.M.load_entries(d, "M", self.xp)
        if self.B is not None:     # a checkpoint without the buffer: the one before the first outer step
            self.B[...] = self.xp.asarray(d[OUTER_KEY]) if OUTER_KEY in d else 0

    def _outer_entries(self) -> dict:
        """The outer optimizer's momentum buffer as ``{"outer.momentum": B}`` (``{}`` without one)."""
        return {} if self.B is None else {OUTER_KEY: self.B}

    # --- shared pieces -------------------------------------------------------------------

    def _loss_and_grad(self, x, y, sync: bool = False) -> float:
        """``model.loss_and_grad`` timed into ``phases.fb_s`` (without the ``progress()`` calls the
        model makes between layers, nor the bucket copies and posts of ``backward_allreduce``);
        ``sync``: then wait for the device (``backend.synchronize``)."""
        from ssdmpi import backend

        st, overlap = self._stats, self.backward_allreduce
        t0, p0, o0 = clock(), (st.progress_s if st is not None else 0.0), overlap.spent_s
        loss = self.model.loss_and_grad(x, y)
        if sync:
            backend.synchronize()
        self.phases.fb_s += (clock() - t0) - ((st.progress_s - p0) if st is not None else 0.0) \
            - (overlap.spent_s - o0)
        return loss

    def _ssgd_step(self, x, y, overlap: bool = True) -> float:
        """ALGORITHM.md 1.1 / section 3: the allreduce of the mean gradients, one global update.

        ``overlap`` (and the gradient makes more than one bucket): the allreduce is posted bucket
        by bucket during the backward pass (``backward_allreduce``, ssdmpi/algos/overlap.py) and
        waited for before the update; else one blocking allreduce after the backward (one bucket
        would be posted after the backward anyway). The same bits either way (overlap.py says
        when). The allreduce sums; the global update divides by ``N`` as it reads the sum (the
        same bits as the mean, without a separate pass: the optimizer's ``divisor``)."""
        G = self.model.grads
        overlap = overlap and len(self.backward_allreduce.buckets) > 1
        if overlap:
            self.backward_allreduce.start()
        loss = self._loss_and_grad(x, y, sync=True)
        if overlap:
            self.backward_allreduce.finish().wait()
        else:
            self.comm.allreduce(G, average=False)
        # G/N = (1/N) sum_r g_r/B = ALGORITHM.md's G/(B*N)
        self.optimizer.update(self.W, self.M, G, self.schedule(self.s), divisor=self.N)
        self.s += 1
        return loss

    def _enter_delay(self) -> None:
        """The switch (ALGORITHM.md 1.2): ``L <- W``; ``W`` moves to its own buffer."""
        self.W = self.model.params.copy()
        self.L = self.model.params
        self._begin_delay()

    def local_lr_at(self, t: int) -> float:
        """Learning rate of the local step at iteration ``t`` (subclasses that use ``local_lr`` override)."""
        return self.schedule(t)

    def _dev(self, a):
        return self.xp.asarray(a)

    # hooks
    def _warmup_step(self, x, y) -> float:
        """One warm-up iteration (SSGD)."""
        return self._ssgd_step(x, y)

    def _switch(self) -> None:
        """At ``t = T_w``: into the delay stage."""
        self._enter_delay()

    def _begin_delay(self) -> None:
        raise NotImplementedError

    def _delay_step(self, x, y) -> float:
        raise NotImplementedError

    def _delay_state(self) -> dict:
        return {}

    def _replicated_delay(self) -> tuple:
        return ()

    def _load_delay_state(self, d: dict) -> None:
        pass

    def _schedule_state(self) -> dict:
        """State of the schedule's own choices (``--delay auto``), in the warm-up and after it."""
        return {}

    def _load_schedule_state(self, d: dict) -> None:
        pass

    def _reset_inflight(self) -> None:
        pass
