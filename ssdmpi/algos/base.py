"""``Algorithm``: the state and the SSGD warm-up shared by every training algorithm.

Buffers (1-D, the model's dtype and device):

- warm-up stage: ``W`` IS ``model.params`` (the model computes on the global weights);
- delay stage: ``L`` IS ``model.params`` (the model computes on the local weights) and ``W``
  is a separate buffer, created at the switch as a copy (so ``L <- W`` costs nothing).

``M`` is the global momentum buffer. Subclasses implement the delay stage
(``_begin_delay``, ``_delay_step``) and their extra state.

``--delay auto`` (``config.delay == "auto"``): ``k`` (and the merge delay ``d``, unless
``--merge-delay`` fixes it) is None until the switch, where ``ssdmpi/algos/auto_delay.py``
chooses it from the warm-up's measurements (collective); ``delay_choice`` holds the result and
``on_delay_chosen`` (set by the trainer) is told of it.
"""

from __future__ import annotations

import time

import numpy as np

from ssdmpi import backend
from ssdmpi.algos import auto_delay, registry, resize
from ssdmpi.algos.overlap import BackwardAllreduce
from ssdmpi.algos.period import Counts
from ssdmpi.errors import UserError
from ssdmpi.optim.sgd import MomentumSGD
from ssdmpi.phases import Phases, clock


