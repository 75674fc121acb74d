"""What a training run tells its user: ``metrics.jsonl``, the progress display, the summary.

Everything here runs on rank 0 only (the trainer reduces numbers over the control
communicator first). ``metrics.jsonl`` holds one JSON object per line, appended and
flushed as it happens, so a crashed or preempted run keeps what it logged (a resumed
run appends to the same file). Two kinds of record:

``{"kind": "step", ...}`` every ``--log-every`` steps, averaged over the interval and ranks:
    step (iterations done), epoch (fractional), stage (warmup | delay | ssgd | ...),
    time (wall seconds of the run so far, across resumes, including evaluations and
    checkpoints), train_s (the same counting training steps only), loss (mean training loss),
    lr, lr_local, samples_per_s (all ranks), step_s (wall seconds per step),
    compute_s / inflight_s / wait_s (per step, mean over ranks: computing, an allreduce
    in flight, blocked waiting for one), bytes_sent (per step per rank), overlap (fraction
    of in-flight time hidden behind compute), and the step breakdown that sums to step_s:
    fb_s, update_s, data_s, blocked_s, progress_s, sync_s, other_s (ssdmpi/phases.py defines them);
    with asgd the times and bytes are the workers'
    (the servers take no steps) and staleness_mean / staleness_max (over the interval's
    server updates, ALGORITHM.md 11) are added; built by ``ssdmpi.run.loop.step_record``
``{"kind": "eval", ...}`` after each evaluation on the test split:
    step, epoch, stage, time, train_s, test_acc, test_loss (the global model W), and in the delay
    stage test_acc_local, test_loss_local (rank 0's local model L)

Other kinds: ``start`` (run start or resume: world size, backend, progress strategy,
placement: rank 0's node, threads and GPU and why, steps, config), ``checkpoint`` (when one
is committed: its step, path, reason, ``bytes`` and ``bytes_per_rank`` written, ``copy_s``,
``stall_s`` (the longest a rank's training waited for it), ``write_s`` (the longest writer
thread), ``background``: ssdmpi/checkpoint/writer.py), ``resize`` (resumed on another number of
ranks: ``from_ranks``, ``to_ranks``, ``batch_size`` per rank before and after, ``merged``:
ssdmpi/algos/resize.py), ``stop`` (why the run stopped early, its exit code and, unless it diverged, the
checkpoint to resume from), ``delay`` (``--delay auto`` chose ``delay`` = k at ``step`` from the
warm-up's ``compute_s``, ``allreduce_s`` and ``update_s`` and the probed ``allreduce_cpu_s``:
``ssdmpi/algos/auto_delay.py``). ``ssdmpi plot`` reads these
files; ``--csv`` and ``--tensorboard`` write the step and eval records again for other tools
(ssdmpi/loggers.py).
``summary.txt`` (for people) and ``summary.json`` (for scripts) are written at the end.
"""

from __future__ import annotations

import json
import math
import os
import sys


class MetricsLog:
    """Appends JSON records to ``path``, one line each, flushed at once (rank 0)."""

    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(_clean(record), allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _clean(v):
    """NaN/inf -> None (JSON has no NaN); NumPy scalars -> Python numbers."""
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            v = v.item()
        except (TypeError, ValueError):
            pass
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class Progress:
    """Rank 0's display: a tqdm bar on a terminal, plain lines otherwise (Slurm logs).

    The bar goes to stderr (as tqdm's do); plain lines and messages to stdout (with a bar,
    messages are written through tqdm so they do not break it).

    ``update(step, fields)`` moves the bar to ``step`` (or, without a bar, prints one line
    per call: the trainer calls it every ``--log-every`` steps). ``message(text)`` prints
    a line without breaking the bar. ``enabled=False`` (other ranks) makes all of it silent.
    """

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, bar: bool = True, stream=None):
        self.enabled, self.total, self.stream = enabled, total, stream or sys.stdout
        self._bar = None
        if enabled and bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, file=sys.stderr, unit="step",
                             dynamic_ncols=True, leave=True)

    def update(self, step: int, fields: dict) -> None:
        if not self.enabled:
            return
        text = "  ".join(_fmt(k, v) for k, v in fields.items() if v is not None)
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.refresh()
        else:
            width = len(str(self.total))
            print(f"step {step:>{width}}/{self.total}  {text}", file=self.stream, flush=True)

    def advance(self, step: int) -> None:
        """Move the bar to ``step`` (cheap: tqdm redraws at most a few times a second); no line."""
        if self._bar is not None:
            self._bar.update(step - self._bar.n)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


_LAUNCHERS = ("mpiexec", "mpirun", "mpiexec.hydra", "orterun", "prterun", "hydra_pmi_proxy", "prted", "orted")


