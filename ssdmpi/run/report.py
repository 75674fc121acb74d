"""What rank 0 tells the user during ``ssdmpi train``: ``config.yaml``, ``metrics.jsonl`` and the
loggers beside it (``--csv``, ``--tensorboard``: ssdmpi/loggers.py), the progress display and the
lines that open a run (``Reporter``), the stage as a run shows it (``shown_stage``) and the note on
an exposed wait (``ExposedWait``). Other ranks get a silent one.

What a default run prints: the opening lines, one line per evaluation, a progress bar where stdout
is a terminal (``ssdmpi/metrics.py``'s ``Progress``), the notes, the summary; step lines only when
``--log-every`` is given or ``--no-progress-bar`` asks for lines instead of a bar. No line of a
default run passes 160 characters (a long run directory name can make one longer)."""

from __future__ import annotations

import os

from ssdmpi import backend, loggers, metrics
from ssdmpi.algos import registry
from ssdmpi.algos.auto_delay import steps_to_hide
from ssdmpi.config import changed_settings
from ssdmpi.metrics import MetricsLog, Progress, atomic_write, counted, delay_auto_line
from ssdmpi.run.directory import trim_metrics
from ssdmpi.run.job import Job
from ssdmpi.version import __version__


def shown_stage(algo) -> str:
    """The stage a run's records, display and summary name: the algorithm's own (``warmup``, then
    ``delay`` or ``async``), but ``sync`` for one without a delay stage (ssgd: it synchronises every
    step; the algorithm itself calls that ``warmup``)."""
    return algo.stage if algo.has_delay_stage else "sync"


class Reporter:
    """Rank 0's side of a run: ``config.yaml``, ``metrics.jsonl`` and the ``--csv`` /
    ``--tensorboard`` loggers (``write`` sends every record to each), the progress display
    (``progress``, ``message``; step lines when ``step_lines``, the trainer's word that ``--log-every``
    was given, or with ``--no-progress-bar``), and what the summary takes from
    the evaluations of the whole run, resumed parts included (``best``, ``eval_s``). Other ranks get
    a silent one. A context manager: leaving closes the display, the metrics file and the loggers."""

    def __init__(self, job: Job, comm, ckpt_path: str | None, ckpt_meta: dict | None, step_lines: bool = False):
        cfg, step = job.cfg, job.state.step
        self.log, self.loggers, self._job = None, [], job
        self.best, self.eval_s = None, 0.0      # of the evaluations so far (rank 0)
        self._exposed = ExposedWait(job)
        job.algo.on_delay_chosen = self.delay_chosen     # --delay auto: told when k is chosen
        if comm.rank == 0:
            metrics_path = os.path.join(cfg.run_dir, "metrics.jsonl")
            if ckpt_path is not None:
                trim_metrics(metrics_path, step)
                self._evaluated([r for r in loggers.read_records(metrics_path) if r.get("kind") == "eval"])
            self._write_config()
            self.log = MetricsLog(metrics_path)
            self.loggers = loggers.open_loggers(cfg, step if ckpt_path is not None else None)
            self.log.write({"kind": "start", "step": step, "time": job.state.elapsed0, "world_size": comm.size,
                            "resumed_from": ckpt_path, "version": __version__, "backend": backend.reason(),
                            "progress": comm.strategy, "steps_per_epoch": job.E, "total_steps": job.total_steps,
                            "num_params": int(job.model.params.size), "placement": job.placement.as_dict(),
                            "workers": job.workers, "global_batch": cfg.batch_size * job.workers,
                            "config": cfg.to_dict()})
        # --no-progress-bar asks for plain periodic lines instead of a bar
        self.progress = Progress(job.total_steps, initial=step, enabled=comm.rank == 0, bar=cfg.progress_bar,
                                 step_lines=step_lines or not cfg.progress_bar)
        for line in _intro(job, comm.size, ckpt_path):
            self.message(line)
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
        choice = job.algo.delay_choice
        atomic_write(os.path.join(job.cfg.run_dir, "config.yaml"),
                     job.cfg.to_yaml() + f"# rank 0 ran with: {job.placement.describe()}\n"
                     + (f"# {choice.text()}\n" if choice else ""))

    def delay_chosen(self, choice) -> None:
        """``--delay auto`` chose ``k`` (every rank calls this): the metrics record, the display line,
        config.yaml's note."""
        self.write(choice.record())
        self.message(delay_auto_line(choice.record()))
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
            if record.get("kind") == "eval":
                self._evaluated([record])
        for logger in self.loggers:
            logger.write(record)

    def message(self, text: str) -> None:
        self.progress.message(text)

    def _evaluated(self, records: list) -> None:
        """Count evaluation records (of this part of the run, or read back from before a resume)."""
        self.best = metrics.best_eval(records, self.best)
        self.eval_s += sum(float(r.get("eval_s") or 0.0) for r in records)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        self.progress.close()
        for logger in self.loggers:
            logger.close()
        if self.log is not None:
            self.log.close()


