"""What a training run tells its user: ``metrics.jsonl``, the progress display, the summary.

Everything here runs on rank 0 only (the trainer reduces numbers over the control
communicator first). ``metrics.jsonl`` holds one JSON object per line, appended and
flushed as it happens, so a crashed or preempted run keeps what it logged (a resumed
run appends to the same file). Two kinds of record:

``{"kind": "step", ...}`` every ``--log-every`` steps, averaged over the interval and ranks:
    step (iterations done), epoch (fractional), stage (``sync`` for ssgd, which has no delay stage;
    ``warmup`` then ``delay`` for the others, ``warmup`` then ``async`` for asgd),
    time (wall seconds of the run so far, across resumes, including evaluations and
    checkpoints), train_s (the same counting training steps only), loss (mean training loss),
    lr, lr_local, samples_per_s (all ranks), step_s (wall seconds per step),
    compute_s / inflight_s / wait_s (per step, mean over ranks: computing, an allreduce
    in flight, blocked waiting for one), bytes_sent (per step per rank, on the wire), overlap (fraction
    of in-flight time hidden behind compute), and the step breakdown that sums to step_s:
    fb_s, update_s, data_s, blocked_s, progress_s, sync_s, other_s (ssdmpi/phases.py defines them);
    with asgd the times and bytes are the workers'
    (the servers take no steps) and staleness_mean / staleness_max (over the interval's
    server updates, ALGORITHM.md 11) are added; a language model's (a text dataset's) adds
    tokens_per_s (samples_per_s x the context) after samples_per_s; built by
    ``ssdmpi.run.loop.step_record``
``{"kind": "eval", ...}`` after each evaluation on the test split:
    step, epoch, stage, time, train_s, eval_s (the seconds this evaluation took), test_acc, test_loss
    (the global model W), and in the delay stage test_acc_local, test_loss_local (rank 0's local model L);
    a language model's on the validation windows: tokens (trained on so far: step x global batch x
    context) before eval_s, then val_loss (nats per token), val_ppl (perplexity, exp(val_loss)),
    val_acc (next-token accuracy), and in the delay stage val_loss_local, val_ppl_local, val_acc_local

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
``summary.txt`` (for people) and ``summary.json`` (for scripts) are written at the end. Besides the
run's description, its last evaluation and its per-step means, ``summary.json`` holds ``time`` (wall
seconds to the last step, across resumes), ``wall_s`` (the same to the end: the final evaluation and
checkpoint included), ``train_s`` (training steps only) and ``eval_s`` (evaluations), ``samples_per_s``
(training steps only, all ranks), ``best`` (the best evaluation: ``metric``, ``value``, ``step``;
``best_eval``) and ``stage``; a language model's also ``tokens_per_s`` and ``tokens`` (trained on).
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
    """Rank 0's display, on ``stream`` (stdout): messages (the evaluation lines, notes), step lines
    when ``step_lines`` (the trainer asks for them when ``--log-every`` is given), and, when ``bar``
    is asked for and ``stream`` is a terminal whose width is known (``terminal_width``), a progress
    bar that redraws in place on one line (messages are written above it, so they do not break it).

    Under ``mpiexec`` a rank's stdout is a pipe to the launcher even when the launcher writes to a
    terminal: its width is unknown there, a bar longer than the terminal wraps and every redraw
    scrolls, so there is no bar and no carriage return; the evaluation lines say how far the run is.

    ``update(step, fields)`` (every ``--log-every`` steps) sets the bar's figures and prints the step
    line; ``advance(step)`` only moves the bar; ``message(text)`` prints a line. ``enabled=False``
    (other ranks) makes all of it silent.
    """

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, bar: bool = True, stream=None,
                 step_lines: bool = False):
        self.enabled, self.total, self.stream = enabled, total, stream or sys.stdout
        self.step_lines = step_lines
        self._bar = None
        width = terminal_width(self.stream) if enabled and bar else None
        if width is not None:
            from tqdm import tqdm

            # dynamic_ncols follows a resized terminal; it asks the terminal itself, so only where
            # the terminal answers (a width from $COLUMNS stays fixed). nrows: a terminal that gives
            # no size would otherwise make tqdm hide its one bar as if it were below the screen.
            self._bar = tqdm(total=total, initial=initial, file=self.stream, unit="step", ncols=width,
                             dynamic_ncols=_asked_width(self.stream) is not None, nrows=24, leave=True,
                             bar_format="{percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}"
                                        "{postfix}]")

    def update(self, step: int, fields: dict) -> None:
        if not self.enabled:
            return
        text = "  ".join(_fmt(k, v) for k, v in fields.items() if v is not None)
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.refresh()
        if self.step_lines:
            width = len(str(self.total))
            self.message(f"step {step:>{width}}/{self.total}  {text}")

    def advance(self, step: int) -> None:
        """Move the bar to ``step`` (cheap: tqdm redraws at most a few times a second); no line."""
        if self._bar is not None:
            self._bar.update(step - self._bar.n)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    @property
    def has_bar(self) -> bool:
        return self._bar is not None

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def terminal_width(stream) -> int | None:
    """The width in columns of the terminal ``stream`` writes to; None when ``stream`` is not a
    terminal (a pipe, a file) or the terminal does not say. The terminal's own answer, else
    ``$COLUMNS``; never a guess (``shutil.get_terminal_size`` answers 80 when it does not know)."""
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError, OSError):
        return None
    asked = _asked_width(stream)
    if asked is not None:
        return asked
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def _asked_width(stream) -> int | None:
    """The terminal's own answer for its width (TIOCGWINSZ); None when it gives none (or 0)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return None
    return columns if columns > 0 else None


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
    """The human summary printed at the end of ``ssdmpi train`` (from ``summary.json``'s fields)."""
    lines = [f"ssdmpi train: {s.get('status', 'done')} - {s.get('algo')} on {counted(s.get('world_size'), 'rank')}, "
             f"model {s.get('model')} ({s.get('num_params')} parameters), dataset {s.get('dataset')}"]
    lines.append("  " + _time_line(s))
    if s.get("tokens_per_s") is not None:
        lines.append(f"  tokens/s (training only, all ranks): {s['tokens_per_s']:.0f} ({s['samples_per_s']:.1f} "
                     f"windows/s), {s.get('tokens', 0):,} tokens trained on")
    elif s.get("samples_per_s") is not None:
        lines.append(f"  samples/s (training only, all ranks): {s['samples_per_s']:.0f}")
    if s.get("val_loss") is not None:
        best = f", best {best_text(s['best'])}" if s.get("best") else ""
        lines.append(f"  validation loss (global model W): final {s['val_loss']:.4f} nats/token, perplexity "
                     f"{s.get('val_ppl', float('nan')):.2f}{best}")
    if s.get("val_loss_local") is not None:
        lines.append(f"  validation loss (rank 0's local model L): final {s['val_loss_local']:.4f}, perplexity "
                     f"{s.get('val_ppl_local', float('nan')):.2f}")
    if s.get("test_acc") is not None:
        best = f", best {best_text(s['best'])}" if s.get("best") else ""
        lines.append(f"  test accuracy (global model W): final {s['test_acc']:.2%} "
                     f"(loss {s.get('test_loss', float('nan')):.4f}){best}")
    if s.get("test_acc_local") is not None:
        lines.append(f"  test accuracy (rank 0's local model L): final {s['test_acc_local']:.2%}")
    if s.get("compute_s") is not None:
        lines.append(f"  per step (mean over ranks): compute {s['compute_s'] * 1e3:.2f} ms, "
                     f"in flight {s.get('inflight_s', 0) * 1e3:.2f} ms, "
                     f"exposed wait {s.get('wait_s', 0) * 1e3:.2f} ms, {s.get('bytes_sent', 0) / 1e6:.3f} MB sent")
    lines += _breakdown_lines(s)
    if s.get("delay_auto"):
        lines.append("  " + delay_auto_line(s["delay_auto"]))
    if s.get("placement"):
        lines.append(f"  rank 0: {s['placement']}")
    for resize in s.get("resized") or []:
        lines.append(f"  resumed at step {resize['step']} on another number of ranks ({resize['from_ranks']} -> "
                     f"{resize['to_ranks']}): {resize['merged']}")
    if s.get("checkpoint"):
        lines.append(f"  last checkpoint: {s['checkpoint']}")
    lines.append(f"  run directory: {s.get('run_dir')}")
    return "\n".join(lines)


