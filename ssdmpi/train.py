"""``ssdmpi train``: data-parallel training with SSD-SGD, SSGD, OD-SGD or local SGD.

Reads top to bottom like nanoGPT's train.py: configuration, setup (backend,
communicator, data, model, algorithm, resume), the loop, the final evaluation and the
summary. Every rank runs this same code; rank 0 alone talks to the user and writes files.

Run directory (``--run-dir``, default ``runs/<timestamp>-<algo>``)::

    config.yaml      the resolved configuration (feed it back with --config)
    metrics.jsonl    one JSON object per logged step and per evaluation (ssdmpi/metrics.py)
    checkpoints/     ckpt-<step>.h5, the newest --keep-checkpoints of them (ssdmpi/checkpoint.py)
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
* at the end: ``algo.finalize()`` (``W`` gets every gradient communicated), the final
  checkpoint, evaluation, ``summary.txt``.

Exit codes: 0 done; 2 bad input (one line); 3 diverged (a non-finite loss or weights: the
run stops at once, keeping the last good checkpoint); 85 checkpointed on SIGUSR1/SIGTERM
or ``--stop-at-step``, "requeue me" (resume with ``--resume auto``); 130 checkpointed
after Ctrl-C (SIGINT; a second Ctrl-C aborts at once); 1 anything else (the whole job is
aborted, naming the failing rank). Signal handlers only set a flag; the ranks act on it
together at the next synchronisation point.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time

from ssdmpi.config import add_arguments as _add_config_arguments
from ssdmpi.errors import REQUEUE_EXIT, UserError

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
    """The signal flags: handlers set them, the loop reads them at synchronisation points."""

    def __init__(self):
        self.preempt = 0      # SIGUSR1 / SIGTERM seen: checkpoint, exit 85
        self.interrupt = 0    # SIGINT seen: checkpoint, exit 130
        self.previous = {}

    def install(self) -> None:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            try:
                self.previous[sig] = signal.signal(sig, self._handler)
            except (ValueError, OSError):   # not the main thread, or no such signal here
                pass

    def _handler(self, signum, frame):
        if signum == signal.SIGINT:
            if self.interrupt:     # the second Ctrl-C: stop now, no checkpoint
                raise KeyboardInterrupt
            self.interrupt = 1
        else:
            self.preempt = 1

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}


def _say(rank: int, text: str, file=None) -> None:
    if rank == 0:
        print(text, file=file or sys.stdout, flush=True)


def _agree(comm, fn):
    """Run ``fn()`` on every rank; if it raised a ``UserError`` anywhere, raise it everywhere."""
    result, exc = None, None
    try:
        result = fn()
    except UserError as e:
        exc = e
    comm.agree_error(exc)
    return result


# --- run directory (rank 0) --------------------------------------------------------------------

def _prepare_run_dir(run_dir: str, resuming: bool, auto: bool = False) -> None:
    """Create ``run_dir`` and ``checkpoints/``; refuse to start a fresh run over an old one.

    ``auto`` (``--resume auto`` found no checkpoint): a ``metrics.jsonl`` left by an attempt
    that died before its first checkpoint is moved aside, not appended to.
    """
    from ssdmpi import checkpoint

    try:
        os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
        probe = os.path.join(run_dir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"cannot use run directory {run_dir}: {exc.strerror or exc}; "
                        "choose a writable one with --run-dir") from None
    if not resuming:
        old = checkpoint.list_checkpoints(os.path.join(run_dir, "checkpoints"))
        metrics = os.path.join(run_dir, "metrics.jsonl")
        if auto and not old and os.path.exists(metrics):
            os.replace(metrics, f"{metrics}.{time.strftime('%Y%m%d-%H%M%S')}.old")
        elif old or os.path.exists(metrics):
            raise UserError(f"run directory {run_dir} already holds a run; continue it with --resume auto "
                            "or choose another --run-dir")


def _trim_metrics(path: str, step: int) -> None:
    """Drop records of steps after ``step`` (logged before a crash, redone after resuming)."""
    import json

    from ssdmpi.metrics import atomic_write

    if not os.path.exists(path):
        return
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue   # a line cut short by the crash
            if record.get("step") is None or record["step"] <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
    atomic_write(path, "".join(kept))


# --- the pieces of one run ---------------------------------------------------------------------

def _algo_config(cfg, soft: set, steps_per_epoch: int, total_steps: int, world_size: int):
    """The ``AlgoConfig`` of ``cfg`` (epochs converted to steps), resolved.

    Algorithm settings that came from a preset (``soft``) and do not apply to the chosen
    algorithm are dropped (``--preset cifar10-resnet20 --algo ssgd`` is fine); the user's
    own inapplicable settings are errors.
    """
    from ssdmpi.algos import AlgoConfig
    from ssdmpi.config import parse_schedule

    def schedule(spec, unit_steps):
        kind, options = parse_schedule(spec)
        out = {"kind": kind}
        if kind == "step":
            out.update(every=max(1, round(options["every"] * unit_steps)), gamma=options["gamma"])
        elif kind == "multistep":
            out.update(milestones=[round(m * unit_steps) for m in options["milestones"]], gamma=options["gamma"])
        elif kind == "poly":
            out["power"] = options["power"]
        return out

    values = dict(
        algo=cfg.algo, delay=cfg.delay, warmup_steps=cfg.warmup_iterations(steps_per_epoch),
        comm=cfg.comm, period_rule=cfg.period_rule, local_update=cfg.local_update, lr=cfg.lr,
        lr_schedule=schedule(cfg.lr_schedule, steps_per_epoch),
        lr_warmup_steps=int(round(cfg.lr_warmup_epochs * steps_per_epoch)), total_steps=total_steps,
        local_lr=cfg.local_lr,
        local_lr_schedule=None if cfg.local_lr_schedule is None else schedule(cfg.local_lr_schedule, steps_per_epoch),
        momentum=cfg.momentum, weight_decay=cfg.weight_decay, glu_divisor=cfg.glu_divisor)
    droppable = [k for k in ("delay", "comm", "period_rule", "local_update", "local_lr", "local_lr_schedule",
                             "glu_divisor") if k in soft]
    try:
        return AlgoConfig(**values).validate(world_size)
    except UserError:
        if not droppable:
            raise
    for key in droppable:
        values[key] = None
        try:
            return AlgoConfig(**values).validate(world_size)
        except UserError:
            continue
    return AlgoConfig(**values).validate(world_size)   # raises the error about the user's own settings


def _resolved(cfg, algo_cfg):
    """``cfg`` with the algorithm's resolved defaults written in (what config.yaml records)."""
    import dataclasses

    out = dataclasses.replace(cfg)
    for key in ("delay", "comm", "period_rule", "local_update", "glu_divisor"):
        setattr(out, key, getattr(algo_cfg, key))
    if out.warmup_epochs is None:
        out.warmup_steps = int(algo_cfg.warmup_steps)
    return out


