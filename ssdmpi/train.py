"""``ssdmpi train``: data-parallel training with SSD-SGD, SSGD, OD-SGD or local SGD.

Reads top to bottom like nanoGPT's train.py: ``run`` resolves the configuration
(``ssdmpi/run_setup.py``), sets up (backend, communicator, data, model, algorithm, resume)
with every resource in one ``ExitStack``, runs the loop (``train``, one page) and ends
(``finish``: final checkpoint, evaluation, summary). Every rank runs this same code; rank 0
alone talks to the user and writes files (``Reporter``). The state a checkpoint holds is
``ssdmpi/training_state.py``'s; evaluation is ``ssdmpi/evaluate.py``'s.

Run directory (``--run-dir``, default ``runs/<timestamp>-<algo>``)::

    config.yaml      the resolved configuration (feed it back with --config)
    metrics.jsonl    one JSON object per logged step and per evaluation (ssdmpi/metrics.py)
    checkpoints/     ckpt-<step>.h5, the newest --keep-checkpoints of them (ssdmpi/checkpoint/)
    summary.txt      the human summary, also printed at the end; summary.json for scripts

When things happen (``t`` = iterations done, ``E`` = steps per epoch):

* every ``--log-every`` steps, at each epoch's end and at ``--checkpoint-every`` steps,
  the ranks synchronise once over the control communicator: metrics are summed, and the
  ranks agree on signals and on divergence. This is the only extra synchronisation the
  trainer adds; with ``--log-every 10`` a signal is acted on within 10 steps;
* at each epoch's end (``t % E == 0``) and every ``--checkpoint-every`` steps: checkpoint
  (after ``algo.drain()``, which completes the request in flight without changing the
  trajectory);
* every ``--eval-every`` epochs and at the end: evaluation of the global model ``W`` (and,
  in the delay stage, of rank 0's local model ``L``) on the test split, sharded across the
  ranks, with rank 0's BatchNorm statistics;
* at the end: ``algo.finalize()`` (``W`` gets every gradient communicated and the partial
  period), evaluation, the final checkpoint (the training state before finalize, so that
  training longer continues bit for bit, and the finalized ``W`` as its model), ``summary.txt``.

Exit codes: 0 done; 2 bad input (one line); 3 diverged (a non-finite loss or weights: the
run stops at once, keeping the last good checkpoint); 85 checkpointed on SIGUSR1/SIGTERM
or ``--stop-at-step``, "requeue me" (resume with ``--resume auto``); 130 checkpointed
after Ctrl-C (SIGINT; a second Ctrl-C aborts at once); 1 anything else (the whole job is
aborted, naming the failing rank). Signal handlers only set a flag; the ranks act on it
together at the next synchronisation point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import time

from ssdmpi.config import add_arguments as _add_config_arguments
from ssdmpi.errors import REQUEUE_EXIT

DIVERGED_EXIT = 3
INTERRUPT_EXIT = 130


EPILOG = """\
settings: dataclass defaults < --preset (default: default) < --config FILE < flags.
run directory: config.yaml, metrics.jsonl, checkpoints/ckpt-<step>.h5, summary.txt/.json.
exit codes: 0 done; 2 bad input; 3 diverged (last good checkpoint kept);
  85 checkpointed on SIGUSR1/SIGTERM or --stop-at-step, requeue me (--resume auto);
  130 checkpointed after Ctrl-C; 1 anything else (the whole job is aborted)."""


def add_arguments(parser) -> None:
    import argparse

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    _add_config_arguments(parser)


class Stop:
    """The signal flags: handlers set them, the loop reads them at synchronisation points.

    A context manager: entering installs the handlers, leaving restores the previous ones.
    """

    def __init__(self):
        self.preempt = 0      # SIGUSR1 / SIGTERM seen: checkpoint, exit 85
        self.interrupt = 0    # SIGINT seen: checkpoint, exit 130
        self.previous = {}

    def __enter__(self) -> Stop:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            try:
                self.previous[sig] = signal.signal(sig, self._handler)
            except (ValueError, OSError):   # not the main thread, or no such signal here
                pass
        return self

    def _handler(self, signum, frame):
        if signum == signal.SIGINT:
            if self.interrupt:     # the second Ctrl-C: stop now, no checkpoint
                raise KeyboardInterrupt
            self.interrupt = 1
        else:
            self.preempt = 1

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}


def _say(rank: int, text: str, file=None) -> None:
    if rank == 0:
        print(text, file=file or sys.stdout, flush=True)


# --- ssdmpi train ------------------------------------------------------------------------------

def run(args) -> int:
    """``ssdmpi train``. Every resource (signal handlers, communicator, loader, metrics files)
    is entered into one ExitStack, which frees it on every exit path. The signal handlers go
    in first, so that a preemption signal arriving during setup is acted on at the first
    synchronisation point instead of killing the rank."""
    from ssdmpi import backend, run_setup
    from ssdmpi import config as configuration
    from ssdmpi.comm import node, world
    from ssdmpi.comm.communicator import Communicator

    with contextlib.ExitStack() as resources:
        stop = resources.enter_context(Stop())
        # 1. Configuration: rank 0 reads the files (config, the checkpoint to resume) and
        #    resolves; every rank gets the same TrainConfig.
        _, size = world.rank_and_size()
        cfg, soft, ckpt_path, ckpt_meta = world.on_root(lambda: run_setup.configure(args, size))
        # 2. Setup: this rank's threads, GPU and backend (comm/node.py), communicator, data, model,
        #    algorithm, loader; every rank checks that all agree. Resume: rank 0 reads the
        #    checkpoint and sends every rank its state.
        placement = world.agree(lambda: node.place(node.discover(), cfg.device, cfg.threads, cfg.gpu_id))
        xp = backend.get_xp()
        comm = resources.enter_context(Communicator(**configuration.communicator_options(cfg)))
        job = setup(cfg, soft, ckpt_meta, comm, xp, resources)
        job.placement = placement
        if ckpt_path is not None:
            resume(job, comm, ckpt_path)
        out = resources.enter_context(Reporter(job, comm, ckpt_path, ckpt_meta))
        # 3. The loop, then 4. the end.
        code, reason = train(job, comm, out, stop)
        return finish(job, comm, out, code, reason)


@dataclasses.dataclass
class Job:
    """What one run trains, built by ``setup`` (the same on every rank but for its shard)."""

    cfg: object              # the resolved TrainConfig
    algo_cfg: object         # its AlgoConfig (steps, not epochs)
    dataset: object
    model: object
    loader: object
    algo: object
    state: object            # a TrainingState over model, algo and loader
    evaluator: object
    E: int                   # steps per epoch
    total_steps: int
    workers: int             # ranks that train on data (all but asgd's servers, which have no loader)
    last_checkpoint: str | None = None   # the newest checkpoint of this run, or the one it resumed from
    placement: object = None             # this rank's threads and GPU, and why (comm/node.py)


def setup(cfg, soft: set, ckpt_meta, comm, xp, resources) -> Job:
    """Collective: build the run's objects (model seeded, rank 0's weights broadcast); a
    ``UserError`` on any rank is raised on every rank; the loader is closed by ``resources``."""
    import numpy as np

    from ssdmpi import backend
    from ssdmpi import config as configuration
    from ssdmpi.algos import build_algorithm
    from ssdmpi.data import ShardedLoader, load_dataset
    from ssdmpi.evaluate import Evaluator
    from ssdmpi.nn import build_model
    from ssdmpi.training_state import TrainingState

    size = comm.size
    workers = comm.agree(lambda: configuration.data_ranks(cfg, size))   # asgd: the servers load no data
    dataset = comm.agree(lambda: load_dataset(cfg.dataset, cfg.data_path))
    options = {"widths": tuple(cfg.widths)} if cfg.widths else {}
    model = comm.agree(lambda: build_model(cfg.model, dataset.input_shape, dataset.num_classes, xp=xp,
                                           dtype=np.dtype(cfg.dtype), seed=cfg.seed, **options))
    comm.broadcast(model.params, root=0)
    loader = comm.agree(lambda: None if comm.rank >= workers else ShardedLoader(
        dataset.train_x, dataset.train_y, cfg.batch_size, comm.rank, workers, seed=cfg.seed,
        augment=None if cfg.augment == "none" else cfg.augment, prefetch=backend.device() == "gpu"))
    if loader is not None:
        resources.enter_context(loader)      # closes its prefetch thread
    E = loader.steps_per_epoch if workers == size else comm.broadcast_object(
        loader and loader.steps_per_epoch, root=0)
    total_steps = cfg.total_steps(E)
    algo_cfg = comm.agree(lambda: configuration.algo_config(cfg, soft, E, total_steps, size))
    cfg = configuration.resolved_settings(cfg, algo_cfg)
    if ckpt_meta is not None:
        comm.agree(lambda: configuration.check_resume(ckpt_meta.get("config", {}), cfg))
    algo = comm.agree(lambda: build_algorithm(algo_cfg, model, comm))
    comm.check_agreement(dict(algo.signature(), **{
        "train.dataset": dataset.name, "train.samples": len(dataset.train_x), "train.test_samples": len(dataset.test_x),
        "train.batch_size": cfg.batch_size, "train.seed": cfg.seed, "train.steps_per_epoch": E,
        "train.total_steps": total_steps, "train.model": cfg.model}))
    return Job(cfg=cfg, algo_cfg=algo_cfg, dataset=dataset, model=model, loader=loader, algo=algo,
               state=TrainingState(model, algo, loader), evaluator=Evaluator(comm, model, algo, dataset),
               E=E, total_steps=total_steps, workers=workers)


def resume(job: Job, comm, ckpt_path: str) -> None:
    """Collective: every rank's state from the checkpoint rank 0 verified."""
    from ssdmpi import checkpoint

    meta, tree, _ = checkpoint.load_collective(comm, ckpt_path)
    comm.agree(lambda: checkpoint.check_compatible(meta, comm.size, job.cfg.model, int(job.model.params.size)))
    comm.agree(lambda: job.state.load_state_dict(tree))
    job.state.check_consistent(ckpt_path)
    job.last_checkpoint = ckpt_path


