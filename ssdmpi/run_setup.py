"""From the command line to a resolved run: which checkpoint to resume, the TrainConfig, the
algorithm's settings, and the run directory.

``configure(args, world_size)`` runs on rank 0 alone (it reads the config files and the
checkpoint) and returns ``(cfg, soft, ckpt_path, ckpt_meta)``; the trainer broadcasts it.
The TrainConfig becomes the algorithm's settings in the config layer
(``config.algo_config``, ``config.resolved_settings``). ``prepare_run_dir`` and ``trim_metrics`` look
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
    from ssdmpi.loggers import check_available

    check_available(cfg)      # --tensorboard without tensorboardX: say so before anything is written
    prepare_run_dir(cfg.run_dir, resuming=ckpt_path is not None, auto=resume == "auto")
    if cfg.widths is not None and cfg.model != "mlp" and "widths" in soft:
        cfg.widths = None      # the preset's mlp widths; this model has its own shape
    return cfg, soft, ckpt_path, ckpt_meta


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
