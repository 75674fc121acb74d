"""The reference twin of ``--period-rule eager`` (docs/PERIOD_RULE.md 9), for ``ssdmpi/verify/reference.py``'s
``Simulation``: written from the page, beside the simulator's delta-own, whose local step, merge of the
previous period's mean and end of training it shares."""

from __future__ import annotations

from ssdmpi.verify.reference import DeltaOwnTwin


class EagerTwin(DeltaOwnTwin):
    """At every period end, after the local step: ``W <- W + mean D`` (the previous period's, when one is
    pending); ``D_r = L_r - S_r``; ``L_r <- W + D_r/N``; the mean of the ``D_r`` pending (as the transport
    delivers it); ``S_r <- L_r``. The end of training as delta-own: ``W`` gets the pending mean, then
    ``mean_r(L_r - S_r)``."""

    def step(self, grads, m):
        sim = self.sim
        self.local_step(grads)
        if (m + 1) % sim.k == 0:
            self.apply_pending()
            D = [sim.L[r] - sim.S[r] for r in range(sim.N)]
            sim.L = [sim.W + D[r] / sim.N for r in range(sim.N)]
            sim.pending = sim._posted_mean(D)
            sim.S = [L.copy() for L in sim.L]