# --- the loop ----------------------------------------------------------------------------------

def train(job: Job, comm, out: Reporter, stop: Stop) -> tuple[int, str | None]:
    """Collective: train until the last step or an early stop; return ``(exit code, why it
    stopped early)``, ``(0, None)`` when every step ran. Each iteration: this rank's batch, one
    algorithm step. At sync points the ranks sum their interval metrics and agree on signals
    and divergence; checkpoints and evaluations happen there too."""
    import numpy as np

    from ssdmpi import backend

    cfg, model, algo, loader, state = job.cfg, job.model, job.algo, job.loader, job.state
    state.start_clock()
    comm.stats.reset()
    interval = Interval()
    with np.errstate(over="ignore", invalid="ignore"):   # non-finite values are detected, not warned about
        while state.step < job.total_steps:
            if loader is None:              # an asgd server: it serves the workers' pushes, no loss
                algo.step(None, None)
            else:
                xb, yb = loader.next_batch()
                if xb.dtype != model.dtype:     # --dtype float64 (the loader yields float32)
                    xb = xb.astype(model.dtype)
                interval.add(float(algo.step(backend.to_device(xb), backend.to_device(yb))))
            state.step += 1
            out.progress.advance(state.step)
            due = Due(cfg, state.step, job.E, job.total_steps)
            if not due.sync:
                continue

            # -- synchronisation point: metrics, signals and divergence agreed by all ranks at once
            sums = interval.reduce(comm, stop, algo)
            log_interval(job, comm, out, sums, interval.steps)
            code, reason = stop_verdict(sums, due.planned_stop, cfg.stop_at_step, state.step)
            if code == DIVERGED_EXIT:       # a non-finite loss: stop at once, keep the last good checkpoint
                return code, reason
            if due.checkpoint or reason:
                if comm.any_true(not _finite(algo.xp, algo.global_weights(), algo.local_weights())):
                    return DIVERGED_EXIT, f"diverged: non-finite weights at step {state.step}"
                save(job, comm, out, "signal" if reason else "epoch" if due.epoch_end else "periodic")
            if reason:
                return code, reason
            if due.evaluate:
                state.last_eval = evaluate_now(job, out)
            interval.reset()   # after the checkpoint and evaluation: their time is not step time
    return 0, None


