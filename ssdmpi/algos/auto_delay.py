"""``--delay auto``: the period ``k`` and the merge delay ``d`` of a period rule that has one (its spec's
``auto_chooses``) chosen from the SSGD warm-up's own measurements (docs/ALGORITHM.md section 12).

Contract:

- ``choose_period(c, T, W=0, lo, hi, stable, d)``: ``(k, d)``. **Hide**: ``d`` is the smallest
  ``d`` in ``[lo, hi]`` with ``d * c >= (1 + SLACK) * T`` (``hi`` when none is; or the ``d`` given):
  the ``d`` steps of compute ``c`` between posting a period's sum and merging it cover one
  allreduce of time ``T`` with a margin (while the allreduce is in flight the compute that hides
  it runs slower: the cores and the memory are shared with the transfer). **Amortise**: ``k`` is
  at least the smallest ``k`` with ``c + W/k <= (1 + SLACK) * (c + W/hi)``: the work ``W`` that
  every period adds to its ``k`` steps costs each step at most ``SLACK`` more than at the longest
  period. ``W`` is the CPU time an allreduce in flight takes from this rank's compute (MPI's
  progress work, done inside the compute thread's ``progress()`` calls on a node without a spare
  core) plus the period-end update (a pass over the model's buffers, measured as the warm-up's
  global update); ``W = 0``: no such cost. **Stable**: ``k`` is the smallest such ``k >= d`` with
  ``stable(k, d)``; when no ``k <= hi`` is, the next smaller ``d`` is tried (part of the allreduce
  exposed rather than an unstable pair: the exposed wait ``T - d c`` then counts in ``W``, so the
  period amortises it too); when none is, the longest stable ``k`` below the amortising one with
  the smallest ``d`` (``lo``, or the given ``d``), and when there is none either, the amortising
  ``k`` with that ``d``. Pure.
- ``stable_region(linear_map, mu, chosen, fixed)``: the predicate ``stable(k, d)`` the trainer uses: the
  rule's (one with a merge delay, ``RuleSpec.auto_chooses`` = ``chosen``) pair's largest stable ``eta*h``
  in its linear map (``RuleSpec.linear_map``, with the run's values of its other settings ``fixed``,
  scanned in steps of ``AUTO_SCAN_STEP``) is at least ``AUTO_STABILITY`` times momentum SGD's own,
  ``2 (1 + mu)``.
- ``probe_cpu(comm, buf, repeats, compressor)``: COLLECTIVE. This rank's thread CPU seconds per allreduce
  of ``buf`` started with ``allreduce_start`` and polled every millisecond with ``test()``
  (the median of ``repeats``): the work that moves the data, without the waiting (a blocking
  wait spins, so its CPU time is its wall time and says nothing). ``compressor``: the run's
  ``--comm-dtype`` (its encoding and shard sums are CPU work too).
- ``probe_ratio(comm, buf, compressor, repeats)``: COLLECTIVE. How much longer (or shorter) a sum of
  ``buf`` takes in ``--comm-dtype`` than in float32: the ratio of the two medians of ``repeats``
  timed allreduces each (start to wait, interleaved, slowest rank). The warm-up measures the float32
  allreduce its steps make; the period's posts travel compressed: ``choose`` scales ``T`` by this
  measured ratio (not the byte ratio: the encoding, the shard sums and the two collectives' latency
  are in it too).
- ``DelayMeter``: one rank's warm-up measurements. ``add(c, T, u)`` after every warm-up step
  (``c``: the step's time outside the blocking allreduce, i.e. forward, backward and the global
  update; ``T``: the allreduce's time, from ``comm.stats``; ``u``: the global update's part of
  ``c``); ``choose(comm, step, probe)`` at the switch is COLLECTIVE: one
  ``allreduce_scalars(op="max")`` of each rank's medians over its
  last ``WINDOW`` steps; with ``ratio`` (a callable, ``probe_ratio``: ``--comm-dtype``), ``T`` times the
  agreed ratio; then, with ``probe`` (a callable ``fraction -> CPU seconds``, see
  ``probe_cpu``), ``PROBE_REPEATS`` probe allreduces of the fraction ``q = min(1, c / T)`` of
  the gradient (so that a probe takes about one step of time) and a second
  ``allreduce_scalars(op="max")`` of their CPU time, giving ``cpu_s = cpu / q``; then
  ``choose_delay(c, T, cpu_s + u)``. Every rank computes the same function of the same numbers, so
  every rank gets the same ``k``, however noisy its own clock. The median drops a cold first
  step and the odd pause; the maximum over ranks is the slowest rank, which sets the pace.
- ``DelayChoice``: the result (``k``, ``d``, the agreed ``compute_s``, ``allreduce_s`` (the period's
  sum: the warm-up's float32 time times ``comm_ratio``), ``cpu_s`` and ``update_s``, the step it was
  chosen at, the samples per rank, the largest ``k`` allowed, ``comm_ratio``);
  ``record()`` is its ``kind: delay`` metrics record.

``hi`` is ``--delay-max`` (default ``DELAY_RANGE[1]``): a cap on the period. Every condition is
then judged within ``[1, hi]`` (amortise against ``k = hi``), so a cap below what hiding needs
leaves part of the allreduce exposed. ``--merge-delay D`` fixes ``d``; auto then chooses ``k``.

The algorithm (``ssdmpi/algos/ssd.py``'s ``SSDPeriod``) owns the meter and the choice, checkpoints both
(``state_dict``) and restores them: a run resumed after the choice keeps its ``k`` and never
measures again; one resumed inside the warm-up continues measuring with the samples it had.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

DELAY_RANGE = (1, 32)     # bounds of the chosen k (the upper one unless --delay-max sets another)
WINDOW = 20               # the last warm-up steps whose medians decide
MIN_WARMUP_STEPS = 5      # fewer samples than this is not a measurement (the first step is cold)
SLACK = 0.05              # hide with this margin; amortise: a step may cost this much more than at k = hi
PROBE_REPEATS = 3         # probe allreduces at the switch (their median CPU time counts)
PROBE_POLL_S = 0.001      # how often a probe is polled: the sleeps are what its CPU time leaves out
AUTO_STABILITY = 0.5      # a chosen (k, d) is stable up to this fraction of momentum SGD's 2 (1 + mu)
AUTO_SCAN_STEP = 0.01     # the stability scan's relative step for the choice (the published map: 0.2%)


def _check(c: float, T: float, W: float, lo: int, hi: int) -> None:
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise ValueError(f"need integers 1 <= lo <= hi, got lo={lo!r}, hi={hi!r}")
    if not (math.isfinite(c) and math.isfinite(T) and math.isfinite(W)) or c <= 0 or T < 0 or W < 0:
        raise ValueError(f"need a finite compute time c > 0, allreduce time T >= 0 and CPU time W >= 0, "
                         f"got c={c!r}, T={T!r}, W={W!r}")


def steps_to_hide(c: float, T: float, most: int | None = None) -> int:
    """The fewest steps of compute ``c`` (> 0) that hide an allreduce of ``T`` seconds with the margin
    ``SLACK``: the smallest ``j >= 1`` with ``j c >= (1 + SLACK) T``; ``most`` where more would be
    needed (also where ``T / c`` is too large to count)."""
    cover = (1 + SLACK) * T
    if most is not None and not cover / c <= most:
        return most
    j = max(1, math.ceil(cover / c))
    while j * c < cover:
        j += 1
    while j > 1 and (j - 1) * c >= cover:
        j -= 1
    return j if most is None else min(j, most)


def choose_period(c: float, T: float, W: float = 0.0, lo: int = DELAY_RANGE[0], hi: int = DELAY_RANGE[1],
                  stable=None, d: int | None = None) -> tuple[int, int]:
    """``(k, d)``: ``d`` hides the allreduce, ``k >= d`` amortises the per-period work and is
    ``stable(k, d)`` (see the module docstring; ``stable`` default: every pair).

    ``c``: compute seconds per step (> 0), ``T``: allreduce seconds (>= 0), ``W``: seconds of work
    each period adds (>= 0); ``d``: a fixed merge delay in ``[lo, hi]`` (``--merge-delay``).
    ``ValueError`` on non-finite or out-of-range input (the trainer never passes such; a test does).
    """
    _check(c, T, W, lo, hi)
    if d is not None and not (isinstance(d, int) and lo <= d <= hi):
        raise ValueError(f"need a merge delay d in [{lo}, {hi}], got {d!r}")
    stable = stable or (lambda k, d: True)
    if d is None:
        d_hide = max(steps_to_hide(c, T, most=hi), lo)
        delays = range(d_hide, lo - 1, -1)
    else:
        delays = [d]

    def amortising(dd: int) -> int:
        work = W + max(0.0, T - dd * c)           # the wait d steps do not hide is per-period work too
        return next((k for k in range(lo, hi + 1) if c + work / k <= (1 + SLACK) * (c + work / hi)), hi)

    for dd in delays:
        for k in range(max(amortising(dd), dd), hi + 1):
            if stable(k, dd):
                return k, dd
    dd = delays[-1]
    shorter = [k for k in range(max(amortising(dd), dd) - 1, dd - 1, -1) if stable(k, dd)]
    return (shorter[0] if shorter else max(amortising(dd), dd)), dd


def stable_region(linear_map, mu: float, chosen: str, fixed: dict | None = None):
    """``stable(k, d)`` of ``--delay auto`` at momentum ``mu``: the rule's ``linear_map`` (its spec's, with
    its setting ``chosen`` = ``d`` and the others at their values ``fixed``, e.g. the momentum merge) at
    ``(k, d)`` is stable in the linear model for every ``eta*h`` up to ``AUTO_STABILITY * 2 (1 + mu)``
    (scanned from ``stability.X_MIN`` in steps of ``AUTO_SCAN_STEP``, and at the bound itself)."""
    fixed = dict(fixed or {})

    @functools.cache
    def stable(k: int, d: int) -> bool:
        from ssdmpi.algos import stability  # NumPy: late (the CLI parser imports this module)

        bound = AUTO_STABILITY * 2 * (1 + mu)
        x = stability.grid(stability.X_MIN, bound, AUTO_SCAN_STEP)
        x = x if x[-1] >= bound else list(x) + [bound]
        T = stability.period_map(linear_map, x, k, mu=mu, **fixed, **{chosen: d})
        return bool((stability.spectral_radius(T) <= 1 + stability.TOL).all())

    return lambda k, d: stable(int(k), int(d))


def probe_ratio(comm, buf, compressor, repeats: int = PROBE_REPEATS) -> float:
    """COLLECTIVE: the median time of a compressed sum of ``buf`` (with ``compressor``, scratch error
    feedback) over the median time of a float32 one, each timed start to wait after a barrier,
    interleaved, the slowest rank's medians (the same ratio on every rank)."""
    import time

    times = {None: [], "compressed": []}
    for _ in range(repeats):
        for key, c in ((None, None), ("compressed", compressor)):
            comm.barrier()
            start = time.perf_counter()
            (comm.allreduce_start(buf, average=False, compressor=c) if c is not None
             else comm.allreduce_start(buf, average=False)).wait()
            times[key].append(time.perf_counter() - start)
    agreed = comm.allreduce_scalars({"f32": statistics.median(times[None]),
                                     "compressed": statistics.median(times["compressed"])}, op="max")
    return agreed["compressed"] / agreed["f32"] if agreed["f32"] > 0 else 1.0