class Evaluator:
    """Test-split evaluation of ``W`` (and rank 0's ``L``) without disturbing the training state."""

    def __init__(self, comm, model, algo, dataset):
        self.comm, self.model, self.algo, self.dataset = comm, model, algo, dataset

    def __call__(self) -> dict:
        """Collective. ``{"test_acc", "test_loss"[, "test_acc_local", "test_loss_local"]}``."""
        import numpy as np

        from ssdmpi import backend
        from ssdmpi.evaluate import evaluate

        model, algo, control = self.model, self.algo, self.comm.control
        data = (self.dataset.test_x, self.dataset.test_y)
        own_params = model.params.copy()
        own_buffers = {k: v.copy() for k, v in model.buffers().items()}
        L = algo.local_weights()
        L = None if L is None else (L.copy() if L is not model.params else own_params)   # before params change
        try:
            if own_buffers and self.comm.size > 1:   # rank 0's BN statistics for everyone
                host = control.bcast({k: backend.to_host(v) for k, v in own_buffers.items()}, root=0)
                model.load_buffers({k: backend.to_device(v) for k, v in host.items()})
            W = algo.global_weights()
            if W is not model.params:
                model.params[...] = W
            loss, acc, _ = evaluate(model, *data, control)
            out = {"test_acc": acc, "test_loss": loss}
            if L is not None:
                host = backend.to_host(L).copy() if self.comm.rank == 0 else np.empty(L.shape, dtype=L.dtype)
                control.Bcast(host, root=0)
                model.params[...] = backend.to_device(host)
                loss, acc, _ = evaluate(model, *data, control)
                out.update(test_acc_local=acc, test_loss_local=loss)
        finally:
            model.params[...] = own_params
            if own_buffers:
                model.load_buffers(own_buffers)
        return out


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

    def reduce(self, comm, stop: "Stop") -> dict:
        """Collective: sums over ranks of the interval's numbers, the signal flags and the
        communication stats (one allreduce of a few float64 over the control communicator)."""
        c = comm.stats.snapshot_and_reset()
        sums = comm.allreduce_scalars({
            "preempt": stop.preempt, "interrupt": stop.interrupt, "bad": self.bad, "loss": self.loss,
            "steps": self.steps, "wall": time.monotonic() - self.t0, "inflight_s": c["inflight_s"],
            "wait_s": c["wait_s"], "bytes_sent": c["bytes_sent"]}, op="sum")
        sums["my_steps"], sums["my_wall"] = self.steps, time.monotonic() - self.t0
        return sums