class Due:
    """What is due after step ``step``: is it a synchronisation point, and what happens there.

    Sync points: every ``--log-every`` steps, at checkpoints, at ``--stop-at-step`` and at the
    last step. Checkpoints: each epoch's end and every ``--checkpoint-every`` steps.
    Evaluation: every ``--eval-every`` epochs (the last one is ``finish``'s).
    """

    __slots__ = ("epoch_end", "checkpoint", "planned_stop", "sync", "evaluate")

    def __init__(self, cfg, step: int, E: int, total_steps: int):
        self.epoch_end = step % E == 0
        self.checkpoint = bool(self.epoch_end or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0))
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

    def add(self, loss: float) -> None:
        self.steps += 1
        if math.isfinite(loss):
            self.loss += loss
        else:
            self.bad += 1

    def reduce(self, comm, stop: Stop, algo) -> dict:
        """Collective: sums over ranks of the interval's numbers, the signal flags and the
        communication stats (one allreduce of a few float64 over the control communicator;
        asgd adds its staleness, and one more allreduce for its maximum). Ranks without
        training steps (asgd's servers) add no times or bytes: per-step means are the workers'."""
        c = comm.stats.snapshot_and_reset()
        stale = algo.interval_staleness() if hasattr(algo, "interval_staleness") else {}
        wall = time.monotonic() - self.t0
        mine = 1.0 if self.steps else 0.0    # per-step means are over the ranks that take steps
        sums = comm.allreduce_scalars({
            "preempt": stop.preempt, "interrupt": stop.interrupt, "bad": self.bad, "loss": self.loss,
            "steps": self.steps, "wall": wall * mine, "inflight_s": c["inflight_s"] * mine,
            "wait_s": c["wait_s"] * mine, "bytes_sent": c["bytes_sent"] * mine,
            **{k: v for k, v in stale.items() if k != "stale_max"}}, op="sum")
        if stale:
            sums["stale_max"] = comm.allreduce_scalars({"m": stale["stale_max"]}, op="max")["m"]
        sums["my_steps"], sums["my_wall"] = self.steps, wall
        return sums


