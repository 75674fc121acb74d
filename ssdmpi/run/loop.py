"""The training loop of ``ssdmpi train`` (``train``) and what happens at its synchronisation
points: the interval's metrics reduced over ranks (``Interval``, ``step_record``,
``log_interval``; one sync point later for asgd, ``LaggedSums``), checkpoints (``save``) and
evaluations (``evaluate_now``). ``ssdmpi/trainer.py``
sets a run up and ends it; the schedule of sync points is ``Due``'s docstring."""

from __future__ import annotations

import math
import time

import numpy as np

from ssdmpi import backend
from ssdmpi.data.normalisation import record as normalisation_record
from ssdmpi.errors import DIVERGED_EXIT, INTERRUPT_EXIT, REQUEUE_EXIT
from ssdmpi.phases import BREAKDOWN, breakdown, clock
from ssdmpi.run.job import Job, Stop
from ssdmpi.run.report import Reporter, shown_stage
from ssdmpi.version import __version__

# Per-step means summed (weighted by steps) into ``state.totals`` for the run summary.
PER_STEP_TOTALS = ("step_s", "compute_s", "inflight_s", "wait_s", "bytes_sent", *BREAKDOWN)


def train(job: Job, comm, out: Reporter, stop: Stop) -> tuple[int, str | None]:
    """Collective: train until the last step or an early stop; return ``(exit code, why it
    stopped early)``, ``(0, None)`` when every step ran. Each iteration: this rank's batch, one
    algorithm step. At sync points the ranks sum their interval metrics and agree on signals
    and divergence; checkpoints and evaluations happen there too."""
    cfg, model, algo, loader, state = job.cfg, job.model, job.algo, job.loader, job.state
    state.start_clock()
    comm.stats.reset()
    interval = Interval()
    lagged = None if algo.lockstep else LaggedSums()
    with np.errstate(over="ignore", invalid="ignore"):   # non-finite values are detected, not warned about
        while state.step < job.total_steps:
            if loader is None:              # an asgd server: it serves the workers' pushes, no loss
                algo.step(None, None)
            else:
                t_data = clock()
                xb, yb = loader.next_batch()
                if xb.dtype.kind == "f" and xb.dtype != model.dtype:   # --dtype float64 (the loader: float32)
                    xb = xb.astype(model.dtype)
                interval.data_s += clock() - t_data
                interval.add(algo.step(backend.to_device(xb), backend.to_device(yb)))
            state.step += 1
            out.progress.advance(state.step)
            due = Due(cfg, state.step, job.E, job.total_steps)
            if not due.sync:
                continue

            # -- synchronisation point: metrics, signals and divergence agreed by all ranks at once
            # (for an algorithm whose ranks do not step in lockstep, one sync point later: LaggedSums)
            if lagged is None:
                done = [(interval.reduce(comm, stop, algo), interval.steps, None)]
            else:
                done = lagged.exchange(interval, comm, stop, algo, interval_end(job), settle=due.checkpoint
                                       or due.planned_stop or due.evaluate or state.step == job.total_steps)
            for sums, steps, at in done:
                log_interval(job, comm, out, sums, steps, at)
            for record in job.checkpoints.poll(comm):   # a checkpoint written in the background: commit it
                committed(job, out, record)
            interval.synced()   # the sync point's own time counts in the next interval (``sync_s``)
            code, reason = stop_verdict(LaggedSums.flags(done), due.planned_stop, cfg.stop_at_step, state.step)
            if code == DIVERGED_EXIT:       # a non-finite loss: stop at once, keep the last good checkpoint
                return code, reason
            if due.checkpoint or reason:
                if comm.any_true(not _finite(algo.xp, algo.global_weights(), algo.local_weights())):
                    return DIVERGED_EXIT, f"diverged: non-finite weights at step {state.step}"
                save(job, comm, out, "signal" if reason else "epoch" if due.epoch_end else "periodic",
                     background=not reason)
            if reason:
                return code, reason
            if due.evaluate:
                state.last_eval = evaluate_now(job, out)
            interval.restart(comm, algo)   # after the checkpoint and evaluation: their time is not step time
    return 0, None


