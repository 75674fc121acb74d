"""The reference twin of the blocking average in fragments (``--fragments``, ``--fragment-delay``,
``--fragment-alpha``; docs/ALGORITHM.md section 17), for ``ssdmpi/verify/reference.py``'s ``Simulation``:
written from the page, beside the simulator's plain periodic average, whose local steps it shares."""

from __future__ import annotations

import itertools

from ssdmpi.verify.reference import StepTwin


def fragment_cuts(layer_offsets, size: int, count: int) -> list:
    """The page's cut, found by trying every one: ``count`` runs of whole top-level layers, the largest as
    small as possible, then the earliest cuts; ``[(lo, hi), ...]``."""
    bounds = sorted({int(o) for o in layer_offsets} | {0, int(size)})
    best = None
    for inner in itertools.combinations(bounds[1:-1], count - 1):
        edges = (bounds[0], *inner, bounds[-1])
        key = (max(b - a for a, b in zip(edges, edges[1:])), inner)
        if best is None or key < best[0]:
            best = (key, edges)
    edges = best[1]
    return list(zip(edges, edges[1:]))


class FragmentsTwin(StepTwin):
    """Per iteration every worker's own optimizer step (as the plain average's twin). With ``h = k/F`` and
    ``q`` the local steps done in the period, fragment ``f``'s slice ``[lo, hi)``:

    - ``q == (f+1) h - tau``: its mean over the workers is taken (as the transport sums it) and kept aside;
    - ``q == (f+1) h``: ``W[lo:hi]`` <- that mean (or the outer step with ``W[lo:hi] - mean`` and its slice of
      the buffer), and every worker's ``L[lo:hi] <- W + alpha (L - W)`` (``W`` itself at ``alpha = 0``);
    - ``s += k`` at each period's end.

    The end of training: a mean kept aside is merged at once; then every fragment that is not ``W``'s on
    every worker (one merged with ``alpha = 0`` since the last local step is) gets ``W <- mean_r L_r`` (or
    the outer step) and ``L <- W``. Every update binds new arrays (``Simulation.finalized_W``)."""

    def __init__(self, sim):
        super().__init__(sim)
        c = sim.cfg
        self.cuts = fragment_cuts(sim.model.layer_offsets, sim.model.params.size, c.fragments)
        self.tau, self.alpha = c.fragment_delay, c.fragment_alpha
        self.kept = None                                   # (fragment, its mean) between post and merge
        self.synced = frozenset(range(len(self.cuts)))     # fragments equal to W on every worker

    def _h(self) -> int:
        return self.sim.k // len(self.cuts)

    def step(self, grads, m):
        sim = self.sim
        for r, g in enumerate(grads):
            sim._momentum_step(r, g)
        self.synced = frozenset()
        q, h = m % sim.k + 1, self._h()
        for f, (lo, hi) in enumerate(self.cuts):
            if q == (f + 1) * h - self.tau:
                self.kept = (f, sim._mean([L[lo:hi] for L in sim.L]))
            if q == (f + 1) * h:
                self.merge(f)
        if q == sim.k:
            sim.s += sim.k

    def merge(self, f):
        sim = self.sim
        kept_f, mean = self.kept
        assert kept_f == f, f"fragment {f} merges the mean of fragment {kept_f}"
        self.kept = None
        lo, hi = self.cuts[f]
        W = sim.W.copy()
        if sim.outer is None:
            W[lo:hi] = mean
        else:
            B = sim.B.copy()
            W[lo:hi], B[lo:hi] = sim.outer.step(sim.W[lo:hi], sim.B[lo:hi], sim.W[lo:hi] - mean)
            sim.B = B
        sim.W = W
        new = []
        for L in sim.L:
            L = L.copy()
            L[lo:hi] = W[lo:hi] if not self.alpha else W[lo:hi] + self.alpha * (L[lo:hi] - W[lo:hi])
            new.append(L)
        sim.L = new
        if not self.alpha:
            self.synced = self.synced | {f}

    def finalize(self, j):
        sim = self.sim
        if self.kept is not None:
            self.merge(self.kept[0])
        todo = [f for f in range(len(self.cuts)) if f not in self.synced]
        if not todo:
            return
        mean = sim._mean(sim.L)
        W = sim.W.copy()
        B = sim.B.copy()
        for f in todo:
            lo, hi = self.cuts[f]
            if sim.outer is None:
                W[lo:hi] = mean[lo:hi]
            else:
                W[lo:hi], B[lo:hi] = sim.outer.step(sim.W[lo:hi], sim.B[lo:hi], sim.W[lo:hi] - mean[lo:hi])
        sim.W, sim.B = W, B
        sim.L = [W.copy() for _ in range(sim.N)]
