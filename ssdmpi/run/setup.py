"""From the command line to a resolved run: which checkpoint to resume, the TrainConfig, the
algorithm's settings, and the run directory.

``configure(args, world_size)`` runs on rank 0 alone (it reads the config files and the
checkpoint) and returns ``(cfg, soft, ckpt_path, ckpt_meta, created)``; the trainer broadcasts
it. ``resolve_run`` is the same without touching the run directory (``--print-config``).
The TrainConfig becomes the algorithm's settings in the config layer
(``config.algo_config``, ``config.resolved_settings``). ``claim_run_dir`` (a new default
directory, unique even for runs started in the same second), ``prepare_run_dir``,
``remove_created`` and ``trim_metrics`` look after the run directory (rank 0). Then, on every
rank, ``setup`` builds the run's ``Job`` (data, model, algorithm, loader, checkpoint writer) and
``resume`` gives it the checkpoint's state.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from ssdmpi import backend, checkpoint
from ssdmpi import config as configuration
from ssdmpi.algos import build_algorithm
from ssdmpi.checkpoint import CheckpointWriter
from ssdmpi.comm.abort import world_rank_size
from ssdmpi.data import ShardedLoader, load_dataset
from ssdmpi.errors import UserError
from ssdmpi.loggers import check_available, record_lines
from ssdmpi.metrics import atomic_write
from ssdmpi.nn import build_model
from ssdmpi.run.evaluation import Evaluator
from ssdmpi.run.job import Job
from ssdmpi.run.state import TrainingState


def resolve_run(args, world_size: int | None):
    """Rank 0: ``(cfg, soft, ckpt_path, ckpt_meta)`` for ``ssdmpi train ARGS`` on ``world_size`` ranks.

    Resolves ``--resume`` (``auto``: the newest checkpoint that verifies in the run
    directory, for as long as the run was last asked to train: ``last_asked_length``), resolves
    the configuration over the checkpoint's, fits it to ``world_size`` ranks (``fit_world``;
    None: not checked) and finds the run directory: given, or the resumed checkpoint's; None for
    a new default one (``configure`` claims it). A relative ``data_path`` becomes absolute (the
    run and its checkpoints are read again from other directories). Creates nothing.
    ``soft``: the settings that came from a preset, not from the user (they may be dropped
    where they do not apply).
    """
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
    base = None if ckpt_meta is None else ckpt_meta.get("config")
    if resume == "auto" and base is not None:
        base = last_asked_length(args.run_dir, base)
    cfg = configuration.resolve(args, base)
    if cfg.data_path:
        cfg.data_path = os.path.abspath(os.path.expanduser(cfg.data_path))
    if ckpt_meta is not None and world_size is not None:
        fit_world(cfg, ckpt_meta, world_size, "batch_size" in configuration.from_flags(args))
    if cfg.run_dir is None or (ckpt_path is not None and not args.run_dir):
        if ckpt_path is not None and os.path.basename(os.path.dirname(os.path.abspath(ckpt_path))) == "checkpoints":
            cfg.run_dir = os.path.dirname(os.path.dirname(os.path.abspath(ckpt_path)))
    soft = configuration.soft_settings(args)
    if cfg.widths is not None and cfg.model != "mlp" and "widths" in soft:
        cfg.widths = None      # the preset's mlp widths; this model has its own shape
    return cfg, soft, ckpt_path, ckpt_meta


def last_asked_length(run_dir: str, ckpt_config: dict) -> dict:
    """``--resume auto``: the checkpoint's config with the run's length (``steps``, ``epochs``) as
    the run was last asked for in ``run_dir/config.yaml`` (written when each attempt starts).

    A run extended (``--resume auto --epochs 5``) whose newer checkpoints were skipped as corrupt,
    or that stopped before its first one, resumes from a checkpoint that records the old length;
    the run itself was asked for the new one, which flags still override. No readable
    ``config.yaml``: the checkpoint's config as it is."""
    try:
        saved = configuration.load_file(os.path.join(run_dir, "config.yaml"))
    except UserError:
        return ckpt_config
    return dict(ckpt_config, **{k: saved[k] for k in configuration.RUN_LENGTH if k in saved})