class Algorithm:
    """Base class; see ``ssdmpi.algos`` for the public API."""

    name = "base"
    has_delay_stage = True

    def __init__(self, config, model, communicator):
        self.config, self.model, self.comm = config, model, communicator
        self.poll = None
        if getattr(communicator, "strategy", None) in ("test", "poll"):
            # The `test` progress strategy moves an allreduce only inside MPI calls made by
            # this thread: poke it between layers, and every few MB of the fused update
            # passes (``fused.POLL_BLOCKS``), so it overlaps the compute.
            model.between_layers = self.poll = communicator.progress
        self.N = int(communicator.size)
        self.auto = config.delay == "auto" and self.has_delay_stage
        self.k = None if self.auto else config.delay
        # The merge delay d of a period rule that has one (its setting that --delay auto chooses with k;
        # None otherwise, or until auto chooses it).
        rule = registry.RULES.get(config.period_rule)
        self._merge_delay = rule.auto_chooses if rule is not None else None
        self.d = getattr(config, self._merge_delay) if self._merge_delay else None
        self.delay_choice = None          # --delay auto: the DelayChoice, once made
        self.on_delay_chosen = None       # callback(DelayChoice): the trainer reports it
        self._meter = auto_delay.DelayMeter(hi=config.delay_max, mu=config.momentum, d=self.d,
                                            rule=config.period_rule,
                                            merge_momentum=getattr(config, "merge_momentum", None) or 0.0) \
            if self.auto else None
        self.T_w = int(config.warmup_steps) if self.has_delay_stage else None
        self.xp = backend.array_module(model.params)
        self.mask = model.flat.decay_mask()
        self.schedule = config.global_schedule()
        self.global_sgd = MomentumSGD(config.momentum, config.weight_decay, self.mask)
        self.global_sgd._plan.poll = self.poll
        self.W = model.params
        self.M = self.xp.zeros_like(model.params)
        self.L = None
        self.counts = Counts()   # t, s (a period rule adds to s: ssdmpi/algos/period.py)
        self.phases = Phases()   # the step breakdown's fb_s / update_s (ssdmpi/phases.py)
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
            if self._meter is None:
                loss = self._ssgd_step(x, y)
            else:
                loss = self._measured_ssgd_step(x, y)
            self.t += 1
            if self.has_delay_stage and self.t == self.T_w:
                if self._meter is not None:
                    self._choose_delay()
                self._enter_delay()
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
        """``SSDPeriod(ssd, N=4, k=5, T_w=500, comm=period, rule=delta-merge, d=1, lr=0.1, ...)``: the key settings."""
        c = self.config
        k = "auto" if self.auto and self.k is None else self.k
        d = "auto" if self.auto and self.d is None and self._merge_delay else self.d
        keys = (("k", k), ("T_w", self.T_w), ("comm", c.comm), ("rule", c.period_rule), ("d", d),
                ("local_update", c.local_update), ("local_lr", c.local_lr), ("lr", c.lr),
                ("momentum", c.momentum), ("weight_decay", c.weight_decay))
        shown = ", ".join(f"{k}={v}" for k, v in keys if v is not None)
        return f"{type(self).__name__}({self.name}, N={self.N}, {shown}, t={self.t}, stage={self.stage})"

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
        d = {"algo": self.name, "t": int(self.t), "s": int(self.s), "stage": self.stage, "W": self.W, "M": self.M}
        if self.stage == "delay":
            d["L"] = self.L
            d.update(self._delay_state())
        if self.auto:
            d.update(self.delay_choice.state() if self.delay_choice else self._meter.state_dict())
        return resize.host_copies(d) if copy else d

    def replicated(self) -> tuple:
        """Keys of ``state_dict()`` whose arrays are identical on every rank (a checkpoint stores
        them once, and resuming on another number of ranks keeps them exactly)."""
        return ("W", "M") + (self._replicated_delay() if self.stage == "delay" else ())

    def resized_state(self, ctx) -> tuple[dict, str]:
        """Collective: this rank's ``state_dict()`` from a checkpoint written by another number of
        ranks, and what was merged (``ssdmpi/algos/resize.py``)."""
        return resize.averaged(ctx)

    def load_state_dict(self, d: dict) -> None:
        """Restore ``state_dict()`` output (this object must have been built with the same config)."""
        if str(d.get("algo")) != self.name:
            raise UserError(f"the checkpoint holds the state of algorithm {d.get('algo')!r}, not {self.name!r}")
        for key in ("W", "M") + (("L",) if str(d.get("stage")) == "delay" else ()):
            if key not in d or np.asarray(d[key]).shape != self.model.params.shape:
                raise UserError(f"the checkpoint's algorithm state {key} does not fit this model "
                                f"({self.model.params.size} parameters); was it trained with another model?")
        self.drain()
        self.t, self.s = int(d["t"]), int(d["s"])
        if self.auto:
            self._load_auto_state(d)
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
        self.M[...] = self.xp.asarray(d["M"])

    # --- shared pieces -------------------------------------------------------------------

    def _loss_and_grad(self, x, y, sync: bool = False) -> float:
        """``model.loss_and_grad`` timed into ``phases.fb_s`` (without the ``progress()`` calls the
        model makes between layers, nor the bucket copies and posts of ``backward_allreduce``);
        ``sync``: then wait for the device (``backend.synchronize``)."""
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
        same bits as the mean, without a separate pass: ``MomentumSGD.step``'s ``divisor``)."""
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
        self.global_sgd.step(self.W, self.M, G, self.schedule(self.s), divisor=self.N)
        self.s += 1
        return loss

    def _measured_ssgd_step(self, x, y) -> float:
        """``_ssgd_step``, timed for ``--delay auto``: the allreduce's time is what ``comm.stats``
        recorded during the step (the loop resets the stats only between steps); the rest of the
        step (forward, backward, the update) is compute, and the update is that less forward and
        backward. On a GPU the update is still running when the step returns: it lands in the next
        step's compute, before its synchronize. Without the backward overlap: ``c`` and ``T`` are
        measured apart (overlapped, each would hide part of the other)."""
        t0, T0, fb0 = time.perf_counter(), self.comm.stats.inflight_s, self.phases.fb_s
        loss = self._ssgd_step(x, y, overlap=False)
        T = self.comm.stats.inflight_s - T0
        c = time.perf_counter() - t0 - T
        self._meter.add(c, T, c - (self.phases.fb_s - fb0))
        return loss

    def _choose_delay(self) -> None:
        """Collective, at the switch: agree on ``k`` (auto_delay.py, with its CPU probe on a scratch
        buffer: no weight changes) and report it."""
        n = self.model.grads.size

        def probe(fraction: float) -> float:
            return auto_delay.probe_cpu(self.comm, self.xp.zeros(max(1, int(fraction * n)), self.model.grads.dtype))

        self.delay_choice = self._meter.choose(self.comm, self.t, probe)
        self.k, self.d = self.delay_choice.k, self.delay_choice.d
        if self.on_delay_chosen is not None:
            self.on_delay_chosen(self.delay_choice)

    def _load_auto_state(self, d: dict) -> None:
        """``--delay auto``: the choice made before the checkpoint (kept, never re-measured), or,
        inside the warm-up, the samples measured so far."""
        if "auto.k" in d:
            self.delay_choice = auto_delay.DelayChoice.from_state(d)
            self.k, self.d = self.delay_choice.k, self.delay_choice.d
        elif str(d.get("stage")) == "delay":
            raise UserError("the checkpoint's delay stage has no --delay auto choice in it (was it trained with "
                            "a fixed --delay?); resume with that --delay")
        else:
            self._meter.load_state_dict(d)

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

    def _reset_inflight(self) -> None:
        pass


class SSGD(Algorithm):
    """``--algo ssgd``: the warm-up forever (one allreduce, overlapped with the backward pass, and one
    global update per step)."""

    name = "ssgd"
    has_delay_stage = False
