"""Runs ``ssdmpi train`` and ``ssdmpi.train(...)``: the top floor of the trainer package.

Reads top to bottom like nanoGPT's train.py: ``run_job`` resolves the configuration
(``ssdmpi/run/setup.py``), sets up (backend, communicator, data, model, algorithm, resume)
with every resource in one ``ExitStack``, runs the loop (``ssdmpi/run/loop.py``) and ends
(``finish``: final checkpoint, evaluation, summary). Every rank runs this same code; rank 0
alone talks to the user and writes files (``ssdmpi/run/report.py``). The state a checkpoint
holds is ``ssdmpi/run/state.py``'s; evaluation is ``ssdmpi/run/evaluation.py``'s. What happens
when, the run directory and the exit codes: ``ssdmpi/run/command.py``.
"""

from __future__ import annotations

import contextlib
import math
import sys

from ssdmpi import backend
from ssdmpi import config as configuration
from ssdmpi.comm import node, world
from ssdmpi.comm.communicator import Communicator
from ssdmpi.errors import DIVERGED_EXIT
from ssdmpi.metrics import write_summary
from ssdmpi.relaunch import resume_command
from ssdmpi.run.directory import remove_created
from ssdmpi.run.job import Job, Stop
from ssdmpi.run.loop import PER_STEP_TOTALS, committed, evaluate_now, save, tokens_seen, train, with_tokens_per_s
from ssdmpi.run.report import Reporter, shown_stage
from ssdmpi.run.setup import resume, setup
from ssdmpi.run.start import configure, print_config


def _say(rank: int, text: str, file=None) -> None:
    if rank == 0:
        print(text, file=file or sys.stdout, flush=True)


# --- ssdmpi train ------------------------------------------------------------------------------

def run(args) -> int:
    """``ssdmpi train`` (``--print-config``: print the resolved settings, start nothing).

    A run that stops early with a non-zero code (a preemption's checkpoint-and-requeue, an
    interrupt, divergence) ends on every rank together: the ranks meet at a barrier once each has
    closed everything, so that none begins to exit while another still writes. Under ``srun
    --kill-on-bad-exit`` the first rank to exit non-zero has the others killed, and a straggler
    killed that way turns the job's exit code into a signal's (no requeue)."""
    request = configuration.Request.from_args(args)
    if args.print_config:
        return print_config(request)
    code = run_job(request, command=True)[0]
    if code and world.rank_and_size()[1] > 1:
        world.agree(lambda: None)
    return code


def run_job(request, model=None, dataset=None, command: bool = False):
    """Collective: one run of ``request`` (a ``config.Request``); ``(exit code, Job)``. ``model``/``dataset``
    (the Python API, ``ssdmpi/api.py``) replace what ``cfg.model``/``cfg.dataset`` name. ``command``: the
    ``ssdmpi train`` command runs this job (its process ends after it, ``Stop``; the hints it
    prints are command lines), not a script through the Python API.

    Every resource (signal handlers, communicator, loader, metrics files) is entered into
    one ExitStack, which frees it on every exit path. The signal handlers go in first, so
    that a preemption signal arriving during setup is acted on at the first
    synchronisation point instead of killing the rank. A start that fails before the loop
    removes the run directories it created (``directory.remove_created``)."""
    with contextlib.ExitStack() as resources:
        stop = resources.enter_context(Stop(exiting=command))
        # 1. Configuration: rank 0 reads the files (config, the checkpoint to resume) and resolves
        #    them, once; every rank gets the same frozen TrainConfig.
        rank, size = world.rank_and_size()
        start = world.on_root(lambda: configure(request, size))
        cfg, ckpt_path, ckpt_meta = start.cfg, start.ckpt_path, start.ckpt_meta
        # 2. Setup: this rank's threads, GPU and backend (comm/node.py), communicator, data, model,
        #    algorithm, loader; every rank checks that all agree. Resume: rank 0 reads the
        #    checkpoint and sends every rank its state.
        try:
            placement = world.agree(lambda: node.place(node.discover(), cfg.device, cfg.threads, cfg.gpu_id))
            xp = backend.get_xp()
            comm = resources.enter_context(Communicator(**configuration.communicator_options(cfg)))
            job = setup(cfg, ckpt_meta, comm, xp, resources, model=model, dataset=dataset)
            job.placement, job.command = placement, command
            if ckpt_path is not None:
                resume(job, comm, ckpt_path, ckpt_meta)
        except BaseException:
            if rank == 0:
                remove_created(start.created)
            raise
        if ckpt_meta is not None and ckpt_meta.get("reason") == "final" and job.state.step >= job.total_steps:
            return complete(job, comm), job
        # Step lines on the display when the user gave --log-every (a flag or an API setting), not at
        # the interval a preset or the default sets for the metrics records.
        out = resources.enter_context(Reporter(job, comm, ckpt_path, ckpt_meta,
                                               step_lines="log_every" in request.flags))
        for note in start.notes:
            out.message(f"note: {note}")
        if job.resize is not None:
            out.write(job.resize)
            out.message(f"resumed on another number of ranks ({job.resize['from_ranks']} -> {job.resize['to_ranks']}): "
                        f"{job.resize['merged']}")
        # 3. The loop, then 4. the end.
        code, reason = train(job, comm, out, stop)
        return finish(job, comm, out, code, reason), job


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
        _summary(job, comm.size, run_time, out)
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
    acc, val = job.state.last_eval.get("test_acc"), job.state.last_eval.get("val_loss")
    where = f"step {step} of {total}" if step == total else f"step {step}, past the {total} steps asked for"
    _say(comm.rank, f"ssdmpi train: run {cfg.run_dir} is complete ({where}"
                    + (f", test accuracy {acc:.2%}" if acc is not None else "")
                    + (f", validation loss {val:.4f}" if val is not None else "") + "); nothing to do. To train "
                    f"longer, give a larger --{'steps' if by_steps else 'epochs'}: "
                    + resume_command(cfg.run_dir, comm.size, longer, command=job.command))
    return 0


def _summary(job: Job, size: int, run_time: float, out: Reporter) -> None:
    """Rank 0: write summary.txt/.json and print the summary (fields: ssdmpi/metrics.py)."""
    cfg, state = job.cfg, job.state
    totals, steps = state.totals, max(1, state.totals["steps"])
    summary = {"status": "done", "algo": cfg.algo, "world_size": size, "model": cfg.model,
               "num_params": int(job.model.params.size), "dataset": job.dataset.name, "step": state.step,
               "epoch": state.step / job.E, "time": run_time, "wall_s": state.time_s(), "train_s": state.train_s(),
               "eval_s": out.eval_s, "best": out.best, "stage": shown_stage(job.algo),
               "samples_per_s": (totals["steps"] * cfg.batch_size * job.workers / totals["wall"]
                                 if totals["wall"] else 0.0),
               **state.last_eval,
               **({k: totals[k] / steps for k in PER_STEP_TOTALS if k in totals} if totals["steps"] else {}),
               **({"delay_auto": job.algo.delay_choice.record()} if job.algo.delay_choice else {}),
               **({"resized": state.resizes} if state.resizes else {}),
               "checkpoint": job.last_checkpoint, "run_dir": cfg.run_dir, "placement": job.placement.describe(),
               "config": cfg.to_dict()}
    if job.context is not None:      # a language model: its throughput in tokens and the tokens it trained on
        summary = dict(with_tokens_per_s(summary, job.context), tokens=tokens_seen(job, state.step))
    text, _ = write_summary(cfg.run_dir, summary)
    print(text, flush=True)
