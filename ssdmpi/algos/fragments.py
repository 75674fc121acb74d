"""Streaming DiLoCo's fragments of the blocking average (``--fragments F``, ``--fragment-delay TAU``,
``--fragment-alpha A``; docs/ALGORITHM.md section 17).

The flat weights are cut into ``F`` contiguous fragments at the model's top-level layer boundaries
(``split``). Within each period of ``k`` local steps (``F`` divides ``k``, ``h = k/F``) fragment ``f``
(``f = 0`` holds the first layers) is synced once, on its own sub-period: with ``q = (m mod k) + 1`` the
local steps done in the period after iteration ``m``'s::

    q = (f+1) h - TAU:   post Iallreduce(sum, L_f) (a copy of it: L goes on training)
    q = (f+1) h:         W_f <- mean_r L_f (the sum posted TAU steps ago, over N)        (the plain average)
                         or the outer step from it: g = W_f - mean_r L_f with the buffer's slice B_f
                         L_f <- W_f + A (L_f - W_f)                          (A = 0: L_f <- W_f, a copy)

so each allreduce carries about ``1/F`` of the model and the network is busy once every ``h`` steps
instead of once a period. ``0 <= TAU < h``: a fragment is posted after at least one local step of its
sub-period and lands before the next fragment is posted, so at most one sum is in flight (the
Communicator takes several; this schedule never needs two). ``TAU = 0`` is a blocking allreduce at
``q = (f+1) h``; with ``F = 1``, ``TAU = 0``, ``A = 0`` this is the plain blocking average of every
period, the same operations on the same buffers (``L`` summed in place, ``divide_copy`` or the outer
optimizer's ``average_step``). ``s += k`` at each period's end, where the last fragment lands.

``A`` mixes the rank's own fragment back in at the merge: ``A = 0`` takes the merged global fragment, and
the ``TAU`` local steps made on that fragment since its post are dropped; ``A > 0`` keeps that share of
the rank's model (Streaming DiLoCo's ``theta <- A theta_local + (1 - A) theta_global``, computed as
above: equal in exact arithmetic, and exactly ``W_f`` at ``A = 0``).

State and resume: a sum in flight at a checkpoint (``drain``) is held as its mean, ``fragments.Rp``
(replicated: the allreduce's result) with ``fragments.held`` its fragment (-1: none), and merged at its
own merge step as if it had just arrived, so a resume mid-flight continues bit for bit. On another
number of ranks the held mean is kept exactly (it is global) and merged at that step into the averaged
``L`` (``resize.averaged``). ``finalize`` (end of training): a sum in flight is merged at once, then every
fragment not equal to ``W_f`` on every rank (one just merged with ``A = 0`` is; with ``F = 1`` that is a
run ending on a period's end) takes one more blocking average, or outer step, from ``mean_r L``.
"""

from __future__ import annotations

import functools

from ssdmpi.errors import UserError
from ssdmpi.spec import ALGORITHM, Setting
from ssdmpi.validate import nonnegative_int, number, positive_int

HELD = "fragments.held"    # the fragment whose mean is held (-1: none) ...
HELD_MEAN = "fragments.Rp"   # ... and that mean, in an algorithm's state (and a checkpoint)


def split(layer_offsets, size: int, count: int) -> list:
    """The ``count`` fragments ``[(lo, hi), ...]`` of a flat buffer of ``size`` elements, each a run of whole
    top-level layers (``layer_offsets``: each layer's first element), in buffer order: of all such cuts, the
    one whose largest fragment is smallest, and of those the one with the earliest cuts. ``UserError`` when
    the model has fewer layers with parameters than ``count``."""
    bounds = sorted({int(o) for o in layer_offsets if 0 <= int(o) < size} | {0}) + [int(size)]
    units = len(bounds) - 1
    if count > units:
        raise UserError(f"--fragments {count} cuts the model at its layers, and this model has {units} with "
                        f"parameters; use --fragments {units} or fewer")
    width = lambda i, j: bounds[j] - bounds[i]     # noqa: E731  (units i..j-1)
    # best[p][i]: the smallest largest fragment of units i.. cut into p fragments
    best = [[None] * (units + 1) for _ in range(count + 1)]
    best[0][units] = 0
    for p in range(1, count + 1):
        for i in range(units - p, -1, -1):
            best[p][i] = min(max(width(i, j), best[p - 1][j]) for j in range(i + 1, units - p + 2)
                             if best[p - 1][j] is not None)
    top, cuts, i = best[count][0], [], 0
    for p in range(count, 0, -1):
        j = next(j for j in range(i + 1, units - p + 2)
                 if best[p - 1][j] is not None and max(width(i, j), best[p - 1][j]) <= top)
        cuts.append((bounds[i], bounds[j]))
        i = j
    return cuts


