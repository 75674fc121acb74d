"""What rank 0 tells the user during ``ssdmpi train``: ``config.yaml``, ``metrics.jsonl`` and the
loggers beside it (``--csv``, ``--tensorboard``: ssdmpi/loggers.py), the progress display and the
line that opens a run (``Reporter``). Other ranks get a silent one."""

from __future__ import annotations

import os
import sys

from ssdmpi import backend, loggers
from ssdmpi.algos import registry
from ssdmpi.config import changed_settings
from ssdmpi.metrics import MetricsLog, Progress, atomic_write, counted, launcher_on_terminal
from ssdmpi.run.job import Job
from ssdmpi.run.setup import trim_metrics
from ssdmpi.version import __version__


class Reporter:
    """Rank 0's side of a run: ``config.yaml``, ``metrics.jsonl`` and the ``--csv`` /
    ``--tensorboard`` loggers (``write`` sends every record to each), the progress display
    (``progress``, ``message``). Other ranks get a silent one. A context manager: leaving
    closes the display, the metrics file and the loggers."""

    def __init__(self, job: Job, comm, ckpt_path: str | None, ckpt_meta: dict | None):
        cfg, step = job.cfg, job.state.step
        self.log, self.loggers, self._job = None, [], job
        job.algo.on_delay_chosen = self.delay_chosen     # --delay auto: told when k is chosen
        if comm.rank == 0:
            metrics_path = os.path.join(cfg.run_dir, "metrics.jsonl")
            if ckpt_path is not None:
                trim_metrics(metrics_path, step)
            self._write_config()
            self.log = MetricsLog(metrics_path)
            self.loggers = loggers.open_loggers(cfg, step if ckpt_path is not None else None)
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
            changes = changed_settings(ckpt_meta.get("config", {}), cfg)
            if changes:
                self.message("settings changed since the checkpoint: " + ", ".join(changes))

    def _write_config(self) -> None:
        """``config.yaml``: the resolved settings (``delay: auto`` stays auto, so feeding the file back
        measures again) and, as comments, where rank 0 ran and the k that auto chose."""
        job = self._job
        choice = getattr(job.algo, "delay_choice", None)
        atomic_write(os.path.join(job.cfg.run_dir, "config.yaml"),
                     job.cfg.to_yaml() + f"# rank 0 ran with: {job.placement.describe()}\n"
                     + (f"# {choice.text()}\n" if choice else ""))

    def delay_chosen(self, choice) -> None:
        """``--delay auto`` chose ``k`` (every rank calls this): the metrics record, the display line,
        config.yaml's note."""
        self.write(choice.record())
        self.message(choice.text())
        if self.log is not None:
            self._write_config()

    def write(self, record: dict) -> None:
        if self.log is not None:
            self.log.write(record)
        for logger in self.loggers:
            logger.write(record)

    def message(self, text: str) -> None:
        self.progress.message(text)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        self.progress.close()
        for logger in self.loggers:
            logger.close()
        if self.log is not None:
            self.log.close()


def _intro(job: Job, size: int, ckpt_path: str | None) -> str:
    """The line that opens a run: what trains on what, where."""
    cfg, model, dataset = job.cfg, job.model, job.dataset
    what = registry.algorithm(cfg.algo).describe(job.algo_cfg, job.workers)
    per = "worker" if job.workers < size else "rank"
    return (f"ssdmpi train: {what} on {counted(size, 'rank')}, model {cfg.model} ({model.params.size} parameters, "
            f"{cfg.dtype}), {dataset.name} ({len(dataset.train_x)} train / {len(dataset.test_x)} test), "
            f"batch {cfg.batch_size} per {per}, {job.total_steps} steps ({job.E} per epoch), {backend.device()}, "
            f"run directory {cfg.run_dir}"
            + (f"; resumed from {ckpt_path} at step {job.state.step}" if ckpt_path else ""))