def probe_cpu(comm, buf, repeats: int = PROBE_REPEATS, compressor=None) -> float:
    """COLLECTIVE: the median over ``repeats`` of this rank's thread CPU seconds for one allreduce
    of ``buf`` (a sum; ``buf``'s contents are overwritten) started with ``comm.allreduce_start``
    and polled with ``test()`` every ``PROBE_POLL_S`` until done. Under ``--progress test`` the data
    moves inside those calls, so this is the CPU time the allreduce takes from the thread that
    drives it; under ``blocking`` the start itself spins until done (the CPU time is the wall time)."""
    import time

    cpu = []
    for _ in range(repeats):
        comm.barrier()                     # every rank starts together: no time spent waiting for a late one
        start = time.thread_time()
        handle = (comm.allreduce_start(buf, average=False, compressor=compressor) if compressor is not None
                  else comm.allreduce_start(buf, average=False))
        while not handle.test():
            time.sleep(PROBE_POLL_S)
        handle.wait()
        cpu.append(time.thread_time() - start)
    return statistics.median(cpu)


@dataclass(frozen=True)
class DelayChoice:
    """What ``--delay auto`` chose, the same on every rank."""

    k: int
    compute_s: float      # max over ranks of the median compute seconds per warm-up step
    allreduce_s: float    # max over ranks of the median allreduce seconds per warm-up step, x comm_ratio
    step: int             # iterations done when k was chosen (T_w)
    samples: int          # warm-up steps the medians are over (the smallest count of any rank)
    cpu_s: float = 0.0    # CPU seconds one allreduce in flight takes from the compute (probed; slowest rank)
    update_s: float = 0.0  # seconds of the global update per warm-up step (the period-end pass's stand-in)
    hi: int = DELAY_RANGE[1]  # the largest k it could choose (--delay-max)
    d: int | None = None  # the merge delay (None: a checkpoint from before auto chose one)
    comm_ratio: float = 1.0  # --comm-dtype's measured time over float32's (probe_ratio; 1: float32)

    def record(self) -> dict:
        """The ``kind: delay`` metrics record (ssdmpi/metrics.py): ``delay`` the period k, ``window`` the merge
        delay d (the steps between a period's post and its merge, the rule's setting that auto chose)."""
        return {"kind": "delay", "step": self.step, "delay": self.k, "window": self.d,
                "compute_s": self.compute_s, "allreduce_s": self.allreduce_s, "allreduce_cpu_s": self.cpu_s,
                "update_s": self.update_s, "samples": self.samples, "range": [DELAY_RANGE[0], self.hi],
                "comm_ratio": self.comm_ratio}

    def text(self) -> str:
        """One line for the display and the summary."""
        return (f"delay auto: k = {self.k}, d = {self.d} (chosen at step {self.step}: compute "
                f"{self.compute_s * 1e3:.1f} ms, allreduce {self.allreduce_s * 1e3:.1f} ms per step"
                f"{f' (float32 x {self.comm_ratio:.2f}, measured)' if self.comm_ratio != 1.0 else ''}, "
                f"{self.cpu_s * 1e3:.1f} ms CPU in flight, update {self.update_s * 1e3:.1f} ms; median of "
                f"{self.samples} warm-up steps, slowest rank; d: the smallest with d*compute >= "
                f"{1 + SLACK:g}*allreduce, k in {DELAY_RANGE[0]}-{self.hi}: the smallest whose per-period CPU and "
                f"update cost a step at most {SLACK:.0%} more than at k = {self.hi} and whose (k, d) is stable "
                f"in the linear model up to {AUTO_STABILITY:g} of momentum SGD's lr x curvature)")

    def state(self) -> dict:
        """Plain scalars for the checkpoint (``auto.*`` keys of the algorithm's state)."""
        return {"auto.k": self.k, "auto.compute_s": self.compute_s, "auto.allreduce_s": self.allreduce_s,
                "auto.step": self.step, "auto.samples": self.samples, "auto.cpu_s": self.cpu_s,
                "auto.update_s": self.update_s, "auto.hi": self.hi,
                **({"auto.d": self.d} if self.d is not None else {}),
                **({"auto.comm_ratio": self.comm_ratio} if self.comm_ratio != 1.0 else {})}

    @classmethod
    def from_state(cls, d: dict) -> DelayChoice:
        """From ``state()``; a checkpoint written before the probe existed has no ``auto.cpu_s`` or
        ``auto.update_s`` (0: its ``k`` came from the hide rule alone), one written before
        ``--delay-max`` no ``auto.hi`` (it was ``DELAY_RANGE[1]``), one written before the merge
        delay no ``auto.d`` (None)."""
        return cls(int(d["auto.k"]), float(d["auto.compute_s"]), float(d["auto.allreduce_s"]),
                   int(d["auto.step"]), int(d["auto.samples"]), float(d.get("auto.cpu_s", 0.0)),
                   float(d.get("auto.update_s", 0.0)), int(d.get("auto.hi", DELAY_RANGE[1])),
                   int(d["auto.d"]) if "auto.d" in d else None, float(d.get("auto.comm_ratio", 1.0)))