class Fragments:
    """The fragment schedule (the module docstring) over an algorithm's buffers, in place.

    Args:
        W, L: the global and local weights (1-D); B: the outer optimizer's buffer (None without one);
        mask: the decay mask (the fused passes' plans are built on its slices); cuts: ``split``'s;
        comm: the Communicator; N ranks, period k; outer: the outer optimizer (None: the plain average);
        tau, alpha: ``--fragment-delay``, ``--fragment-alpha``; poll: the fused passes' progress hook.
    """

    def __init__(self, W, L, B, mask, cuts, comm, N: int, k: int, outer, tau: int, alpha: float, poll=None):
        from ssdmpi.optim import fused  # late: the CLI parser reads this module's settings; fused imports NumPy

        self.W, self.L, self.B, self.comm, self.N, self.k = W, L, B, comm, int(N), int(k)
        self.tau, self.alpha, self.cuts, self._fused = int(tau), float(alpha), list(cuts), fused
        h = self.k // len(self.cuts)
        self.merge_at = {(f + 1) * h: f for f in range(len(self.cuts))}        # q -> the fragment merged
        self.post_at = {q - self.tau: f for q, f in self.merge_at.items()} if self.tau else {}
        self._plans = [fused.Plan((mask[lo:hi],), scratch=0) for lo, hi in self.cuts]
        self._outers = None if outer is None else [type(outer)(mask[lo:hi], outer.nesterov, outer.lr, outer.mu)
                                                   for lo, hi in self.cuts]
        for part in self._plans + (self._outers or []):
            part.poll = poll
        # the posted copies (a fragment's slice): only a delayed or mixed merge needs them
        self._send = L.copy() if self.tau or self.alpha else None
        self._handle = self._inflight = self._held = None

    def _slice(self, buf, f: int):
        lo, hi = self.cuts[f]
        return buf[lo:hi]

    def after_step(self, m: int) -> None:
        """After delay iteration ``m``'s local step: the post and the merge due there (collective)."""
        q = m % self.k + 1
        if q in self.post_at:
            f = self.post_at[q]
            buf = self._slice(self._send, f)
            buf[...] = self._slice(self.L, f)
            self._handle, self._inflight = self.comm.allreduce_start(buf, average=False), f
        if q in self.merge_at:
            self._merge(self.merge_at[q])

    def _merge(self, f: int) -> None:
        """Fragment ``f``'s sum (blocking at ``TAU = 0``, else the one in flight or held) lands."""
        if not self.tau and not self.alpha:         # the sum lands in L_f itself, which becomes W_f
            self._land(f, self.comm.allreduce(self._slice(self.L, f), average=False), self.N, in_place=True)
        elif not self.tau:
            buf = self._slice(self._send, f)
            buf[...] = self._slice(self.L, f)
            self._land(f, self.comm.allreduce(buf, average=False), self.N)
        elif self._held == f:
            self._held = None
            self._land(f, self._slice(self._send, f), 1)
        elif self._inflight == f:
            self._land(f, self._complete(), self.N)
        else:
            raise RuntimeError(f"fragment {f} is due to merge, and no sum of it was posted")

    def _complete(self):
        buf, self._handle, self._inflight = self._handle.wait(), None, None
        return buf

    def _land(self, f: int, buf, n: int, in_place: bool = False) -> None:
        """``buf`` holds the sum over ``n`` ranks of fragment ``f`` of their models: ``W_f`` <- its mean (or the
        outer step from it), ``buf = W_f``; then ``L_f`` from ``W_f`` (``in_place``: ``buf`` is ``L_f``)."""
        W, L = self._slice(self.W, f), self._slice(self.L, f)
        if self._outers is None:
            self._fused.divide_copy(self._plans[f], buf, W, n)
        else:
            self._outers[f].average_step(W, self._slice(self.B, f), buf, n)
        if in_place:
            return
        if not self.alpha:
            L[...] = W
        else:                        # L = W + alpha*(L - W)
            L -= W
            L *= self.alpha
            L += W

    def drain(self) -> None:
        """Complete the sum in flight and hold its mean until its merge step (bitwise: nothing reads it
        before)."""
        if self._handle is not None:
            f, buf = self._inflight, self._complete()
            if self.N > 1:
                buf /= self.N
            self._held = f

    def finalize(self, done: int) -> None:
        """End of training, ``done`` delay iterations in: merge a sum in flight or held now, then one more
        average (or outer step) of every fragment not already ``W_f`` on every rank (collective)."""
        self.drain()
        synced = set(range(len(self.cuts))) if done == 0 else set()
        last = self.merge_at.get(done % self.k or self.k) if done else None
        if not self.alpha and last is not None:
            synced.add(last)                                             # merged by the last iteration
        if self._held is not None:
            f = self._held
            self._merge(f)
            if not self.alpha:
                synced.add(f)
        if synced >= set(range(len(self.cuts))):
            return
        if self._outers is None:
            self.comm.allreduce_mean(self.L)
        else:
            self.comm.allreduce(self.L, average=False)
        for f in range(len(self.cuts)):
            W, L = self._slice(self.W, f), self._slice(self.L, f)
            if f in synced:
                L[...] = W
            elif self._outers is None:
                W[...] = L
            else:
                self._outers[f].average_step(W, self._slice(self.B, f), L, self.N)

    def state_dict(self) -> dict:
        """``fragments.held`` and, when one is held, its mean ``fragments.Rp`` (live views; after ``drain``).
        Nothing at ``TAU = 0``: a blocking merge leaves nothing in flight."""
        if not self.tau:
            return {}
        d = {HELD: -1 if self._held is None else int(self._held)}
        if self._held is not None:
            d[HELD_MEAN] = self._slice(self._send, self._held)
        return d

    def replicated(self) -> tuple:
        return (HELD_MEAN,) if self._held is not None else ()

    def load_state_dict(self, d: dict) -> None:
        import numpy as np

        from ssdmpi import backend

        self.reset_inflight()
        held = int(d.get(HELD, -1))
        if held < 0:
            return
        if not self.tau or held >= len(self.cuts) or np.shape(d.get(HELD_MEAN)) != self._slice(self.L, held).shape:
            raise UserError("the checkpoint's fragment sum in flight does not fit this run's fragments; resume it "
                            "with the --fragments and --fragment-delay it was trained with")
        self._slice(self._send, held)[...] = backend.array_module(self.L).asarray(d[HELD_MEAN])
        self._held = held

    def reset_inflight(self) -> None:
        self._handle = self._inflight = self._held = None

    def __repr__(self) -> str:
        return f"Fragments({[hi - lo for lo, hi in self.cuts]}, tau={self.tau}, alpha={self.alpha:g})"