def step_record(sums: dict, global_batch: int) -> dict:
    """The per-step means of a ``kind: step`` metrics record (see ssdmpi/metrics.py) from ``Interval.reduce``.

    Times and bytes are per step, averaged over ranks; ``compute_s`` is the step time not
    spent blocked on communication; ``samples_per_s`` counts all ranks (rank 0's clock).
    """
    per = max(1.0, sums["steps"])   # rank-steps in the interval
    step_s = sums["wall"] / per
    good = sums["steps"] - sums["bad"]
    return {"loss": sums["loss"] / good if good > 0 else None,
            "samples_per_s": sums["my_steps"] * global_batch / sums["my_wall"] if sums["my_wall"] > 0 else None,
            "step_s": step_s, "compute_s": step_s - sums["wait_s"] / per,
            "inflight_s": sums["inflight_s"] / per, "wait_s": sums["wait_s"] / per,
            "bytes_sent": sums["bytes_sent"] / per,
            "overlap": min(1.0, max(0.0, 1 - sums["wait_s"] / sums["inflight_s"])) if sums["inflight_s"] > 0 else 0.0}


def _finite(xp, *arrays) -> bool:
    return all(a is None or bool(xp.isfinite(a).all()) for a in arrays)


# --- ssdmpi train ------------------------------------------------------------------------------

def run(args) -> int:
    """``ssdmpi train``. Signal handlers go in first, so that a preemption signal arriving during
    setup is acted on at the first synchronisation point instead of killing the rank."""
    stop = Stop()
    stop.install()
    try:
        return _train(args, stop)
    finally:
        stop.restore()


