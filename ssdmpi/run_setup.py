"""From the command line to a resolved run: which checkpoint to resume, the TrainConfig, the
algorithm's settings, and the run directory.

``configure(args, world_size)`` runs on rank 0 alone (it reads the config files and the
checkpoint) and returns ``(cfg, soft, ckpt_path, ckpt_meta)``; the trainer broadcasts it.
``algo_config`` turns the TrainConfig into the ``AlgoConfig`` (epochs -> steps, preset
settings that do not apply dropped) and ``resolved_config`` writes the algorithm's resolved
defaults back (what ``config.yaml`` records). ``prepare_run_dir`` and ``trim_metrics`` look
after the run directory (rank 0).
"""

from __future__ import annotations

import os
import sys
import time

from ssdmpi.errors import UserError


def configure(args, world_size: int):
    """Rank 0: ``(cfg, soft, ckpt_path, ckpt_meta)`` for ``ssdmpi train ARGS`` on ``world_size`` ranks.

    Resolves ``--resume`` (``auto``: the newest checkpoint that verifies in the run
    directory), checks the checkpoint fits the job, resolves the configuration over the
    checkpoint's, picks the run directory and prepares it. ``soft``: the settings that came
    from a preset, not from the user (they may be dropped where they do not apply).
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
        checkpoint.check_compatible(ckpt_meta, world_size, ckpt_meta.get("model"))
    cfg = configuration.resolve(args, None if ckpt_meta is None else ckpt_meta.get("config"))
    if cfg.run_dir is None or (ckpt_path is not None and not args.run_dir):
        if ckpt_path is not None and os.path.basename(os.path.dirname(os.path.abspath(ckpt_path))) == "checkpoints":
            cfg.run_dir = os.path.dirname(os.path.dirname(os.path.abspath(ckpt_path)))
        elif cfg.run_dir is None:
            cfg.run_dir = configuration.default_run_dir(cfg)
    soft = configuration.soft_settings(args, ckpt_meta is not None)
    prepare_run_dir(cfg.run_dir, resuming=ckpt_path is not None, auto=resume == "auto")
    if cfg.widths is not None and cfg.model != "mlp" and "widths" in soft:
        cfg.widths = None      # the preset's mlp widths; this model has its own shape
    return cfg, soft, ckpt_path, ckpt_meta


def algo_config(cfg, soft: set, steps_per_epoch: int, total_steps: int, world_size: int):
    """The ``AlgoConfig`` of ``cfg`` (epochs converted to steps), resolved.

    Algorithm settings that came from a preset (``soft``) and do not apply to the chosen
    algorithm are dropped (``--preset cifar10-resnet20 --algo ssgd`` is fine); the user's
    own inapplicable settings are errors.
    """
    from ssdmpi.algos import AlgoConfig

    values = dict(
        algo=cfg.algo, delay=cfg.delay, warmup_steps=cfg.warmup_iterations(steps_per_epoch),
        comm=cfg.comm, period_rule=cfg.period_rule, local_update=cfg.local_update, lr=cfg.lr,
        lr_schedule=schedule_in_steps(cfg.lr_schedule, steps_per_epoch),
        lr_warmup_steps=int(round(cfg.lr_warmup_epochs * steps_per_epoch)), total_steps=total_steps,
        local_lr=cfg.local_lr, local_lr_schedule=None if cfg.local_lr_schedule is None
        else schedule_in_steps(cfg.local_lr_schedule, steps_per_epoch),
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


def schedule_in_steps(spec: str, steps_per_epoch: int) -> dict:
    """A learning-rate schedule given in epochs (``--lr-schedule``) as the algorithm's dict in steps."""
    from ssdmpi.config import parse_schedule

    kind, options = parse_schedule(spec)
    out = {"kind": kind}
    if kind == "step":
        out.update(every=max(1, round(options["every"] * steps_per_epoch)), gamma=options["gamma"])
    elif kind == "multistep":
        out.update(milestones=[round(m * steps_per_epoch) for m in options["milestones"]], gamma=options["gamma"])
    elif kind == "poly":
        out["power"] = options["power"]
    return out


def resolved_config(cfg, algo_cfg):
    """``cfg`` with the algorithm's resolved defaults written in (what config.yaml records)."""
    import dataclasses

    out = dataclasses.replace(cfg)
    for key in ("delay", "comm", "period_rule", "local_update", "glu_divisor"):
        setattr(out, key, getattr(algo_cfg, key))
    if out.warmup_epochs is None:
        out.warmup_steps = int(algo_cfg.warmup_steps)
    return out


def prepare_run_dir(run_dir: str, resuming: bool, auto: bool = False) -> None:
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