def _intro(job: Job, size: int, ckpt_path: str | None) -> list:
    """The lines that open a run: what trains on what; the batch, the length and where it runs; where
    it resumed from."""
    cfg, model, dataset = job.cfg, job.model, job.dataset
    what = registry.algorithm(cfg.algo).describe(job.algo_cfg, job.workers)
    per = "worker" if job.workers < size else "rank"
    if job.context is None:
        data, batch = f"{len(dataset.train_x)} train / {len(dataset.test_x)} test", ""
    else:
        data = f"{dataset.num_train_tokens:,} train / {dataset.num_val_tokens:,} val tokens"
        batch = f" windows of {job.context} tokens"
    lines = [f"ssdmpi train: {what} on {counted(size, 'rank')}, model {cfg.model} ({model.params.size} parameters, "
             f"{cfg.dtype}), {dataset.name} ({data})",
             f"  batch {cfg.batch_size}{batch} per {per} ({cfg.batch_size * job.workers} in all), {job.total_steps} "
             f"steps ({job.E} per epoch), {backend.device()}; run directory {cfg.run_dir}"]
    if ckpt_path:
        lines.append(f"  resumed from {ckpt_path} at step {job.state.step}")
    return lines


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
        window = job.algo.allreduce_window()
        self.applies = window is not None
        self.k, self.window, self.flag = window if self.applies else (None, None, None)
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
        note = exposed_wait_note({key: total / self.steps for key, total in self.sums.items()}, self.k, self.window,
                                 self.flag)
        self._restart()
        if note is not None:
            self.applies = False
        return note


AUTO_WORTH_S = 1e-3     # a wait per step below this is left to --merge-delay: --delay auto is not suggested


def exposed_wait_note(record: dict, k: int, window: int, flag: str) -> str | None:
    """What to tell the user of a run with one allreduce per period of ``k`` steps that must complete
    within ``window`` steps of its post (``flag`` sets the window: ``TrainingAlgorithm.allreduce_window``)
    whose ranks wait for the allreduce more than
    ``EXPOSED_SHARE`` of each step, from a delay-stage step record (``wait_s``, ``step_s``,
    ``compute_s``, ``inflight_s`` per step); None when they do not. One line: the wait, the allreduce's
    time in flight against the compute, the setting that would hide it, and ``--delay auto`` where the
    wait is worth measuring for (``AUTO_WORTH_S`` per step or more)."""
    step, wait, compute = record.get("step_s"), record.get("wait_s"), record.get("compute_s")
    if not step or not compute or wait is None or wait <= EXPOSED_SHARE * step:
        return None
    in_flight = (record.get("inflight_s") or 0.0) * k       # one allreduce per period
    need = steps_to_hide(compute, in_flight) if in_flight else None
    what = (f"{flag} {need} would hide it (now {window})" if need and need > window
            else f"{flag} {window} should hide it")
    auto = ", or --delay auto" if wait >= AUTO_WORTH_S else ""
    return (f"note: steps wait {_ms(wait)} ({wait / step:.0%}) on the period's allreduce ({_ms(in_flight)} in flight, "
            f"{_ms(compute)} compute per step); {what}{auto}")


def _ms(seconds: float) -> str:
    """``0.42 ms``, ``2.1 ms``, ``198 ms``, ``12 s``: two significant figures below 10 ms, whole ms
    below 10 s, whole seconds above."""
    ms = 1e3 * seconds
    return f"{ms:.2g} ms" if ms < 9.95 else f"{ms:.0f} ms" if ms < 9950 else f"{seconds:.0f} s"
