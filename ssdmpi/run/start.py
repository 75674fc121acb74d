"""A start, on rank 0: which checkpoint to resume, the run's configuration resolved once, the run directory.

``configure(request, world_size)`` runs on rank 0 alone (it reads the config files and the checkpoint) and
returns a ``Start``, which the trainer broadcasts. ``resolve_run`` is the same without touching the run
directory (``--print-config``, ``print_config``). The configuration is ``ssdmpi/config/``'s: resolved here,
once, for the world size of the launch; every later reader reads the frozen ``TrainConfig``.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from ssdmpi import checkpoint
from ssdmpi import config as configuration
from ssdmpi.comm.abort import world_rank_size
from ssdmpi.errors import UserError
from ssdmpi.loggers import check_available
from ssdmpi.run.directory import claim_run_dir, prepare_run_dir


@dataclasses.dataclass(frozen=True)
class Start:
    """What rank 0 resolved for a start: the frozen ``cfg``, the ``notes`` (one line for the settings left out), the
    checkpoint to resume (``ckpt_path``, its ``ckpt_meta``, or None) and the directories ``created``
    (for ``remove_created`` when the start fails)."""

    cfg: object
    notes: tuple = ()
    ckpt_path: str | None = None
    ckpt_meta: dict | None = None
    created: tuple = ()
    resolved: object = None


def resolve_run(request, world_size: int | None) -> Start:
    """Rank 0: the ``Start`` of ``request`` (a ``config.Request``) on ``world_size`` ranks (None: not known).

    Resolves ``--resume`` (``auto``: the newest checkpoint that verifies in the run directory, for as
    long as the run was last asked to train: ``last_asked_length``), resolves the configuration over
    the checkpoint's, fits it to ``world_size`` ranks (``fit_world``) and finds the run directory: given,
    or the resumed checkpoint's; None for a new default one (``configure`` claims it). A relative
    ``data_path`` becomes absolute (the run and its checkpoints are read again from other
    directories). Creates nothing. ``request`` may also be ``ssdmpi train``'s argparse namespace."""
    request = configuration.as_request(request)
    resume, ckpt_path, ckpt_meta = request.resume, None, None
    run_dir = request.flags.get("run_dir")
    if resume == "auto":
        if not run_dir:
            raise UserError("--resume auto needs --run-dir (the directory whose checkpoints to continue)")
        ckpt_path = checkpoint.select_resume(os.path.join(run_dir, "checkpoints"),
                                             warn=lambda m: print(m, file=sys.stderr, flush=True))
    elif resume:
        ckpt_path = checkpoint.resolve_path(resume)
    if ckpt_path is not None:
        ckpt_meta = checkpoint.read_meta(ckpt_path)
    base = None if ckpt_meta is None else ckpt_meta.get("config")
    if resume == "auto" and base is not None:
        base = last_asked_length(run_dir, base)
    resolved = configuration.resolve_request(request, base, world_size)
    cfg, changes = resolved.config, {}
    if cfg.data_path:
        changes["data_path"] = os.path.abspath(os.path.expanduser(cfg.data_path))
    if ckpt_meta is not None and world_size is not None:
        changes.update(fit_world(cfg, ckpt_meta, world_size, "batch_size" in request.flags))
    if (cfg.run_dir is None or (ckpt_path is not None and not run_dir)) and ckpt_path is not None \
            and os.path.basename(os.path.dirname(os.path.abspath(ckpt_path))) == "checkpoints":
        changes["run_dir"] = os.path.dirname(os.path.dirname(os.path.abspath(ckpt_path)))
    cfg = dataclasses.replace(cfg, **changes)
    notes = resolved.lines()
    return Start(cfg, notes, ckpt_path, ckpt_meta, resolved=dataclasses.replace(resolved, config=cfg))


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


def fit_world(cfg, meta: dict, world_size: int, batch_given: bool) -> dict:
    """Resuming on another number of ranks than the checkpoint's: the global batch stays the same
    (so do the steps per epoch, the schedules and the data each step sees), split over the new
    ranks. Returns the change to ``cfg`` (``{"batch_size": global batch / new ranks}``, {} on the same
    rank count) and makes the checkpoint's config (``meta["config"]``, what the structural check
    compares with) say the same. ``UserError`` (one line) when it does not divide, for format-1
    checkpoints, and for a ``--batch-size`` (``batch_given``) that is neither the checkpoint's (the
    same command line, requeued on fewer nodes) nor the new one."""
    old = int(meta.get("world_size", world_size))
    if old == world_size:
        return {}
    if int(meta.get("format_version", 1)) < 2:
        raise UserError(f"the checkpoint was written by {old} ranks in format 1, which resumes only on as many; "
                        f"resume with mpiexec -n {old}")
    old_ranks, new_ranks = cfg.workers(old), cfg.workers(world_size)
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
    meta["config"] = dict(meta["config"], batch_size=total // new_ranks)
    return {"batch_size": total // new_ranks}


def configure(request, world_size: int) -> Start:
    """Rank 0: ``resolve_run``, then the run directory prepared (``prepare_run_dir``); the ``Start``'s
    ``created`` lists the directories this call made."""
    request = configuration.as_request(request)
    start = resolve_run(request, world_size)
    cfg = start.cfg
    check_available(cfg)      # --tensorboard without tensorboardX: say so before anything is written
    claimed = []
    if cfg.run_dir is None:
        path, claimed = claim_run_dir(configuration.default_run_dir(cfg))
        cfg = dataclasses.replace(cfg, run_dir=path)
    try:
        created = prepare_run_dir(cfg.run_dir, resuming=start.ckpt_path is not None,
                                  auto=request.resume == "auto") + claimed
    except UserError as exc:
        if request.config_file and not request.flags.get("run_dir") \
                and "run_dir" in configuration.load_file(request.config_file):
            # a config.yaml saved before run_dir became a comment, or the user's own file
            raise UserError(f"{exc} (run_dir comes from {request.config_file}: drop it there or pass --run-dir)") \
                from None
        raise
    return dataclasses.replace(start, cfg=cfg, created=tuple(created))


def print_config(request) -> int:
    """``ssdmpi train --print-config``: the settings this command would run with, as YAML, on
    stdout (rank 0 of a launch; the others print nothing). Creates nothing, starts no MPI.

    Settings left to the algorithm or to the start (``null``) say their default in a comment; those
    left out because they do not apply are noted. The output is a valid ``--config`` file
    (``run_dir``, ``stop_at_step`` as comments)."""
    try:
        start = resolve_run(request, None)
    except UserError as exc:   # every rank reads the same files and gets the same error
        raise UserError(str(exc), collective=True) from None
    if world_rank_size()[0] == 0:
        print(configuration.annotated_yaml(start.resolved), end="", flush=True)
    return 0
