"""``ssdmpi train``: data-parallel training with SSD-SGD, SSGD, OD-SGD, local SGD or ASGD (the
command; ``ssdmpi.train(...)``, the Python API in ``ssdmpi/api.py``, runs the same ``run_job``).

Reads top to bottom like nanoGPT's train.py: ``run`` resolves the configuration
(``ssdmpi/run_setup.py``), sets up (backend, communicator, data, model, algorithm, resume)
with every resource in one ``ExitStack``, runs the loop (``ssdmpi/loop.py``) and ends
(``finish``: final checkpoint, evaluation, summary). Every rank runs this same code; rank 0
alone talks to the user and writes files (``ssdmpi/report.py``). The state a checkpoint holds is
``ssdmpi/training_state.py``'s; evaluation is ``ssdmpi/evaluate.py``'s.

Run directory (``--run-dir``, default ``runs/<timestamp>-<algo>``, then ``-2``, ``-3``, ... for runs
started in the same second)::

    config.yaml      the resolved configuration (--config reads it back for a new run; its run_dir is a comment)
    metrics.jsonl    one JSON object per logged step and per evaluation (ssdmpi/metrics.py)
    checkpoints/     ckpt-<step>/ (one file per rank and a manifest), the newest --keep-checkpoints
                     of them, and the links last and best (ssdmpi/checkpoint/)
    summary.txt      the human summary, also printed at the end; summary.json for scripts
    steps.csv        with --csv: the step records of metrics.jsonl as a table; evals.csv the eval records
    tensorboard/     with --tensorboard: TensorBoard event files (tensorboard --logdir RUN; ssdmpi/loggers.py)

When things happen (``t`` = iterations done, ``E`` = steps per epoch):

* every ``--log-every`` steps, at each epoch's end and at ``--checkpoint-every`` steps,
  the ranks synchronise once over the control communicator: metrics are summed, and the
  ranks agree on signals and on divergence. This is the only extra synchronisation the
  trainer adds; with ``--log-every 10`` a signal is acted on within 10 steps;
* at each epoch's end (``t % E == 0``) and every ``--checkpoint-every`` steps: checkpoint
  (after ``algo.drain()``, which completes the request in flight without changing the
  trajectory), written in the background and committed at a later sync point; a signal's
  and the final checkpoint are written before the run goes on or ends;
* every ``--eval-every`` epochs and at the end: evaluation of the global model ``W`` (and,
  in the delay stage, of rank 0's local model ``L``) on the test split, sharded across the
  ranks, with rank 0's BatchNorm statistics;
* at the end: ``algo.finalize()`` (``W`` gets every gradient communicated and the partial
  period), evaluation, the final checkpoint (the training state before finalize, so that
  training longer continues bit for bit, and the finalized ``W`` as its model), ``summary.txt``.

Exit codes: 0 done; 2 bad input (one line); 3 diverged (a non-finite loss or weights: the
run stops at once, keeping the last good checkpoint); 85 checkpointed on SIGUSR1/SIGTERM
or ``--stop-at-step``, "requeue me" (the line printed is the command that resumes it, with
``--resume auto``; on a finished run that only says it is complete); 130 checkpointed
after Ctrl-C (SIGINT; a second Ctrl-C aborts at once); 1 anything else (the whole job is
aborted, naming the failing rank). Signal handlers only set a flag; the ranks act on it
together at the next synchronisation point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import sys

from ssdmpi.config import add_arguments as _add_config_arguments
from ssdmpi.errors import DIVERGED_EXIT, INTERRUPT_EXIT, REQUEUE_EXIT, UserError  # noqa: F401 (re-exported)
from ssdmpi.loop import committed, evaluate_now, save, train
from ssdmpi.relaunch import resume_command
from ssdmpi.report import Reporter

EPILOG = """\
settings: dataclass defaults < --preset (default: default) < --config FILE < flags.
run directory: config.yaml, metrics.jsonl, checkpoints/ckpt-<step>/ (last, best), summary.txt/.json,
  steps.csv/evals.csv (--csv), tensorboard/ (--tensorboard).
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

    A context manager: entering installs the handlers, leaving restores the previous ones,
    except that ``exiting=True`` (the command line, whose process ends with the run) leaves
    SIGUSR1 ignored: a lead-time signal that arrives after the last step, while the process
    shuts down (MPI_Finalize, the interpreter's exit), has nothing left to checkpoint and must
    not kill the rank of a finished run (its job would fail with 138 instead of completing).
    """

    def __init__(self, exiting: bool = False):
        self.preempt = 0      # SIGUSR1 / SIGTERM seen: checkpoint, exit 85
        self.interrupt = 0    # SIGINT seen: checkpoint, exit 130
        self.exiting = exiting
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
            signal.signal(sig, signal.SIG_IGN if self.exiting and sig == signal.SIGUSR1 else handler)
        self.previous = {}


def _say(rank: int, text: str, file=None) -> None:
    if rank == 0:
        print(text, file=file or sys.stdout, flush=True)


# --- ssdmpi train ------------------------------------------------------------------------------

def run(args) -> int:
    """``ssdmpi train`` (``--print-config``: print the resolved settings, start nothing)."""
    if getattr(args, "print_config", False):
        from ssdmpi.run_setup import print_config

        return print_config(args)
    return run_job(args, command=True)[0]


def run_job(args, model=None, dataset=None, command: bool = False):
    """Collective: one run; ``(exit code, Job)``. ``model``/``dataset`` (the Python API,
    ``ssdmpi/api.py``) replace what ``cfg.model``/``cfg.dataset`` name. ``command``: the
    ``ssdmpi train`` command runs this job (its process ends after it, ``Stop``; the hints it
    prints are command lines), not a script through the Python API.

    Every resource (signal handlers, communicator, loader, metrics files) is entered into
    one ExitStack, which frees it on every exit path. The signal handlers go in first, so
    that a preemption signal arriving during setup is acted on at the first
    synchronisation point instead of killing the rank. A start that fails before the loop
    removes the run directories it created (``run_setup.remove_created``)."""
    from ssdmpi import backend, run_setup
    from ssdmpi import config as configuration
    from ssdmpi.comm import node, world
    from ssdmpi.comm.communicator import Communicator

    with contextlib.ExitStack() as resources:
        stop = resources.enter_context(Stop(exiting=command))
        # 1. Configuration: rank 0 reads the files (config, the checkpoint to resume) and
        #    resolves; every rank gets the same TrainConfig.
        rank, size = world.rank_and_size()
        cfg, soft, ckpt_path, ckpt_meta, created = world.on_root(lambda: run_setup.configure(args, size))
        # 2. Setup: this rank's threads, GPU and backend (comm/node.py), communicator, data, model,
        #    algorithm, loader; every rank checks that all agree. Resume: rank 0 reads the
        #    checkpoint and sends every rank its state.
        try:
            placement = world.agree(lambda: node.place(node.discover(), cfg.device, cfg.threads, cfg.gpu_id))
            xp = backend.get_xp()
            comm = resources.enter_context(Communicator(**configuration.communicator_options(cfg)))
            job = setup(cfg, soft, ckpt_meta, comm, xp, resources, model=model, dataset=dataset)
            job.placement, job.command = placement, command
            if ckpt_path is not None:
                resume(job, comm, ckpt_path, ckpt_meta)
        except BaseException:
            if rank == 0:
                run_setup.remove_created(created)
            raise
        if ckpt_meta is not None and ckpt_meta.get("reason") == "final" and job.state.step >= job.total_steps:
            return complete(job, comm), job
        out = resources.enter_context(Reporter(job, comm, ckpt_path, ckpt_meta))
        if job.resize is not None:
            out.write(job.resize)
            out.message(f"resumed on another number of ranks ({job.resize['from_ranks']} -> {job.resize['to_ranks']}): "
                        f"{job.resize['merged']}")
        # 3. The loop, then 4. the end.
        code, reason = train(job, comm, out, stop)
        return finish(job, comm, out, code, reason), job


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
    checkpoints: object = None           # this rank's CheckpointWriter (ssdmpi/checkpoint/writer.py)
    last_checkpoint: str | None = None   # the newest checkpoint of this run, or the one it resumed from
    placement: object = None             # this rank's threads and GPU, and why (comm/node.py)
    command: bool = False                # run by the ssdmpi train command (else a script, the Python API)
    resize: dict | None = None           # the ``resize`` record when resumed on another number of ranks


def setup(cfg, soft: set, ckpt_meta, comm, xp, resources, model=None, dataset=None) -> Job:
    """Collective: build the run's objects (model seeded, rank 0's weights broadcast); a
    ``UserError`` on any rank is raised on every rank; the loader is closed by ``resources``.
    ``model`` (a factory or a ``Model``) and ``dataset`` (a ``Dataset``) come from the Python
    API; None: ``cfg.model`` and ``cfg.dataset`` name them."""
    import os

    import numpy as np

    from ssdmpi import backend
    from ssdmpi import config as configuration
    from ssdmpi.algos import build_algorithm
    from ssdmpi.checkpoint import CheckpointWriter
    from ssdmpi.data import ShardedLoader, load_dataset
    from ssdmpi.evaluate import Evaluator
    from ssdmpi.nn import build_model
    from ssdmpi.training_state import TrainingState

    size = comm.size
    workers = comm.agree(lambda: configuration.data_ranks(cfg, size, soft))   # asgd: the servers load no data
    dataset = comm.agree(lambda: load_dataset(cfg.dataset, cfg.data_path) if dataset is None else dataset)
    if cfg.augment != "none" and len(dataset.input_shape) != 3:
        raise UserError(f"--augment {cfg.augment} needs images; {dataset.name} has flat feature vectors "
                        f"of shape {dataset.input_shape}: use --augment none", collective=True)
    options = {"widths": tuple(cfg.widths)} if cfg.widths else {}
    model = comm.agree(lambda: build_model(cfg.model if model is None else model, dataset.input_shape,
                                           dataset.num_classes, xp=xp, dtype=np.dtype(cfg.dtype), seed=cfg.seed,
                                           **options))
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
    writer = resources.enter_context(CheckpointWriter(os.path.join(cfg.run_dir, "checkpoints"), cfg.keep_checkpoints))
    return Job(cfg=cfg, algo_cfg=algo_cfg, dataset=dataset, model=model, loader=loader, algo=algo,
               state=TrainingState(model, algo, loader), evaluator=Evaluator(comm, model, algo, dataset),
               E=E, total_steps=total_steps, workers=workers, checkpoints=writer)


def resume(job: Job, comm, ckpt_path: str, ckpt_meta: dict) -> None:
    """Collective: every rank's state from the checkpoint rank 0 verified (on another number of
    ranks: rebuilt from the old ranks' states, ``job.resize`` says how)."""
    from ssdmpi import checkpoint

    comm.agree(lambda: checkpoint.check_compatible(ckpt_meta, job.cfg.model, int(job.model.params.size)))
    job.resize = checkpoint.restore(comm, ckpt_path, ckpt_meta, job.state)
    job.state.check_consistent(ckpt_path)
    job.last_checkpoint = ckpt_path