def _time_line(s: dict) -> str:
    """``steps 440 (20.00 epochs) in 1.9 s: training 1.2 s, evaluation 0.4 s, checkpoints and other 0.3 s``:
    the run's wall time (``wall_s``, else ``time``) and, where the summary has them, its parts."""
    wall = float(s.get("wall_s", s.get("time")) or 0.0)
    text = f"steps {s.get('step')} ({s.get('epoch', 0):.2f} epochs) in {format_duration(wall)}"
    parts = [(name, float(s[key])) for key, name in (("train_s", "training"), ("eval_s", "evaluation"))
             if s.get(key) is not None]
    if not parts:
        return text
    parts.append(("checkpoints and other", max(0.0, wall - sum(seconds for _, seconds in parts))))
    return text + ": " + ", ".join(f"{name} {format_duration(seconds)}" for name, seconds in parts)


def delay_auto_line(d: dict) -> str:
    """The line saying what ``--delay auto`` chose, from its ``kind: delay`` record (the display and the
    summary; the rule itself: docs/ALGORITHM.md section 12)."""
    merge = f", d = {d['window']}" if d.get("window") is not None else ""
    return (f"delay auto: k = {d.get('delay')}{merge} (chosen at step {d.get('step')}: compute "
            f"{d.get('compute_s', 0) * 1e3:.1f} ms, allreduce {d.get('allreduce_s', 0) * 1e3:.1f} ms "
            f"per step, {d.get('allreduce_cpu_s', 0) * 1e3:.1f} ms CPU in flight, update "
            f"{d.get('update_s', 0) * 1e3:.1f} ms)")


