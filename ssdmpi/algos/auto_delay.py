"""``--delay auto``: the delay ``k`` chosen from the SSGD warm-up's own measurements
(docs/ALGORITHM.md section 12).

Contract:

- ``choose_delay(c, T, lo, hi)``: the smallest ``k`` in ``[lo, hi]`` with ``k * c >= T``
  (``hi`` when none is): ``k`` steps of compute ``c`` are enough to hide one allreduce of
  time ``T`` behind them. A pure function.
- ``DelayMeter``: one rank's warm-up measurements. ``add(c, T)`` after every warm-up step
  (``c``: the step's time outside the blocking allreduce, i.e. forward, backward and the global
  update; ``T``: the allreduce's time, from ``comm.stats``); ``choose(comm, step)`` at the
  switch is COLLECTIVE: one ``allreduce_scalars(op="max")`` of each rank's medians over its
  last ``WINDOW`` steps, then ``choose_delay`` of those two agreed floats. Every rank
  computes the same function of the same numbers, so every rank gets the same ``k``,
  however noisy its own clock. The median drops a cold first step and the odd pause; the
  maximum over ranks is the slowest rank's compute, which sets the pace of the delay stage.
- ``DelayChoice``: the result (``k``, the agreed ``compute_s`` and ``allreduce_s``, the step it
  was chosen at, the samples per rank); ``record()`` is its ``kind: delay`` metrics record.

The algorithm (``ssdmpi/algos/base.py``) owns the meter and the choice, checkpoints both
(``state_dict``) and restores them: a run resumed after the choice keeps its ``k`` and never
measures again; one resumed inside the warm-up continues measuring with the samples it had.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

DELAY_RANGE = (1, 32)     # bounds of the chosen k
WINDOW = 20               # the last warm-up steps whose medians decide
MIN_WARMUP_STEPS = 5      # fewer samples than this is not a measurement (the first step is cold)


def choose_delay(c: float, T: float, lo: int = DELAY_RANGE[0], hi: int = DELAY_RANGE[1]) -> int:
    """The smallest ``k`` in ``[lo, hi]`` with ``k * c >= T``; ``hi`` when even ``hi * c < T``.

    ``c``: compute seconds per step (> 0), ``T``: allreduce seconds (>= 0). ``ValueError``
    on non-finite or out-of-range input (the trainer never passes such; a test does).
    """
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise ValueError(f"need integers 1 <= lo <= hi, got lo={lo!r}, hi={hi!r}")
    if not (math.isfinite(c) and math.isfinite(T)) or c <= 0 or T < 0:
        raise ValueError(f"need a finite compute time c > 0 and allreduce time T >= 0, got c={c!r}, T={T!r}")
    if T > hi * c:
        return hi
    k = max(1, math.ceil(T / c))
    # T / c rounds: keep the defining inequality exact in floating point
    while k > 1 and (k - 1) * c >= T:
        k -= 1
    while k * c < T:
        k += 1
    return max(lo, min(hi, k))


@dataclass(frozen=True)
class DelayChoice:
    """What ``--delay auto`` chose, the same on every rank."""

    k: int
    compute_s: float      # max over ranks of the median compute seconds per warm-up step
    allreduce_s: float    # max over ranks of the median allreduce seconds per warm-up step
    step: int             # iterations done when k was chosen (T_w)
    samples: int          # warm-up steps the medians are over (the smallest count of any rank)

    def record(self) -> dict:
        """The ``kind: delay`` metrics record (ssdmpi/metrics.py)."""
        return {"kind": "delay", "step": self.step, "delay": self.k, "compute_s": self.compute_s,
                "allreduce_s": self.allreduce_s, "samples": self.samples, "range": list(DELAY_RANGE)}

    def text(self) -> str:
        """One line for the display and the summary."""
        return (f"delay auto: k = {self.k} (chosen at step {self.step}: compute {self.compute_s * 1e3:.1f} ms, "
                f"allreduce {self.allreduce_s * 1e3:.1f} ms per step; median of {self.samples} warm-up steps, "
                f"slowest rank; smallest k in {DELAY_RANGE[0]}-{DELAY_RANGE[1]} with k*compute >= allreduce)")

    def state(self) -> dict:
        """Plain scalars for the checkpoint (``auto.*`` keys of the algorithm's state)."""
        return {"auto.k": self.k, "auto.compute_s": self.compute_s, "auto.allreduce_s": self.allreduce_s,
                "auto.step": self.step, "auto.samples": self.samples}

    @classmethod
    def from_state(cls, d: dict) -> DelayChoice:
        return cls(int(d["auto.k"]), float(d["auto.compute_s"]), float(d["auto.allreduce_s"]),
                   int(d["auto.step"]), int(d["auto.samples"]))


class DelayMeter:
    """This rank's last ``WINDOW`` warm-up measurements ``(compute_s, allreduce_s)``."""

    def __init__(self, window: int = WINDOW):
        self.window = int(window)
        self.samples: list = []

    def add(self, compute_s: float, allreduce_s: float) -> None:
        self.samples.append((max(0.0, float(compute_s)), max(0.0, float(allreduce_s))))
        del self.samples[:-self.window]

    def choose(self, comm, step: int) -> DelayChoice:
        """Collective (every rank, at the switch): the agreed ``DelayChoice``."""
        return decide(comm.allreduce_scalars(self.summary(), op="max"), step)

    def summary(self) -> dict:
        """This rank's side of the agreement: its medians, and ``-n`` (so the max is the fewest samples)."""
        n = len(self.samples)
        return {"c": statistics.median(s[0] for s in self.samples) if n else 0.0,
                "T": statistics.median(s[1] for s in self.samples) if n else 0.0, "fewest": -n}

    def state_dict(self) -> dict:
        """``auto.samples``: an ``(n, 2)`` float64 array (absent when there is none yet)."""
        import numpy as np

        return {"auto.samples": np.array(self.samples, dtype=np.float64).reshape(-1, 2)} if self.samples else {}

    def load_state_dict(self, d: dict) -> None:
        import numpy as np

        rows = np.asarray(d.get("auto.samples", np.zeros((0, 2))), dtype=np.float64).reshape(-1, 2)
        self.samples = [(float(a), float(b)) for a, b in rows][-self.window:]


def decide(agreed: dict, step: int) -> DelayChoice:
    """The choice from ``DelayMeter.summary()`` reduced with ``max`` over ranks (the same on every rank)."""
    c, T, fewest = float(agreed["c"]), float(agreed["T"]), int(-agreed["fewest"])
    # A clock too coarse to see the compute (c = 0) means compute is negligible: the longest delay.
    k = choose_delay(c, T) if c > 0 else (DELAY_RANGE[0] if T <= 0 else DELAY_RANGE[1])
    return DelayChoice(k=k, compute_s=c, allreduce_s=T, step=int(step), samples=fewest)