def step_record(sums: dict, global_batch: int) -> dict:
    """The per-step means of a ``kind: step`` metrics record (see ssdmpi/metrics.py) from ``Interval.reduce``.

    Times and bytes are per step, averaged over ranks; ``compute_s`` is the step time not
    spent blocked on communication; ``samples_per_s`` counts all ranks (rank 0's clock).
    """
    per = max(1.0, sums["steps"])   # rank-steps in the interval
    step_s = sums["wall"] / per
    good = sums["steps"] - sums["bad"]
    stale = ({"staleness_mean": sums["stale_sum"] / sums["stale_n"] if sums["stale_n"] else 0.0,
              "staleness_max": int(sums["stale_max"])} if "stale_n" in sums else {})
    return {**stale, "loss": sums["loss"] / good if good > 0 else None,
            "samples_per_s": sums["my_steps"] * global_batch / sums["my_wall"] if sums["my_wall"] > 0 else None,
            "step_s": step_s, "compute_s": step_s - sums["wait_s"] / per,
            "inflight_s": sums["inflight_s"] / per, "wait_s": sums["wait_s"] / per,
            "bytes_sent": sums["bytes_sent"] / per,
            "overlap": min(1.0, max(0.0, 1 - sums["wait_s"] / sums["inflight_s"])) if sums["inflight_s"] > 0 else 0.0}


def log_interval(job: Job, comm, out: Reporter, sums: dict, steps: int) -> None:
    """Record the interval just reduced (``steps`` of this rank's): the ``step`` metrics record,
    the running totals, the display."""
    algo, state, step, E = job.algo, job.state, job.state.step, job.E
    record = {"kind": "step", "step": step, "epoch": step / E, "stage": algo.stage, "time": state.time_s(),
              "lr": algo.lr_global, "lr_local": algo.lr_local, **step_record(sums, job.cfg.batch_size * job.workers)}
    for key in ("compute_s", "inflight_s", "wait_s", "bytes_sent"):
        state.totals[key] += record[key] * steps
    state.totals["steps"] += steps
    state.totals["wall"] += sums["my_wall"]
    record["train_s"] = state.train_s()
    out.write(record)
    out.progress.update(step, {"epoch": f"{step / E:.2f}", "stage": algo.stage, "loss": record["loss"],
                               "lr": record["lr"], "samples/s": round(record["samples_per_s"] or 0),
                               "acc": state.last_eval.get("test_acc")})