# Which evaluation of a run is its best: metric -> True where higher is better. The first metric an
# evaluation record carries decides: a classifier's test accuracy, a language model's validation loss.
BEST_METRICS = {"test_acc": True, "val_loss": False}


def best_eval(evals, best: dict | None = None) -> dict | None:
    """The best of the evaluation records ``evals`` (oldest first), after ``best`` (the best so far, or
    None): ``{"metric", "value", "step"}`` by ``BEST_METRICS``; a tie goes to the later evaluation (as
    the checkpoints' ``best`` link does). None when no record carries a metric."""
    for record in evals:
        metric = next((m for m in BEST_METRICS if record.get(m) is not None), None)
        if metric is None:
            continue
        value = float(record[metric])
        if best is None or best.get("metric") != metric or (
                value >= best["value"] if BEST_METRICS[metric] else value <= best["value"]):
            best = {"metric": metric, "value": value, "step": record.get("step")}
    return best


def best_text(best: dict) -> str:
    """``92.50% at step 572`` (an accuracy), ``val_loss 1.234 at step 572`` (another metric)."""
    value = f"{best['value']:.2%}" if best["metric"] == "test_acc" else f"{best['metric']} {best['value']:.4g}"
    return f"{value} at step {best.get('step')}"


def _breakdown_lines(s: dict) -> list:
    """The summary's step breakdown line (ssdmpi/phases.py), when the run logged one."""
    from ssdmpi.phases import BREAKDOWN, LABELS

    if s.get("step_s") is None or any(s.get(k) is None for k in BREAKDOWN):
        return []
    parts = ", ".join(f"{LABELS[k]} {s[k] * 1e3:.2f}" for k in BREAKDOWN)
    return [f"  step {s['step_s'] * 1e3:.2f} ms = {parts} ms"]


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