# --- the end -----------------------------------------------------------------------------------

def finish(job: Job, comm, out: Reporter, code: int, reason: str | None) -> int:
    """Collective: after an early stop, say why and how to continue; after the last step,
    every communicated gradient into W, the final checkpoint, evaluation and summary."""
    run_time = job.state.time_s()
    out.progress.close()
    for record in job.checkpoints.complete(comm):   # a checkpoint still being written: commit it first
        committed(job, out, record)
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
        again = resume_command(job.cfg.run_dir, comm.size, command=job.command)
        _say(comm.rank, f"ssdmpi train: stopped at step {job.state.step} ({reason}); checkpoint "
                        f"{job.last_checkpoint}. Continue with: {again} (exit code {code})")
        return code
    # The final checkpoint holds every rank's state as it stands now, so that training longer
    # (--resume auto with more epochs) continues bit for bit as if the run had never stopped,
    # and, as its model, W after finalize: every communicated sum and the partial period
    # applied. That W is what the final evaluation (recorded in the checkpoint) measures.
    job.algo.drain()
    tree, replicated = job.state.state_dict(), job.state.replicated()   # host copies: finalize does not touch them
    job.algo.finalize()
    job.state.last_eval = tree["trainer"]["last_eval"] = evaluate_now(job, out)
    save(job, comm, out, "final", tree, replicated, weights=job.algo.global_weights())
    if comm.rank == 0:
        _summary(job, comm.size, run_time)
    return 0