def save(job: Job, comm, out: Reporter, reason: str, tree: dict | None = None) -> str:
    """Collective: drain, then write every rank's state (``tree``, default the state now) and
    the global model into one checkpoint file; return its path."""
    from ssdmpi import __version__, checkpoint

    cfg, algo, state, E = job.cfg, job.algo, job.state, job.E
    algo.drain()
    tree = state.state_dict() if tree is None else tree
    shared = state.shared(tree) if comm.rank == 0 else None
    meta = {"epoch": state.step / E, "stage": algo.stage, "model": cfg.model, "num_params": int(job.model.params.size),
            "dataset": job.dataset.name, "algo": cfg.algo, "reason": reason, "config": cfg.to_dict(),
            "ssdmpi_version": __version__, "test_acc": state.last_eval.get("test_acc")}
    path = checkpoint.save_collective(comm, os.path.join(cfg.run_dir, "checkpoints"), state.step, meta, tree, shared,
                                      keep=cfg.keep_checkpoints)
    out.write({"kind": "checkpoint", "step": state.step, "epoch": state.step / E, "path": path, "reason": reason})
    job.last_checkpoint = path
    return path


def evaluate_now(job: Job, out: Reporter) -> dict:
    """Collective: drain, evaluate on the test split, log and show the result; return it."""
    job.algo.drain()
    result = job.evaluator()
    step, E, state = job.state.step, job.E, job.state
    out.write({"kind": "eval", "step": step, "epoch": step / E, "stage": job.algo.stage, "time": state.time_s(),
               "train_s": state.train_s(), **result})
    text = f"eval  step {step}  epoch {step / E:.2f}  test acc {result['test_acc']:.2%}  loss {result['test_loss']:.4f}"
    if "test_acc_local" in result:
        text += f"  (rank 0's local model: {result['test_acc_local']:.2%})"
    out.message(text)
    return result


# --- the end -----------------------------------------------------------------------------------

def finish(job: Job, comm, out: Reporter, code: int, reason: str | None) -> int:
    """Collective: after an early stop, say why and how to continue; after the last step,
    every communicated gradient into W, the final checkpoint, evaluation and summary."""
    run_time = job.state.time_s()
    out.progress.close()
    if code == DIVERGED_EXIT:
        out.write({"kind": "stop", "step": job.state.step, "reason": reason, "exit_code": code})
        where = (f"the last good checkpoint is {job.last_checkpoint}" if job.last_checkpoint
                 else "no checkpoint was written")
        _say(comm.rank, f"ssdmpi: error: training {reason}; {where}. Lower --lr, lengthen the warm-up "
                        "or check the data", file=sys.stderr)
        return code
    if reason:
        out.write({"kind": "stop", "step": job.state.step, "reason": reason, "exit_code": code,
                   "checkpoint": job.last_checkpoint})
        _say(comm.rank, f"ssdmpi train: stopped at step {job.state.step} ({reason}); checkpoint "
                        f"{job.last_checkpoint}. Continue with: ssdmpi train --run-dir {job.cfg.run_dir} "
                        f"--resume auto (exit code {code})")
        return code
    # The final checkpoint holds every rank's state as it stands now, so that training longer
    # (--resume auto with more epochs) continues bit for bit as if the run had never stopped,
    # and, as its model, W after finalize: every communicated sum and the partial period
    # applied. That W is what the final evaluation (recorded in the checkpoint) measures.
    job.algo.drain()
    tree = job.state.state_dict()         # host copies: finalize does not touch them
    job.algo.finalize()
    job.state.last_eval = tree["trainer"]["last_eval"] = evaluate_now(job, out)
    save(job, comm, out, "final", tree)
    if comm.rank == 0:
        _summary(job, comm.size, run_time)
    return 0


def _summary(job: Job, size: int, run_time: float) -> None:
    """Rank 0: write summary.txt/.json and print the summary."""
    from ssdmpi.metrics import write_summary

    cfg, state = job.cfg, job.state
    totals, steps = state.totals, max(1, state.totals["steps"])
    summary = {"status": "done", "algo": cfg.algo, "world_size": size, "model": cfg.model,
               "num_params": int(job.model.params.size), "dataset": job.dataset.name, "step": state.step,
               "epoch": state.step / job.E, "time": run_time, "stage": job.algo.stage,
               "samples_per_s": (totals["steps"] * cfg.batch_size * job.workers / totals["wall"]
                                 if totals["wall"] else 0.0),
               **state.last_eval,
               **({k: totals[k] / steps for k in ("compute_s", "inflight_s", "wait_s", "bytes_sent")}
                  if totals["steps"] else {}),
               "checkpoint": job.last_checkpoint, "run_dir": cfg.run_dir, "placement": job.placement.describe(),
               "config": cfg.to_dict()}
    text, _ = write_summary(cfg.run_dir, summary)
    print(text, flush=True)