def streaming(cfg) -> bool:
    """Whether a resolved config (or a checkpoint's config mapping) syncs in fragments or delayed or mixed:
    anything but one blocking average a period."""
    get = cfg.get if isinstance(cfg, dict) else lambda name: getattr(cfg, name, None)
    return (get(FRAGMENTS.name) or 1) > 1 or bool(get(FRAGMENT_DELAY.name)) or bool(get(FRAGMENT_ALPHA.name))


def describe(cfg) -> str:
    """``", 4 fragments, delay 1, alpha 0.5"`` for a config (a mapping, or a config object) that streams;
    "" for one blocking average a period."""
    if not streaming(cfg):
        return ""
    get = cfg.get if isinstance(cfg, dict) else lambda name: getattr(cfg, name, None)
    count = get(FRAGMENTS.name) or 1
    return (f", {count} fragment{'s' if count > 1 else ''}, delay {get(FRAGMENT_DELAY.name) or 0}, "
            f"alpha {float(get(FRAGMENT_ALPHA.name) or 0):g}")


# --- the settings (the algorithm whose average they fragment lists them) ---------------------------

def _divides(run) -> None:
    """``F`` divides ``k``: every fragment syncs once a period, one every ``k/F`` steps."""
    k, count = run.delay, run.fragments
    if isinstance(k, int) and count is not None and k % count:
        raise UserError(f"--fragments {count} must divide --delay {k} (each fragment syncs once per period, one "
                        f"every k/F steps); use a --delay that is a multiple of {count}, or another --fragments")


def _within(run) -> None:
    """``TAU < k/F``: a fragment lands before the next one is posted."""
    k, count, tau = run.delay, run.fragments or 1, run.fragment_delay
    if isinstance(k, int) and tau is not None and tau >= k // count:
        raise UserError(f"--fragment-delay {tau} must be less than --delay / --fragments = {k // count} (the steps "
                        "between two fragments' syncs: a fragment's sum lands before the next fragment is posted); "
                        f"use --fragment-delay {k // count - 1} or less")


NOTE = ("Streaming DiLoCo's fragments of the blocking average of the local models; the period rules post one sum "
        "a period and already overlap it with their merge delay")
FRAGMENTS = Setting("fragments", 1, "the model's fragments, cut at its layers as evenly as possible: each is synced "
                    "once per period, one every k/F steps, so each allreduce carries about 1/F of the model "
                    "(Streaming DiLoCo; 1: the whole model at each period's end; docs/ALGORITHM.md section 17)", int,
                    positive_int, metavar="F", group=ALGORITHM, context_check=_divides, structural=True,
                    note=NOTE, bench_tag="f{}")
FRAGMENT_DELAY = Setting("fragment_delay", 0, "steps from posting a fragment's sum to merging it (0: a blocking "
                         "allreduce; less than k/F), the local steps that hide the allreduce", int, nonnegative_int,
                         metavar="TAU", group=ALGORITHM, context_check=_within, structural=True, note=NOTE,
                         bench_tag="tau{}")
FRAGMENT_ALPHA = Setting("fragment_alpha", 0.0, "at a fragment's merge, the share A of the rank's own fragment kept: "
                         "L <- W + A (L - W) (0: take the merged global fragment)", float,
                         functools.partial(number, low=0.0, high=1.0), metavar="A", group=ALGORITHM, note=NOTE,
                         bench_tag="alpha{}")
SETTINGS = (FRAGMENTS, FRAGMENT_DELAY, FRAGMENT_ALPHA)