def complete(job: Job, comm) -> int:
    """Collective: resumed from a finished run's final checkpoint at or past the last step asked
    for, there is nothing to train: say so in one line and how to train longer; write nothing.
    ``W`` is made what the run ended with (``algo.finalize()``, as ``finish`` did), for the
    Python API."""
    cfg, step, total = job.cfg, job.state.step, job.total_steps
    job.algo.drain()
    job.algo.finalize()
    by_steps = cfg.steps is not None
    longer = {"steps": step + job.E} if by_steps else {"epochs": 2 * math.ceil(step / job.E)}
    acc = job.state.last_eval.get("test_acc")
    where = f"step {step} of {total}" if step == total else f"step {step}, past the {total} steps asked for"
    _say(comm.rank, f"ssdmpi train: run {cfg.run_dir} is complete ({where}"
                    + (f", test accuracy {acc:.2%}" if acc is not None else "") + "); nothing to do. To train "
                    f"longer, give a larger --{'steps' if by_steps else 'epochs'}: "
                    + resume_command(cfg.run_dir, comm.size, longer, command=job.command))
    return 0


def _summary(job: Job, size: int, run_time: float) -> None:
    """Rank 0: write summary.txt/.json and print the summary."""
    from ssdmpi.loop import PER_STEP_TOTALS
    from ssdmpi.metrics import write_summary

    cfg, state = job.cfg, job.state
    totals, steps = state.totals, max(1, state.totals["steps"])
    summary = {"status": "done", "algo": cfg.algo, "world_size": size, "model": cfg.model,
               "num_params": int(job.model.params.size), "dataset": job.dataset.name, "step": state.step,
               "epoch": state.step / job.E, "time": run_time, "stage": job.algo.stage,
               "samples_per_s": (totals["steps"] * cfg.batch_size * job.workers / totals["wall"]
                                 if totals["wall"] else 0.0),
               **state.last_eval,
               **({k: totals[k] / steps for k in PER_STEP_TOTALS if k in totals} if totals["steps"] else {}),
               **({"delay_auto": job.algo.delay_choice.record()} if getattr(job.algo, "delay_choice", None) else {}),
               **({"resized": state.resizes} if state.resizes else {}),
               "checkpoint": job.last_checkpoint, "run_dir": cfg.run_dir, "placement": job.placement.describe(),
               "config": cfg.to_dict()}
    text, _ = write_summary(cfg.run_dir, summary)
    print(text, flush=True)