class Due:
    """What is due after step ``step``: is it a synchronisation point, and what happens there.

    Sync points: every ``--log-every`` steps, at checkpoints, at ``--stop-at-step`` and at the
    last step. Checkpoints: each epoch's end and every ``--checkpoint-every`` steps, but for the
    last step (``finish`` writes the final one). Evaluation: every ``--eval-every`` epochs (the
    last one is ``finish``'s).
    """

    __slots__ = ("epoch_end", "checkpoint", "planned_stop", "sync", "evaluate")

    def __init__(self, cfg, step: int, E: int, total_steps: int):
        self.epoch_end = step % E == 0
        self.checkpoint = bool(step < total_steps and (self.epoch_end or (cfg.checkpoint_every
                                                                          and step % cfg.checkpoint_every == 0)))
        self.planned_stop = cfg.stop_at_step is not None and step == cfg.stop_at_step
        self.sync = step % cfg.log_every == 0 or self.checkpoint or self.planned_stop or step == total_steps
        self.evaluate = bool(self.epoch_end and cfg.eval_every and (step // E) % cfg.eval_every == 0
                             and step < total_steps)


def stop_verdict(sums: dict, planned_stop: bool, stop_at_step, step: int) -> tuple[int, str | None]:
    """``(exit code, reason)`` to stop with at this sync point, or ``(0, None)`` to go on."""
    if sums["bad"] > 0:
        return DIVERGED_EXIT, f"diverged: non-finite training loss by step {step}"
    if sums["preempt"] > 0 or sums["interrupt"] > 0 or planned_stop:
        # a preemption signal anywhere wins over Ctrl-C: the job should be requeued
        code = INTERRUPT_EXIT if sums["interrupt"] > 0 and not sums["preempt"] else REQUEUE_EXIT
        reason = ("SIGUSR1/SIGTERM" if sums["preempt"] > 0 else
                  "Ctrl-C (SIGINT)" if sums["interrupt"] > 0 else f"--stop-at-step {stop_at_step}")
        return code, reason
    return 0, None


def _finite(xp, *arrays) -> bool:
    return all(a is None or bool(xp.isfinite(a).all()) for a in arrays)


class Interval:
    """This rank's steps since the last synchronisation point, and their reduction over ranks."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.steps, self.loss, self.bad, self.t0 = 0, 0.0, 0, time.monotonic()
        self.data_s = 0.0   # the step breakdown's data phase (ssdmpi/phases.py)
        self.sync_s = 0.0   # the previous sync point's reduction and logging, counted in this interval
        self._t_sync = self._last_sync = 0.0

    def synced(self) -> None:
        """After the sync point's reduction and logging (before any checkpoint or evaluation):
        remember how long they took. They are training time -- with a request in flight the
        control allreduce can wait behind its data -- so ``restart`` counts them in the next
        interval's wall, as ``sync_s``."""
        self._last_sync = time.monotonic() - self._t_sync

    def restart(self, comm, algo) -> None:
        """``reset()`` with the last sync point's time carried in (``synced``), and drop the
        communication and phase times gathered since the reduction (a checkpoint's drain, an
        evaluation): they are not in any step's time."""
        carried = self._last_sync
        self.reset()
        self.t0 -= carried
        self.sync_s = carried
        comm.stats.reset()
        algo.phases.reset()

    def add(self, loss) -> None:
        """Count a step and keep its loss (a float, or a 0-d device array left on the GPU: reading
        it is a host sync, paid once per interval when ``loss``/``bad`` are read)."""
        self.steps += 1
        self._unread.append(loss)

    @property
    def loss(self) -> float:
        """Sum of the interval's finite losses (reads the kept ones first, all in one copy)."""
        return self._read()[0]

    @loss.setter
    def loss(self, value: float) -> None:
        self._unread, self._loss = [], value

    @property
    def bad(self) -> int:
        """How many of the interval's losses were not finite (the divergence check's count)."""
        return self._read()[1]

    @bad.setter
    def bad(self, value: int) -> None:
        self._unread, self._bad = [], value

    def _read(self) -> tuple:
        if self._unread:
            for value in backend.host_floats(self._unread):
                if math.isfinite(value):
                    self._loss += value
                else:
                    self._bad += 1
            self._unread = []
        return self._loss, self._bad

    def reduce(self, comm, stop: Stop, algo) -> dict:
        """Collective: sums over ranks of the interval's numbers, the signal flags and the
        communication stats (one allreduce of a few float64 over the control communicator;
        asgd adds its staleness, and one more allreduce for its maximum). Ranks without
        training steps (asgd's servers) add no times or bytes: per-step means are the workers'."""
        values, stale_max, mine = self._values(comm, stop, algo)
        sums = comm.allreduce_scalars(values, op="sum")
        if stale_max is not None:
            sums["stale_max"] = comm.allreduce_scalars({"m": stale_max}, op="max")["m"]
        return dict(sums, **mine)

    def reduce_start(self, comm, stop: Stop, algo):
        """``reduce`` without waiting: the same sums, from the returned handle's ``wait()``."""
        values, stale_max, mine = self._values(comm, stop, algo)
        handles = [comm.allreduce_scalars_start(values, op="sum")]
        if stale_max is not None:
            handles.append(comm.allreduce_scalars_start({"m": stale_max}, op="max"))
        return _PendingSums(handles, mine)

    def _values(self, comm, stop: Stop, algo) -> tuple:
        """``(this rank's values to sum, its staleness maximum or None, its own step count and wall)``
        of the interval; starts the sync point's clock (``synced``)."""
        self._t_sync = time.monotonic()
        wall = self._t_sync - self.t0
        c = comm.stats.snapshot_and_reset()
        stale = algo.interval_staleness()
        mine = 1.0 if self.steps else 0.0    # per-step means are over the ranks that take steps
        values = {
            "preempt": stop.preempt, "interrupt": stop.interrupt, "bad": self.bad, "loss": self.loss,
            "steps": self.steps, "wall": wall * mine, "inflight_s": c["inflight_s"] * mine,
            "wait_s": c["wait_s"] * mine, "bytes_sent": c["bytes_sent"] * mine,
            **self._phase_sums(c, algo, mine),
            **{k: v for k, v in stale.items() if k != "stale_max"}}
        return values, (stale["stale_max"] if stale else None), {"my_steps": self.steps, "my_wall": wall}

    def _phase_sums(self, c: dict, algo, mine: float) -> dict:
        """This rank's step-breakdown totals (ssdmpi/phases.py), then its phase timers reset."""
        phases = algo.phases
        fb, update = phases.fb_s, phases.update_s
        phases.reset()
        return {"fb_s": fb * mine, "update_s": update * mine, "data_s": self.data_s * mine,
                "progress_s": c["progress_s"] * mine, "sync_s": self.sync_s * mine}


def step_record(sums: dict, global_batch: int) -> dict:
    """The per-step means of a ``kind: step`` metrics record (see ssdmpi/metrics.py) from ``Interval.reduce``.

    Times and bytes are per step, averaged over ranks; ``compute_s`` is the step time not
    spent blocked on communication; ``samples_per_s`` counts all ranks (rank 0's clock);
    the step breakdown (``ssdmpi/phases.py``'s ``BREAKDOWN`` keys) sums to ``step_s``.
    """
    per = max(1.0, sums["steps"])   # rank-steps in the interval
    step_s = sums["wall"] / per
    parts = breakdown(step_s, {k: sums.get(k, 0.0) / per for k in ("fb_s", "update_s", "data_s", "wait_s",
                                                                     "progress_s", "sync_s")})
    good = sums["steps"] - sums["bad"]
    stale = ({"staleness_mean": sums["stale_sum"] / sums["stale_n"] if sums["stale_n"] else 0.0,
              "staleness_max": int(sums["stale_max"])} if "stale_n" in sums else {})
    return {**stale, "loss": sums["loss"] / good if good > 0 else None,
            "samples_per_s": sums["my_steps"] * global_batch / sums["my_wall"] if sums["my_wall"] > 0 else None,
            "step_s": step_s, "compute_s": step_s - sums["wait_s"] / per,
            "inflight_s": sums["inflight_s"] / per, "wait_s": sums["wait_s"] / per,
            "bytes_sent": sums["bytes_sent"] / per, **parts,
            "overlap": min(1.0, max(0.0, 1 - sums["wait_s"] / sums["inflight_s"])) if sums["inflight_s"] > 0 else 0.0}


def interval_end(job: Job) -> dict:
    """What a step record says about the end of its interval: ``step``, ``epoch``, ``stage``,
    ``time``, ``lr``, ``lr_local`` (the lr the next iteration steps with), as they are now."""
    algo, state = job.algo, job.state
    return {"step": state.step, "epoch": state.step / job.E, "stage": shown_stage(algo), "time": state.time_s(),
            "lr": algo.lr_global, "lr_local": algo.lr_local}


def log_interval(job: Job, comm, out: Reporter, sums: dict, steps: int, at: dict | None = None) -> None:
    """Record the interval reduced (``steps`` of this rank's), which ended as ``at`` says
    (``interval_end``; None: now): the ``step`` metrics record, the running totals, the display."""
    state = job.state
    at = interval_end(job) if at is None else at
    step, E = at["step"], job.E
    record = {"kind": "step", **at, **step_record(sums, job.cfg.batch_size * job.workers)}
    if job.context is not None:      # a language model: its throughput in tokens too
        record = with_tokens_per_s(record, job.context)
    for key in PER_STEP_TOTALS:
        state.totals[key] = state.totals.get(key, 0.0) + record[key] * steps
    state.totals["steps"] += steps
    state.totals["wall"] += sums["my_wall"]
    record["train_s"] = state.train_s()
    out.write(record)
    out.step_logged(record)
    speed = ({"tokens/s": round(record["tokens_per_s"] or 0)} if job.context is not None
             else {"samples/s": round(record["samples_per_s"] or 0)})
    out.progress.update(step, {"epoch": f"{step / E:.2f}", "stage": at["stage"], "loss": record["loss"],
                               "lr": record["lr"], **speed})


def with_tokens_per_s(record: dict, context: int) -> dict:
    """``record`` (a step record or the summary) with ``tokens_per_s`` (``samples_per_s`` x ``context``)
    right after its ``samples_per_s``."""
    out = {}
    for key, value in record.items():
        out[key] = value
        if key == "samples_per_s":
            out["tokens_per_s"] = None if value is None else value * context
    return out


def tokens_seen(job: Job, step: int) -> int:
    """A language model's training tokens after ``step`` steps: step x global batch x context."""
    return int(step) * job.cfg.batch_size * job.workers * int(job.context)


class LaggedSums:
    """The sync points of an algorithm whose ranks do not step in lockstep (``algo.lockstep``
    False: asgd, whose workers meet only through the servers). A blocking reduction at every
    ``--log-every`` would align them there, the fastest waiting for the slowest; instead each
    sync point starts the reduction of its interval (``Interval.reduce_start``) and completes
    the one started at the previous sync point, so a rank waits only for ranks a whole interval
    behind it. Signals and a non-finite loss are acted on one sync point later (within
    ``2 * --log-every`` steps). Where the ranks meet anyway -- a checkpoint, an evaluation,
    ``--stop-at-step``, the last step -- and when the previous interval asks to stop, the
    reduction just started is completed too: no reduction is in flight when ``train`` returns
    or a checkpoint is written."""

    def __init__(self):
        self.pending = None     # (handle, steps, interval_end) of the last sync point

    def exchange(self, interval: Interval, comm, stop: Stop, algo, at: dict, settle: bool) -> list:
        """Collective: start this interval's reduction; return ``[(sums, steps, at), ...]`` of the
        intervals whose reductions completed, oldest first (none at the first sync point)."""
        posted = (interval.reduce_start(comm, stop, algo), interval.steps, at)
        done = [self._wait(self.pending)] if self.pending is not None else []
        self.pending = posted
        if settle or stop_verdict(self.flags(done), False, None, 0)[1]:
            done.append(self._wait(self.pending))
            self.pending = None
        return done

    @staticmethod
    def _wait(pending) -> tuple:
        handle, steps, at = pending
        return handle.wait(), steps, at

    @staticmethod
    def flags(done: list) -> dict:
        """The stop flags (``bad``, ``preempt``, ``interrupt``) of the intervals ``done``, summed."""
        return {k: sum(sums[k] for sums, _, _ in done) for k in ("bad", "preempt", "interrupt")}


class _PendingSums:
    """``Interval.reduce_start``'s handle: ``wait()`` returns what ``Interval.reduce`` returns."""

    def __init__(self, handles: list, mine: dict):
        self.handles, self.mine = handles, mine

    def wait(self) -> dict:
        sums = self.handles[0].wait()
        if len(self.handles) > 1:
            sums = dict(sums, stale_max=self.handles[1].wait()["m"])
        return dict(sums, **self.mine)


def save(job: Job, comm, out: Reporter, reason: str, tree: dict | None = None, replicated=None, weights=None,
         background: bool = False) -> None:
    """Collective: drain, then checkpoint every rank's state (``tree`` and its ``replicated`` paths,
    default the state now; ``weights``: the model to evaluate when it is not the state's ``W``).
    ``background``: return once the state is copied into host memory; a thread writes it and a
    later sync point commits it (``ssdmpi/checkpoint/writer.py``). Otherwise it is written and
    committed before this returns. Each commit is logged (``committed``)."""
    cfg, algo, state, E = job.cfg, job.algo, job.state, job.E
    algo.drain()
    if tree is None:
        tree, replicated = state.state_dict(copy=False), state.replicated()
    if weights is None and "algo/W" not in replicated:
        weights = algo.global_weights()
    meta = {"epoch": state.step / E, "stage": shown_stage(algo), "model": cfg.model,
            "num_params": int(job.model.params.size),
            "dataset": job.dataset.name, "algo": cfg.algo, "reason": reason, "config": cfg.to_dict(),
            "ssdmpi_version": __version__, "test_acc": state.last_eval.get("test_acc"), "workers": job.workers,
            "global_batch": cfg.batch_size * job.workers,
            "input_shape": list(job.model.input_shape), "num_classes": int(job.dataset.num_classes),
            "normalisation": normalisation_record(job.dataset)}
    if job.context is not None:
        meta["val_loss"] = state.last_eval.get("val_loss")
    for record in job.checkpoints.save(comm, state.step, meta, tree, replicated, weights, background):
        committed(job, out, record)


def committed(job: Job, out: Reporter, record: dict) -> None:
    """A checkpoint was committed: its ``checkpoint`` metrics record; it is the run's newest."""
    out.write(record)
    job.last_checkpoint = record["path"]


def evaluate_now(job: Job, out: Reporter) -> dict:
    """Collective: drain, evaluate on the test split, log and show the result (one line); return it."""
    t0 = time.monotonic()
    job.algo.drain()
    result = job.evaluator()
    step, E, state = job.state.step, job.E, job.state
    job.checkpoints.evaluated(step, result)       # a checkpoint of this step records it (and may be the best)
    tokens = {"tokens": tokens_seen(job, step)} if job.context is not None else {}
    out.write({"kind": "eval", "step": step, "epoch": step / E, "stage": shown_stage(job.algo), "time": state.time_s(),
               "train_s": state.train_s(), **tokens, "eval_s": time.monotonic() - t0, **result})
    width = len(str(job.total_steps))
    out.message(f"eval  step {step:>{width}}/{job.total_steps}  epoch {step / E:.2f}  {eval_text(result)}")
    return result


def eval_text(result: dict) -> str:
    """An evaluation as the display shows it: a classifier's test accuracy and loss, a language
    model's validation loss and perplexity; rank 0's local model ``L`` after, when evaluated."""
    if "val_loss" in result:
        text = f"val loss {result['val_loss']:.4f}  ppl {result['val_ppl']:.2f}"
        if "val_loss_local" in result:
            text += f"  (rank 0's local model L: val loss {result['val_loss_local']:.4f})"
        return text
    text = f"test acc {result['test_acc']:.2%}  loss {result['test_loss']:.4f}"
    if "test_acc_local" in result:
        text += f"  (rank 0's local model L: {result['test_acc_local']:.2%})"
    return text
