"""From the command line to a resolved run: which checkpoint to resume, the TrainConfig, the
algorithm's settings, and the run directory.

``configure(args, world_size)`` runs on rank 0 alone (it reads the config files and the
checkpoint) and returns ``(cfg, soft, ckpt_path, ckpt_meta, created)``; the trainer broadcasts
it. ``resolve_run`` is the same without touching the run directory (``--print-config``).
The TrainConfig becomes the algorithm's settings in the config layer
(``config.algo_config``, ``config.resolved_settings``). ``claim_run_dir`` (a new default
directory, unique even for runs started in the same second), ``prepare_run_dir``,
``remove_created`` and ``trim_metrics`` look after the run directory (rank 0).
"""

from __future__ import annotations

import os
import sys
import time

from ssdmpi.errors import UserError


def resolve_run(args, world_size: int | None):
    """Rank 0: ``(cfg, soft, ckpt_path, ckpt_meta)`` for ``ssdmpi train ARGS`` on ``world_size`` ranks.

    Resolves ``--resume`` (``auto``: the newest checkpoint that verifies in the run
    directory), resolves the configuration over the checkpoint's, fits it to ``world_size``
    ranks (``fit_world``; None: not checked) and finds the run directory: given, or the
    resumed checkpoint's; None for a new default one (``configure`` claims it). Creates nothing.
    ``soft``: the settings that came from a preset, not from the user (they may be dropped
    where they do not apply).
    """
    from ssdmpi import checkpoint
    from ssdmpi import config as configuration

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
    cfg = configuration.resolve(args, None if ckpt_meta is None else ckpt_meta.get("config"))
    if ckpt_meta is not None and world_size is not None:
        fit_world(cfg, ckpt_meta, world_size, "batch_size" in configuration.from_flags(args))
    if cfg.run_dir is None or (ckpt_path is not None and not args.run_dir):
        if ckpt_path is not None and os.path.basename(os.path.dirname(os.path.abspath(ckpt_path))) == "checkpoints":
            cfg.run_dir = os.path.dirname(os.path.dirname(os.path.abspath(ckpt_path)))
    soft = configuration.soft_settings(args)
    if cfg.widths is not None and cfg.model != "mlp" and "widths" in soft:
        cfg.widths = None      # the preset's mlp widths; this model has its own shape
    return cfg, soft, ckpt_path, ckpt_meta


def fit_world(cfg, meta: dict, world_size: int, batch_given: bool) -> None:
    """Resuming on another number of ranks than the checkpoint's: the global batch stays the same
    (so do the steps per epoch, the schedules and the data each step sees), split over the new
    ranks: ``cfg.batch_size`` and the checkpoint's config (``meta["config"]``, what the structural
    check compares with) become ``global batch / new ranks``. ``UserError`` (one line) when it does
    not divide, for format-1 checkpoints, and for a ``--batch-size`` (``batch_given``) that is neither
    the checkpoint's (the same command line, requeued on fewer nodes) nor the new one."""
    from ssdmpi import config as configuration

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
    from ssdmpi.loggers import check_available

    check_available(cfg)      # --tensorboard without tensorboardX: say so before anything is written
    claimed = []
    if cfg.run_dir is None:
        from ssdmpi.config import default_run_dir

        cfg.run_dir, claimed = claim_run_dir(default_run_dir(cfg))
    try:
        created = prepare_run_dir(cfg.run_dir, resuming=ckpt_path is not None, auto=resume == "auto") + claimed
    except UserError as exc:
        from ssdmpi.config import load_file

        if getattr(args, "config", None) and not args.run_dir and "run_dir" in load_file(args.config):
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
    from ssdmpi import checkpoint

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


def print_config(args) -> int:
    """``ssdmpi train --print-config``: the settings this command would run with, as YAML, on
    stdout (rank 0 of a launch; the others print nothing). Creates nothing, starts no MPI.

    Settings left to the algorithm or to the start (``null``) say their default in a comment.
    The output is a valid ``--config`` file (``run_dir``, ``stop_at_step`` as comments).
    """
    from ssdmpi import config as configuration
    from ssdmpi.comm.abort import world_rank_size

    try:
        cfg, soft, _, _ = resolve_run(args, None)
        cfg = configuration.applicable(cfg, soft)
    except UserError as exc:   # every rank reads the same files and gets the same error
        raise UserError(str(exc), collective=True) from None
    if world_rank_size()[0] == 0:
        print(configuration.annotated_yaml(cfg), end="", flush=True)
    return 0