class DelayMeter:
    """This rank's last ``WINDOW`` warm-up measurements ``(compute_s, allreduce_s, update_s)``;
    ``hi``: the largest ``k`` to choose (``--delay-max``); ``d``: a fixed merge delay, or None to choose
    it; ``stable(k, d)``: the rule's stable region (``stable_region``)."""

    def __init__(self, window: int = WINDOW, hi: int = DELAY_RANGE[1], d: int | None = None, *, stable):
        self.window = int(window)
        self.hi = int(hi)
        self.d, self.stable = d, stable
        self.samples: list = []

    def add(self, compute_s: float, allreduce_s: float, update_s: float = 0.0) -> None:
        self.samples.append((max(0.0, float(compute_s)), max(0.0, float(allreduce_s)), max(0.0, float(update_s))))
        del self.samples[:-self.window]

    def choose(self, comm, step: int, probe=None, ratio=None) -> DelayChoice:
        """Collective (every rank, at the switch): the agreed ``DelayChoice``. ``probe(fraction)``:
        this rank's CPU seconds per allreduce of that fraction of the gradient (``probe_cpu``);
        without one, ``W = 0``. ``ratio()``: the period's sums' time over the warm-up's float32
        allreduce's (``probe_ratio``, the same on every rank); without one, 1."""
        agreed = comm.allreduce_scalars(self.summary(), op="max")
        if ratio is not None:
            r = float(ratio())
            agreed = dict(agreed, T=agreed["T"] * r, ratio=r)
        c, T = agreed["c"], agreed["T"]
        if probe is not None and T > 0:
            fraction = min(1.0, c / T) if c > 0 else 1.0      # the same on every rank: agreed inputs
            cpu = comm.allreduce_scalars({"cpu": probe(fraction)}, op="max")["cpu"]
            agreed = dict(agreed, cpu=cpu / fraction)
        return decide(agreed, step, self.hi, self.d, stable=self.stable)

    def summary(self) -> dict:
        """This rank's side of the agreement: its medians, and ``-n`` (so the max is the fewest samples)."""
        n = len(self.samples)

        def median(i):
            return statistics.median(s[i] for s in self.samples) if n else 0.0

        return {"c": median(0), "T": median(1), "u": median(2), "fewest": -n}

    def state_dict(self) -> dict:
        """``auto.samples``: an ``(n, 3)`` float64 array (absent when there is none yet)."""
        import numpy as np

        return {"auto.samples": np.array(self.samples, dtype=np.float64).reshape(-1, 3)} if self.samples else {}

    def load_state_dict(self, d: dict) -> None:
        """Also reads the ``(n, 2)`` samples of checkpoints written before ``update_s`` (taken as 0)."""
        import numpy as np

        rows = np.asarray(d.get("auto.samples", np.zeros((0, 3))), dtype=np.float64)
        width = rows.shape[-1] if rows.ndim == 2 else 3
        self.samples = [tuple(float(v) for v in row) + (0.0,) * (3 - width)
                        for row in rows.reshape(-1, width)][-self.window:]