# --- what rank 0 tells the user ------------------------------------------------------------------

class Reporter:
    """Rank 0's side of a run: ``config.yaml``, ``metrics.jsonl`` (``write``), the progress
    display (``progress``, ``message``). Other ranks get a silent one. A context manager:
    leaving closes the display and the metrics file."""

    def __init__(self, job: Job, comm, ckpt_path: str | None, ckpt_meta: dict | None):
        from ssdmpi import __version__, backend, run_setup
        from ssdmpi.metrics import MetricsLog, Progress, atomic_write, launcher_on_terminal

        cfg, step = job.cfg, job.state.step
        self.log = None
        if comm.rank == 0:
            metrics_path = os.path.join(cfg.run_dir, "metrics.jsonl")
            if ckpt_path is not None:
                run_setup.trim_metrics(metrics_path, step)
            atomic_write(os.path.join(cfg.run_dir, "config.yaml"),
                         cfg.to_yaml() + f"# rank 0 ran with: {job.placement.describe()}\n")
            self.log = MetricsLog(metrics_path)
            self.log.write({"kind": "start", "step": step, "time": job.state.elapsed0, "world_size": comm.size,
                            "resumed_from": ckpt_path, "version": __version__, "backend": backend.reason(),
                            "progress": comm.strategy, "steps_per_epoch": job.E, "total_steps": job.total_steps,
                            "num_params": int(job.model.params.size), "placement": job.placement.as_dict(),
                            "config": cfg.to_dict()})
        show_bar = cfg.progress_bar and (sys.stderr.isatty() or launcher_on_terminal())
        self.progress = Progress(job.total_steps, initial=step, enabled=comm.rank == 0, bar=show_bar)
        self.message(_intro(job, comm.size, ckpt_path))
        self.message(f"rank 0: {job.placement.describe()}")
        if job.placement.shared_gpu:
            self.message(f"note: {job.placement.shared_gpu}")
        if ckpt_meta is not None:
            from ssdmpi.config import changed_settings

            changes = changed_settings(ckpt_meta.get("config", {}), cfg)
            if changes:
                self.message("settings changed since the checkpoint: " + ", ".join(changes))

    def write(self, record: dict) -> None:
        if self.log is not None:
            self.log.write(record)

    def message(self, text: str) -> None:
        self.progress.message(text)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        self.progress.close()
        if self.log is not None:
            self.log.close()


def _intro(job: Job, size: int, ckpt_path: str | None) -> str:
    """The line that opens a run: what trains on what, where."""
    from ssdmpi import backend

    cfg, algo_cfg, model, dataset = job.cfg, job.algo_cfg, job.model, job.dataset
    what = (f"{cfg.algo}" + (f" (k={algo_cfg.delay}, comm {algo_cfg.comm}, warm-up {algo_cfg.warmup_steps} steps)"
                             if cfg.algo in ("ssd", "odsgd") else f" (k={algo_cfg.delay})" if cfg.algo == "localsgd"
                             else f" ({algo_cfg.servers} server(s), {job.workers} worker(s), order "
                                  f"{algo_cfg.asgd_order}, warm-up {algo_cfg.warmup_steps} steps)"
                             if cfg.algo == "asgd" else ""))
    per = "worker" if job.workers < size else "rank"
    return (f"ssdmpi train: {what} on {size} ranks, model {cfg.model} ({model.params.size} parameters, "
            f"{cfg.dtype}), {dataset.name} ({len(dataset.train_x)} train / {len(dataset.test_x)} test), "
            f"batch {cfg.batch_size} per {per}, {job.total_steps} steps ({job.E} per epoch), {backend.device()}, "
            f"run directory {cfg.run_dir}"
            + (f"; resumed from {ckpt_path} at step {job.state.step}" if ckpt_path else ""))