def launcher_on_terminal(max_depth: int = 4) -> bool:
    """True when an MPI launcher among this process's ancestors writes to a terminal.

    Under ``mpiexec`` a rank's stderr is a pipe to the launcher, which copies it to its own
    stderr byte for byte; so when ``mpiexec`` itself runs on a terminal (an interactive
    ``mpiexec -n 4 ssdmpi train``) a progress bar renders fine. In batch jobs (Slurm
    output files, pipes) it does not, and plain lines are printed instead. Linux /proc
    only; False elsewhere.
    """
    pid = os.getpid()
    for _ in range(max_depth):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid <= 1:
                return False
            with open(f"/proc/{ppid}/comm", encoding="ascii", errors="replace") as f:
                name = f.read().strip()
            if name in _LAUNCHERS and name not in ("hydra_pmi_proxy", "prted", "orted"):
                return os.readlink(f"/proc/{ppid}/fd/2").startswith(("/dev/pts/", "/dev/tty"))
        except (OSError, ValueError, IndexError):
            return False
        pid = ppid
    return False


def _fmt(key: str, v) -> str:
    if isinstance(v, float):
        if key in ("acc", "test_acc", "local_acc"):
            return f"{key} {v:.2%}"
        return f"{key} {v:.4g}"
    return f"{key} {v}"


def counted(n: int, noun: str) -> str:
    """``"1 rank"``, ``"4 ranks"``: ``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def format_duration(seconds: float) -> str:
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(round(seconds)), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m{s:02d}s" if hours else f"{m}m{s:02d}s"


def write_summary(run_dir: str, summary: dict) -> tuple[str, str]:
    """Write ``summary.json`` and ``summary.txt`` (atomically) and return the text."""
    text = summary_text(summary)
    _atomic_write(os.path.join(run_dir, "summary.json"), json.dumps(_clean(summary), indent=2) + "\n")
    _atomic_write(os.path.join(run_dir, "summary.txt"), text + "\n")
    return text, os.path.join(run_dir, "summary.txt")


def summary_text(s: dict) -> str:
    """The human summary printed at the end of ``ssdmpi train``."""
    lines = [f"ssdmpi train: {s.get('status', 'done')} - {s.get('algo')} on {counted(s.get('world_size'), 'rank')}, "
             f"model {s.get('model')} ({s.get('num_params')} parameters), dataset {s.get('dataset')}"]
    lines.append(f"  steps {s.get('step')} ({s.get('epoch', 0):.2f} epochs), wall time "
                 f"{format_duration(s.get('time', 0.0))}, {s.get('samples_per_s', 0.0):.0f} samples/s")
    if s.get("test_acc") is not None:
        lines.append(f"  test accuracy (global model W): {s['test_acc']:.2%}  "
                     f"loss {s.get('test_loss', float('nan')):.4f}")
    if s.get("test_acc_local") is not None:
        lines.append(f"  test accuracy (rank 0's local model L): {s['test_acc_local']:.2%}")
    if s.get("compute_s") is not None:
        lines.append(f"  per step: compute {s['compute_s'] * 1e3:.2f} ms, "
                     f"in flight {s.get('inflight_s', 0) * 1e3:.2f} ms, "
                     f"exposed wait {s.get('wait_s', 0) * 1e3:.2f} ms, {s.get('bytes_sent', 0) / 1e6:.3f} MB sent")
    if s.get("delay_auto"):
        d = s["delay_auto"]
        merge = f", d = {d['merge_delay']}" if d.get("merge_delay") is not None else ""
        lines.append(f"  delay auto: k = {d.get('delay')}{merge} (chosen at step {d.get('step')}: compute "
                     f"{d.get('compute_s', 0) * 1e3:.1f} ms, allreduce {d.get('allreduce_s', 0) * 1e3:.1f} ms "
                     f"per step, {d.get('allreduce_cpu_s', 0) * 1e3:.1f} ms CPU in flight, update "
                     f"{d.get('update_s', 0) * 1e3:.1f} ms)")
    lines += _breakdown_lines(s)
    if s.get("placement"):
        lines.append(f"  rank 0: {s['placement']}")
    for resize in s.get("resized") or []:
        lines.append(f"  resumed at step {resize['step']} on another number of ranks ({resize['from_ranks']} -> "
                     f"{resize['to_ranks']}): {resize['merged']}")
    if s.get("checkpoint"):
        lines.append(f"  last checkpoint: {s['checkpoint']}")
    lines.append(f"  run directory: {s.get('run_dir')}")
    return "\n".join(lines)


def _breakdown_lines(s: dict) -> list:
    """The summary's step breakdown line (ssdmpi/phases.py), when the run logged one."""
    from ssdmpi.phases import BREAKDOWN, LABELS

    if s.get("step_s") is None or any(s.get(k) is None for k in BREAKDOWN):
        return []
    parts = ", ".join(f"{LABELS[k]} {s[k] * 1e3:.2f}" for k in BREAKDOWN)
    return [f"  step {s['step_s'] * 1e3:.2f} ms = {parts} ms (per step, mean over ranks)"]


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never in place)."""
    _atomic_write(path, text)
