"""Where a training step's time goes: the step breakdown, per rank, cheap enough to leave on.

A step is cut into disjoint phases; the trainer logs their per-step means, averaged over
ranks, in every ``kind: step`` record (``ssdmpi/metrics.py``) and the run summary:

==============  =====================================================================
``fb_s``        forward + backward (``model.loss_and_grad``), without the ``progress()``
                calls the model makes between layers
``update_s``    the rest of ``algo.step``: optimizer and local updates, the buffer copies
                and folds of the algorithm (``algo.step``'s time outside ``fb_s`` and
                outside the Communicator's exposed time)
``data_s``      the loader's next batch (and its dtype cast)
``blocked_s``   exposed communication: blocked in ``allreduce_start`` / ``wait()``
                (``wait_s - progress_s``)
``progress_s``  inside ``Communicator.progress()`` (``--progress test``: the data moves there)
``sync_s``      the trainer's sync points (every ``--log-every`` steps): the metrics' control
                allreduce and the logging. With a request in flight on a slow network the
                control message can wait behind its data, so this is training time too
``other_s``     the step time outside every timer above: the loop's own bookkeeping, the
                batch's host-to-device copy, the loss read-back
==============  =====================================================================

so ``fb_s + update_s + data_s + blocked_s + progress_s + sync_s + other_s = step_s`` for every
record (``other_s`` is what the timers did not cover; it is small when they cover the step).

Cost: a few ``time.perf_counter()`` reads per step, nothing else. No device is ever
synchronised for timing: on a GPU, ``fb_s`` and ``update_s`` are the host's time to
*enqueue* the kernels, and the device time shows up wherever the host next waits for the
device -- the ``backend.synchronize()`` after ssgd's warm-up forward/backward (in ``fb_s``),
a ``wait()`` on an allreduce whose staging copy is not done (exposed wait), or the losses read
back at a sync point (``sync_s``); the delay stage posts its allreduces without waiting for
the GPU (``ssdmpi/comm/transport.py``).
Over a logging interval the sum is still the step time; the split between phases is the
host's view unless the phases themselves synchronise.
"""

from __future__ import annotations

import time

clock = time.perf_counter

# Per-step keys of the breakdown, in display order (each a ``kind: step`` record field).
BREAKDOWN = ("fb_s", "update_s", "data_s", "blocked_s", "progress_s", "sync_s", "other_s")
LABELS = {"fb_s": "forward+backward", "update_s": "update", "data_s": "data", "blocked_s": "exposed wait",
          "progress_s": "progress calls", "sync_s": "sync points", "other_s": "other"}


class Phases:
    """One rank's phase totals since the last ``reset()``: ``fb_s`` and ``update_s``, in seconds.

    The algorithm adds to them (``ssdmpi/algos/base.py``: ``Algorithm.step`` and
    ``Algorithm._loss_and_grad``; ``ssdmpi/algos/asgd.py``: ``ASGD.step``, where a server's
    updates are ``update_s`` and the waits for pushes and replies exposed wait); the trainer
    reads and resets them once per interval.
    """

    __slots__ = ("fb_s", "update_s")

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.fb_s = self.update_s = 0.0

    def time_step(self, stats, iteration, *args):
        """``iteration(*args)``'s result; its time outside ``fb_s`` (which it adds itself) and outside
        the Communicator's exposed time (``stats.wait_s``, progress calls included; ``stats`` None:
        no communicator) is added to ``update_s``."""
        t0, fb0, w0 = clock(), self.fb_s, (stats.wait_s if stats is not None else 0.0)
        out = iteration(*args)
        waited = (stats.wait_s - w0) if stats is not None else 0.0
        self.update_s += (clock() - t0) - (self.fb_s - fb0) - waited
        return out


def breakdown(step_s: float, per_step: dict) -> dict:
    """The ``BREAKDOWN`` fields of one record from per-step means: ``per_step`` holds ``fb_s``,
    ``update_s``, ``data_s``, ``wait_s`` (exposed, progress included), ``progress_s`` and ``sync_s``."""
    progress = per_step["progress_s"]
    out = {"fb_s": per_step["fb_s"], "update_s": per_step["update_s"], "data_s": per_step["data_s"],
           "blocked_s": max(0.0, per_step["wait_s"] - progress), "progress_s": progress,
           "sync_s": per_step.get("sync_s", 0.0)}
    out["other_s"] = step_s - sum(out.values())
    return out
