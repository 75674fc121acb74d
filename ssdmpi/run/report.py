"""What rank 0 tells the user during ``ssdmpi train``: ``config.yaml``, ``metrics.jsonl`` and the
loggers beside it (``--csv``, ``--tensorboard``: ssdmpi/loggers.py), the progress display and the
line that opens a run (``Reporter``). Other ranks get a silent one."""

from __future__ import annotations

import os
import sys

from ssdmpi import backend, loggers
from ssdmpi.algos import registry
from ssdmpi.algos.auto_delay import steps_to_hide
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
        self._exposed = ExposedWait(job)
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

    def step_logged(self, record: dict) -> None:
        """After each step record: the note of ``ExposedWait``, once per run."""
        note = self._exposed.check(record)
        if note is not None:
            self.message(note)

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


EXPOSED_SHARE = 0.2     # a period run whose steps wait this share of their time on the allreduce gets the note


class ExposedWait:
    """Whether to tell the user of an ssd ``--comm period`` run at a fixed ``k`` that its ranks wait on
    the allreduce: ``check(record)`` after each step record returns ``exposed_wait_note`` once per run.
    It judges the means over at least ``WINDOW_PERIODS`` periods of records whose whole interval was
    in the delay stage (the one that ends at the switch also holds SSGD's blocking steps): an interval
    shorter than a period holds a period end or not, and its own means would say little. None
    otherwise; ``--delay auto`` runs and other schedules get none."""

    WINDOW_PERIODS = 4
    KEYS = ("step_s", "wait_s", "compute_s", "inflight_s")

    def __init__(self, job):
        algo = job.algo
        pattern = registry.algorithm(job.cfg.algo).pattern(job.algo_cfg) or (None,)
        self.applies = pattern[0] == "period" and not algo.auto and bool(algo.k)
        self.k, self.d = (algo.k, algo.d) if self.applies else (None, None)
        self.last_stage = self.last_step = None
        self._restart()

    def _restart(self) -> None:
        self.steps, self.sums = 0, dict.fromkeys(self.KEYS, 0.0)

    def check(self, record: dict) -> str | None:
        stage, step = record.get("stage"), record.get("step")
        whole = stage == "delay" and self.last_stage == "delay" and None not in (step, self.last_step)
        steps = step - self.last_step if whole else 0
        self.last_stage, self.last_step = stage, step
        if not (self.applies and steps > 0) or any(record.get(key) is None for key in self.KEYS):
            return None
        for key in self.KEYS:
            self.sums[key] += record[key] * steps
        self.steps += steps
        if self.steps < self.WINDOW_PERIODS * self.k:
            return None
        note = exposed_wait_note({key: total / self.steps for key, total in self.sums.items()}, self.k, self.d)
        self._restart()
        if note is not None:
            self.applies = False
        return note


def exposed_wait_note(record: dict, k: int, d: int | None) -> str | None:
    """What to tell the user of an ssd ``--comm period`` run at period ``k`` with merge delay ``d``
    (None: merged at the next period's end, ``d = k``) whose ranks wait for the allreduce more than
    ``EXPOSED_SHARE`` of each step, from a delay-stage step record (``wait_s``, ``step_s``,
    ``compute_s``, ``inflight_s`` per step); None when they do not."""
    step, wait, compute = record.get("step_s"), record.get("wait_s"), record.get("compute_s")
    if not step or not compute or wait is None or wait <= EXPOSED_SHARE * step:
        return None
    window = k if d is None else d
    in_flight = (record.get("inflight_s") or 0.0) * k       # one allreduce per period
    need = steps_to_hide(compute, in_flight) if in_flight else None
    what = (f"--merge-delay {window} lets {counted(window, 'step')} of compute hide it" if d is not None
            else f"the period of {counted(k, 'step')} hides it")
    return (f"note: each step waits {1e3 * wait:.0f} ms ({wait / step:.0%} of it) for the period's allreduce, "
            f"in flight {1e3 * in_flight:.0f} ms against {1e3 * compute:.0f} ms of compute per step; {what}"
            + (f", about {need} would" if need and need > window else "")
            + ". --delay auto chooses k and the merge delay to hide it within the stable range "
              "(docs/PERIOD_RULE.md)")