def _train(args, stop: "Stop") -> int:
    import numpy as np
    from mpi4py import MPI

    from ssdmpi import __version__, backend, checkpoint
    from ssdmpi import config as configuration
    from ssdmpi.comm.agreement import on_root
    from ssdmpi.comm.communicator import Communicator
    from ssdmpi.metrics import MetricsLog, Progress, launcher_on_terminal, write_summary

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()

    # -------------------------------------------------------------------------------------
    # 1. Configuration. Rank 0 reads the files (config, the checkpoint to resume) and
    #    resolves; every rank gets the same TrainConfig.
    # -------------------------------------------------------------------------------------
    def configure():
        resume, ckpt_path, ckpt_meta = getattr(args, "resume", None), None, None
        if resume == "auto":
            if not args.run_dir:
                raise UserError("--resume auto needs --run-dir (the directory whose checkpoints to continue)")
            ckpt_path = checkpoint.select_resume(os.path.join(args.run_dir, "checkpoints"),
                                                 warn=lambda m: print(m, file=sys.stderr, flush=True))
        elif resume:
            ckpt_path = checkpoint.resolve_path(resume)
        if ckpt_path is not None:
            ckpt_meta = checkpoint.read_meta(ckpt_path)
            checkpoint.check_compatible(ckpt_meta, size, ckpt_meta.get("model"))
        cfg = configuration.resolve(args, None if ckpt_meta is None else ckpt_meta.get("config"))
        if cfg.run_dir is None or (ckpt_path is not None and not args.run_dir):
            if ckpt_path is not None and os.path.basename(os.path.dirname(os.path.abspath(ckpt_path))) == "checkpoints":
                cfg.run_dir = os.path.dirname(os.path.dirname(os.path.abspath(ckpt_path)))
            elif cfg.run_dir is None:
                cfg.run_dir = configuration.default_run_dir(cfg)
        soft = configuration.soft_settings(args, ckpt_meta is not None)
        _prepare_run_dir(cfg.run_dir, resuming=ckpt_path is not None, auto=resume == "auto")
        return cfg, soft, ckpt_path, ckpt_meta

    cfg, soft, ckpt_path, ckpt_meta = on_root(world, configure)

    # -------------------------------------------------------------------------------------
    # 2. Setup: backend, communicator, data, model (seeded; rank 0's weights broadcast),
    #    algorithm, loader; every rank checks that all agree.
    # -------------------------------------------------------------------------------------
    if cfg.widths is not None and cfg.model != "mlp" and "widths" in soft:
        cfg.widths = None      # the preset's mlp widths; this model has its own shape
    xp = _agree_world(world, lambda: backend.select(cfg.device))
    comm = Communicator(progress=cfg.progress, transport=cfg.transport, stall_timeout=cfg.stall_timeout)
    from ssdmpi.algos import build_algorithm
    from ssdmpi.data import ShardedLoader, load_dataset
    from ssdmpi.nn import build_model

    dataset = _agree(comm, lambda: load_dataset(cfg.dataset, cfg.data_path))
    options = {"widths": tuple(cfg.widths)} if cfg.widths else {}
    model = _agree(comm, lambda: build_model(cfg.model, dataset.input_shape, dataset.num_classes, xp=xp,
                                             dtype=np.dtype(cfg.dtype), seed=cfg.seed, **options))
    comm.broadcast(model.params, root=0)
    loader = _agree(comm, lambda: ShardedLoader(dataset.train_x, dataset.train_y, cfg.batch_size, rank, size,
                                                seed=cfg.seed, augment=None if cfg.augment == "none" else cfg.augment,
                                                prefetch=backend.device() == "gpu"))
    E = loader.steps_per_epoch
    total_steps = cfg.total_steps(E)
    algo_cfg = _agree(comm, lambda: _algo_config(cfg, soft, E, total_steps, size))
    cfg = _resolved(cfg, algo_cfg)
    if ckpt_meta is not None:
        _agree(comm, lambda: configuration.check_resume(ckpt_meta.get("config", {}), cfg))
    algo = _agree(comm, lambda: build_algorithm(algo_cfg, model, comm))
    comm.check_agreement(dict(algo.signature(), **{
        "train.dataset": dataset.name, "train.samples": len(dataset.train_x), "train.test_samples": len(dataset.test_x),
        "train.batch_size": cfg.batch_size, "train.seed": cfg.seed, "train.steps_per_epoch": E,
        "train.total_steps": total_steps, "train.model": cfg.model}))
    evaluator = Evaluator(comm, model, algo, dataset)

    # Resume: rank 0 reads the checkpoint and sends every rank its own state.
    step, elapsed, train_s0, last_eval, ckpt_written = 0, 0.0, 0.0, {}, ckpt_path
    if ckpt_path is not None:
        meta, state, _ = checkpoint.load_collective(comm.control, ckpt_path)
        _agree(comm, lambda: checkpoint.check_compatible(meta, size, cfg.model, int(model.params.size)))
        _agree(comm, lambda: algo.load_state_dict(state["algo"]))
        if state.get("model", {}).get("buffers"):
            model.load_buffers({k: backend.to_device(v) for k, v in state["model"]["buffers"].items()})
        _agree(comm, lambda: loader.load_state_dict(state["loader"]))
        trainer_state = state.get("trainer", {})
        step, elapsed = int(trainer_state.get("step", algo.t)), float(trainer_state.get("elapsed", 0.0))
        train_s0 = float(trainer_state.get("train_s", 0.0))
        last_eval = dict(trainer_state.get("last_eval") or {})
        if step != algo.t or step != loader.iteration:
            raise UserError(f"{ckpt_path} is inconsistent: trainer step {step}, algorithm t {algo.t}, "
                            f"loader position {loader.iteration}", collective=True)

    # Rank 0: the run directory's files, and the display.
    log = None
    if rank == 0:
        metrics_path = os.path.join(cfg.run_dir, "metrics.jsonl")
        if ckpt_path is not None:
            _trim_metrics(metrics_path, step)
        from ssdmpi.metrics import atomic_write

        atomic_write(os.path.join(cfg.run_dir, "config.yaml"), cfg.to_yaml())
        log = MetricsLog(metrics_path)
        log.write({"kind": "start", "step": step, "time": elapsed, "world_size": size, "resumed_from": ckpt_path,
                   "version": __version__, "backend": backend.reason(), "progress": comm.strategy,
                   "steps_per_epoch": E, "total_steps": total_steps, "num_params": int(model.params.size),
                   "config": cfg.to_dict()})
    show_bar = cfg.progress_bar and (sys.stderr.isatty() or launcher_on_terminal())
    progress = Progress(total_steps, initial=step, enabled=rank == 0, bar=show_bar)
    what = (f"{cfg.algo}" + (f" (k={algo_cfg.delay}, comm {algo_cfg.comm}, warm-up {algo_cfg.warmup_steps} steps)"
                             if cfg.algo in ("ssd", "odsgd") else f" (k={algo_cfg.delay})" if cfg.algo == "localsgd"
                             else ""))
    progress.message(f"ssdmpi train: {what} on {size} ranks, model {cfg.model} ({model.params.size} parameters, "
                     f"{cfg.dtype}), {dataset.name} ({len(dataset.train_x)} train / {len(dataset.test_x)} test), "
                     f"batch {cfg.batch_size} per rank, {total_steps} steps ({E} per epoch), {backend.device()}, "
                     f"run directory {cfg.run_dir}"
                     + (f"; resumed from {ckpt_path} at step {step}" if ckpt_path else ""))
    if ckpt_meta is not None:
        changes = configuration.changed_settings(ckpt_meta.get("config", {}), cfg)
        if changes:
            progress.message("settings changed since the checkpoint: " + ", ".join(changes))

    def save(reason: str) -> str:
        """Drain, then write every rank's state into one checkpoint file (collective)."""
        algo.drain()
        state = {"algo": algo.state_dict(),
                 "model": {"params": backend.to_host(model.params).copy(),
                           "buffers": {k: backend.to_host(v).copy() for k, v in model.buffers().items()}},
                 "loader": loader.state_dict(),
                 "trainer": {"step": step, "elapsed": elapsed + (time.monotonic() - t_start),
                             "train_s": train_s0 + totals["wall"],
                             "last_eval": last_eval}}
        shared = None
        if rank == 0:
            shared = {"model": {"global_weights": backend.to_host(algo.global_weights()).copy(),
                                "buffers": state["model"]["buffers"]}}
        meta = {"epoch": step / E, "stage": algo.stage, "model": cfg.model, "num_params": int(model.params.size),
                "dataset": dataset.name, "algo": cfg.algo, "reason": reason, "config": cfg.to_dict(),
                "ssdmpi_version": __version__, "test_acc": last_eval.get("test_acc")}
        path = checkpoint.save_collective(comm.control, os.path.join(cfg.run_dir, "checkpoints"), step, meta,
                                          state, shared, keep=cfg.keep_checkpoints)
        if log is not None:
            log.write({"kind": "checkpoint", "step": step, "epoch": step / E, "path": path, "reason": reason})
        return path

    def evaluate_now() -> dict:
        algo.drain()
        result = evaluator()
        record = {"kind": "eval", "step": step, "epoch": step / E, "stage": algo.stage,
                  "time": elapsed + (time.monotonic() - t_start), "train_s": train_s0 + totals["wall"], **result}
        if log is not None:
            log.write(record)
        text = f"eval  step {step}  epoch {step / E:.2f}  test acc {result['test_acc']:.2%}  loss {result['test_loss']:.4f}"
        if "test_acc_local" in result:
            text += f"  (rank 0's local model: {result['test_acc_local']:.2%})"
        progress.message(text)
        return result

    # -------------------------------------------------------------------------------------
    # 3. The loop. Each iteration: this rank's batch, one algorithm step. At sync points the
    #    ranks sum their interval metrics and agree on signals and divergence.
    # -------------------------------------------------------------------------------------
    t_start = time.monotonic()
    comm.stats.reset()
    interval = Interval()
    totals = {"steps": 0, "wall": 0.0, "compute_s": 0.0, "inflight_s": 0.0, "wait_s": 0.0, "bytes_sent": 0.0}
    exit_code, stop_reason = 0, None
    try:
        with np.errstate(over="ignore", invalid="ignore"):   # non-finite values are detected, not warned about
            while step < total_steps:
                xb, yb = loader.next_batch()
                if xb.dtype != model.dtype:     # --dtype float64 (the loader yields float32)
                    xb = xb.astype(model.dtype)
                loss = algo.step(backend.to_device(xb), backend.to_device(yb))
                step += 1
                interval.add(float(loss))
                progress.advance(step)

                epoch_end = step % E == 0
                checkpoint_due = epoch_end or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
                planned_stop = cfg.stop_at_step is not None and step == cfg.stop_at_step
                if not (step % cfg.log_every == 0 or checkpoint_due or planned_stop or step == total_steps):
                    continue

                # -- synchronisation point: metrics, signals and divergence agreed by all ranks at once
                sums = interval.reduce(comm, stop)
                record = {"kind": "step", "step": step, "epoch": step / E, "stage": algo.stage,
                          "time": elapsed + (time.monotonic() - t_start), "lr": algo.lr_global,
                          "lr_local": algo.lr_local, **step_record(sums, cfg.batch_size * size)}
                for key in ("compute_s", "inflight_s", "wait_s", "bytes_sent"):
                    totals[key] += record[key] * interval.steps
                totals["steps"] += interval.steps
                totals["wall"] += sums["my_wall"]
                record["train_s"] = train_s0 + totals["wall"]
                if log is not None:
                    log.write(record)
                progress.update(step, {"epoch": f"{step / E:.2f}", "stage": algo.stage, "loss": record["loss"],
                                       "lr": record["lr"], "samples/s": round(record["samples_per_s"] or 0),
                                       "acc": last_eval.get("test_acc")})

                if sums["bad"] > 0:        # divergence: stop at once, keep the last good checkpoint
                    stop_reason, exit_code = f"diverged: non-finite training loss by step {step}", DIVERGED_EXIT
                    break
                if sums["preempt"] > 0 or sums["interrupt"] > 0 or planned_stop:
                    # a preemption signal anywhere wins over Ctrl-C: the job should be requeued
                    exit_code = INTERRUPT_EXIT if sums["interrupt"] > 0 and not sums["preempt"] else REQUEUE_EXIT
                    stop_reason = ("SIGUSR1/SIGTERM" if sums["preempt"] > 0 else
                                   "Ctrl-C (SIGINT)" if sums["interrupt"] > 0 else f"--stop-at-step {cfg.stop_at_step}")
                if checkpoint_due or stop_reason:
                    if comm.any_true(not _finite(algo.xp, algo.global_weights(), algo.local_weights())):
                        stop_reason, exit_code = f"diverged: non-finite weights at step {step}", DIVERGED_EXIT
                        break
                    ckpt_written = save("signal" if stop_reason else "epoch" if epoch_end else "periodic")
                if stop_reason:
                    break
                if epoch_end and cfg.eval_every and (step // E) % cfg.eval_every == 0 and step < total_steps:
                    last_eval = evaluate_now()
                interval.reset()   # after the checkpoint and evaluation: their time is not step time
    finally:
        progress.close()

    run_time = elapsed + (time.monotonic() - t_start)
    if exit_code == DIVERGED_EXIT:
        if log is not None:
            log.write({"kind": "stop", "step": step, "reason": stop_reason, "exit_code": exit_code})
            log.close()
        where = f"the last good checkpoint is {ckpt_written}" if ckpt_written else "no checkpoint was written"
        _say(rank, f"ssdmpi: error: training {stop_reason}; {where}. Lower --lr, lengthen the warm-up "
                   "or check the data", file=sys.stderr)
        comm.free()
        return exit_code
    if stop_reason:
        if log is not None:
            log.write({"kind": "stop", "step": step, "reason": stop_reason, "exit_code": exit_code,
                       "checkpoint": ckpt_written})
            log.close()
        _say(rank, f"ssdmpi train: stopped at step {step} ({stop_reason}); checkpoint {ckpt_written}. "
                   f"Continue with: ssdmpi train --run-dir {cfg.run_dir} --resume auto "
                   f"(exit code {exit_code})")
        comm.free()
        return exit_code

    # -------------------------------------------------------------------------------------
    # 4. The end: every communicated gradient into W, final checkpoint, evaluation, summary.
    # -------------------------------------------------------------------------------------
    algo.finalize()
    ckpt_written = save("final")
    last_eval = evaluate_now()
    if rank == 0:
        steps = max(1, totals["steps"])
        summary = {"status": "done", "algo": cfg.algo, "world_size": size, "model": cfg.model,
                   "num_params": int(model.params.size), "dataset": dataset.name, "step": step, "epoch": step / E,
                   "time": run_time, "stage": algo.stage,
                   "samples_per_s": totals["steps"] * cfg.batch_size * size / totals["wall"] if totals["wall"] else 0.0,
                   **last_eval,
                   **({k: totals[k] / steps for k in ("compute_s", "inflight_s", "wait_s", "bytes_sent")}
                      if totals["steps"] else {}),
                   "checkpoint": ckpt_written, "run_dir": cfg.run_dir, "config": cfg.to_dict()}
        text, _ = write_summary(cfg.run_dir, summary)
        log.close()
        print(text, flush=True)
    comm.free()
    return 0


def _agree_world(world, fn):
    """Like ``_agree`` before the Communicator exists (plain COMM_WORLD)."""
    result, message = None, None
    try:
        result = fn()
    except UserError as exc:
        message = str(exc)
    messages = world.allgather(message)
    for r, m in enumerate(messages):
        if m is not None:
            raise UserError(m if r == 0 else f"rank {r}: {m}", collective=True)
    return result