def decide(agreed: dict, step: int, hi: int = DELAY_RANGE[1], d: int | None = None, *, stable) -> DelayChoice:
    """The choice in ``[DELAY_RANGE[0], hi]`` from ``DelayMeter.summary()`` reduced with ``max``
    over ranks, plus the probed ``cpu`` when there is one and the ``ratio`` ``T`` was scaled by
    (``--comm-dtype``), the same on every rank; ``d`` a fixed
    merge delay (None: chosen), ``stable(k, d)`` the rule's stable region (``stable_region``)."""
    c, T, fewest = float(agreed["c"]), float(agreed["T"]), int(-agreed["fewest"])
    cpu, u = max(0.0, float(agreed.get("cpu", 0.0))), max(0.0, float(agreed.get("u", 0.0)))
    lo = DELAY_RANGE[0]
    d = None if d is None else min(max(int(d), lo), hi)
    # A clock too coarse to see the compute (c = 0): nothing hides the allreduce in any d; as if a
    # step took one nanosecond.
    k, d = choose_period(max(c, 1e-9), T, cpu + u, lo, hi, stable, d)
    return DelayChoice(k=k, compute_s=c, allreduce_s=T, step=int(step), samples=fewest, cpu_s=cpu, update_s=u,
                       hi=hi, d=d, comm_ratio=float(agreed.get("ratio", 1.0)))