def check_lr_warmup(cfg, algo_cfg) -> None:
    """``UserError`` unless the lr warm-up (``--lr-warmup-epochs``) ends before the run does: a
    warm-up as long as the run never trains at ``--lr`` (at 50 epochs of warm-up in a 20-epoch
    run the lr ends at 40% of it)."""
    warmup, total = int(algo_cfg.lr_warmup_steps), int(algo_cfg.total_steps)
    if warmup and warmup >= total:
        raise UserError(f"--lr-warmup-epochs {cfg.lr_warmup_epochs:g} ({warmup} steps) is not shorter than the run "
                        f"({total} steps): the lr would never reach --lr {cfg.lr:g}; give a warm-up shorter than the "
                        "run, or train longer (--epochs, --steps)")


def fit_world(cfg, meta: dict, world_size: int, batch_given: bool) -> None:
    """Resuming on another number of ranks than the checkpoint's: the global batch stays the same
    (so do the steps per epoch, the schedules and the data each step sees), split over the new
    ranks: ``cfg.batch_size`` and the checkpoint's config (``meta["config"]``, what the structural
    check compares with) become ``global batch / new ranks``. ``UserError`` (one line) when it does
    not divide, for format-1 checkpoints, and for a ``--batch-size`` (``batch_given``) that is neither
    the checkpoint's (the same command line, requeued on fewer nodes) nor the new one."""
    old = int(meta.get("world_size", world_size))
    if old == world_size:
        return
    if int(meta.get("format_version", 1)) < 2:
        raise UserError(f"the checkpoint was written by {old} ranks in format 1, which resumes only on as many; "
                        f"resume with mpiexec -n {old}")
    old_ranks, new_ranks = configuration.data_ranks(cfg, old), configuration.data_ranks(cfg, world_size)
    per_rank = int(meta["config"]["batch_size"])
    total = per_rank * old_ranks
    if total % new_ranks:
        counts = ", ".join(str(n) for n in range(1, total + 1) if total % n == 0 and n <= 4 * old_ranks)
        raise UserError(f"the checkpoint's global batch of {total} samples ({old_ranks} x {per_rank}) cannot be "
                        f"split evenly over {new_ranks} {'workers' if new_ranks < world_size else 'ranks'}; "
                        f"resume on a number that divides it ({counts}), e.g. mpiexec -n {old}")
    if batch_given and cfg.batch_size not in (per_rank, total // new_ranks):
        raise UserError(f"resuming on {world_size} ranks keeps the global batch of {total} samples, so the batch "
                        f"size per rank is {total // new_ranks}; drop --batch-size {cfg.batch_size}")
    cfg.batch_size = total // new_ranks
    meta["config"] = dict(meta["config"], batch_size=cfg.batch_size)


def configure(args, world_size: int):
    """Rank 0: ``resolve_run``, then the run directory prepared (``prepare_run_dir``).

    Returns ``(cfg, soft, ckpt_path, ckpt_meta, created)``: ``created`` lists the
    directories this call made, for ``remove_created`` when the start fails.
    """
    cfg, soft, ckpt_path, ckpt_meta = resolve_run(args, world_size)
    resume = getattr(args, "resume", None)
    check_available(cfg)      # --tensorboard without tensorboardX: say so before anything is written
    claimed = []
    if cfg.run_dir is None:
        cfg.run_dir, claimed = claim_run_dir(configuration.default_run_dir(cfg))
    try:
        created = prepare_run_dir(cfg.run_dir, resuming=ckpt_path is not None, auto=resume == "auto") + claimed
    except UserError as exc:
        if getattr(args, "config", None) and not args.run_dir and "run_dir" in configuration.load_file(args.config):
            # a config.yaml saved before run_dir became a comment, or the user's own file
            raise UserError(f"{exc} (run_dir comes from {args.config}: drop it there or pass --run-dir)") from None
        raise
    return cfg, soft, ckpt_path, ckpt_meta, created


def claim_run_dir(base: str) -> tuple[str, list]:
    """A new, empty run directory: ``base``, or ``base-2``, ``base-3``, ... when that is taken.

    Each name is tried with ``os.mkdir``, which fails when the name exists, so runs started in
    the same second (a shell loop over seeds with ``&``) each get their own directory, whatever
    the order. Returns ``(path, the directories made)``, deepest first, for ``remove_created``.
    """
    made, parent = [], os.path.abspath(os.path.dirname(base) or ".")
    while not os.path.exists(parent):           # the parents this call makes, deepest first
        made.append(parent)
        parent = os.path.dirname(parent)
    try:
        os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
        for n in range(1, 10_000):
            path = base if n == 1 else f"{base}-{n}"
            try:
                os.mkdir(path)
            except FileExistsError:
                continue
            return path, [os.path.abspath(path)] + made
        raise FileExistsError(f"{base}-2 to {base}-9999 exist")
    except OSError as exc:
        remove_created(made)
        raise UserError(f"cannot create a run directory under {os.path.dirname(base) or '.'}: "
                        f"{exc.strerror or exc}; choose a writable one with --run-dir") from None


def prepare_run_dir(run_dir: str, resuming: bool, auto: bool = False) -> list:
    """Create ``run_dir`` and ``checkpoints/``; refuse to start a fresh run over an old one.

    ``auto`` (``--resume auto`` found no checkpoint): a ``metrics.jsonl`` left by an attempt
    that died before its first checkpoint is moved aside, not appended to. Returns the
    directories this call created, deepest first (none that existed before).
    """
    created = []
    try:
        path = os.path.abspath(os.path.join(run_dir, "checkpoints"))
        while not os.path.exists(path):
            created.append(path)
            path = os.path.dirname(path)
        os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
        probe = os.path.join(run_dir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        remove_created(created)
        raise UserError(f"cannot use run directory {run_dir}: {exc.strerror or exc}; "
                        "choose a writable one with --run-dir") from None
    if not resuming:
        old = checkpoint.list_checkpoints(os.path.join(run_dir, "checkpoints"))
        metrics = os.path.join(run_dir, "metrics.jsonl")
        if auto and not old and os.path.exists(metrics):
            os.replace(metrics, f"{metrics}.{time.strftime('%Y%m%d-%H%M%S')}.old")
        elif old or os.path.exists(metrics):
            remove_created(created)
            raise UserError(f"run directory {run_dir} already holds a run; continue it with --resume auto "
                            "or choose another --run-dir")
    return created


def remove_created(created) -> None:
    """Undo ``prepare_run_dir`` after a failed start: remove the directories it created, if
    still empty. Never touches a directory that existed before, nor anything written into one."""
    for path in created or ():
        try:
            os.rmdir(path)
        except OSError:
            return     # not empty (or gone): it, and every parent, is kept


def trim_metrics(path: str, step: int) -> None:
    """Drop records of steps after ``step`` (logged before a crash, redone after resuming)."""
    if not os.path.exists(path):
        return
    kept = [line if line.endswith("\n") else line + "\n" for line, record in record_lines(path)
            if record.get("step") is None or record["step"] <= step]
    atomic_write(path, "".join(kept))


def print_config(args) -> int:
    """``ssdmpi train --print-config``: the settings this command would run with, as YAML, on
    stdout (rank 0 of a launch; the others print nothing). Creates nothing, starts no MPI.

    Settings left to the algorithm or to the start (``null``) say their default in a comment.
    The output is a valid ``--config`` file (``run_dir``, ``stop_at_step`` as comments).
    """
    try:
        cfg, soft, _, _ = resolve_run(args, None)
        cfg = configuration.applicable(cfg, soft)
    except UserError as exc:   # every rank reads the same files and gets the same error
        raise UserError(str(exc), collective=True) from None
    if world_rank_size()[0] == 0:
        print(configuration.annotated_yaml(cfg), end="", flush=True)
    return 0


# --- the run's objects ----------------------------------------------------------------------------

def setup(cfg, soft: set, ckpt_meta, comm, xp, resources, model=None, dataset=None) -> Job:
    """Collective: build the run's objects (model seeded, rank 0's weights broadcast); a
    ``UserError`` on any rank is raised on every rank; the loader is closed by ``resources``.
    ``model`` (a factory or a ``Model``) and ``dataset`` (a ``Dataset``) come from the Python
    API; None: ``cfg.model`` and ``cfg.dataset`` name them."""
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
    comm.agree(lambda: check_lr_warmup(cfg, algo_cfg))
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
    comm.agree(lambda: checkpoint.check_compatible(ckpt_meta, job.cfg.model, int(job.model.params.size)))
    job.resize = checkpoint.restore(comm, ckpt_path, ckpt_meta, job.state)
    job.state.check_consistent(ckpt_path)
    job.last_checkpoint = ckpt_path
