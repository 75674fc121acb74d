"""A single-process, pure-NumPy simulator of ``N`` workers: the oracle for every algorithm.

Written from ALGORITHM.md independently of the MPI code path (its own loops and
formulas; it shares only the model, the config and the lr schedules). One server
state (``W``, ``M``, ``s``) and ``N`` worker states (``L[r]``, ``P[r]``, ``V[r]``, ...);
a request "in flight" is simply the already-averaged value kept in ``pending``.
Averages over workers are summed pairwise, ``((x0 + x1) + (x2 + x3)) / N``, then divided,
which is bitwise what an MPI sum-allreduce of 1 or 2 ranks gives (and what MPICH's
recursive doubling gives for small messages at 4 ranks).

API::

    sim = simulate(config, model_factory, batches, steps, world_size=N, callback=None)
    sim.W, sim.M, sim.L[r], sim.s, sim.t, sim.stage, sim.losses   # after each step
    sim.step(); sim.finalize(); acc, loss = sim.accuracy(sim.W, test_x, test_y)
    sim.finalized_W()                          # W as finalize() would leave it now, sim unchanged

``model_factory()`` returns a fresh model (NumPy) with the initial weights; ONE model
computes every worker's gradient (its parameters are set to the worker's weights, and
its BatchNorm buffers are swapped per worker, as each rank has its own). ``batches`` is
either a list of ``N`` loaders with ``next_batch() -> (x, y)`` (called once per
iteration, in rank order; e.g. ``ShardedLoader(x, y, B, r, N, seed)``) or a callable
``batches(r, t) -> (x, y)``. Gradient scaling as in the MPI path: ``g`` is a worker's
MEAN gradient; ``mean_r g_r`` is ALGORITHM.md's ``G/(B*N)``; ``gbar = g/N``.
"""

from __future__ import annotations

import copy

import numpy as np

from ssdmpi.algos.registry import ALGORITHMS, RULES
from ssdmpi.spec import load
from ssdmpi.verify.quantize import Wire


class SGDTwin:
    """``--optimizer sgd`` (ALGORITHM.md 3): a state is the velocity (an array). Every method returns new
    arrays and never writes into one (``Simulation.finalized_W`` relies on it)."""

    def __init__(self, c, mask):
        self.mu, self.lam, self.mask = c.momentum, c.weight_decay, mask

    def init(self, W):
        return np.zeros_like(W)

    def step(self, W, M, G, eta):
        """``M <- mu*M - eta*(lam*mask*W + G); W <- W + M``: ``(W, M)``."""
        M = self.mu * M - eta * (self.lam * (self.mask * W) + G)
        return W + M, M

    def local_step(self, L, U, g, eta):
        """The per-rank order of the period rules: ``U <- mu*U - eta*lam*mask*L - eta*g; L <- L + U``."""
        U = self.mu * U - eta * self.lam * self.mask * L - eta * g
        return L + U, U

    def read_only(self, L, M, g, eta):
        """4b: ``L <- (L + mu*M) - eta*(lam*mask*L + g)``."""
        return (L + self.mu * M) - eta * (self.lam * (self.mask * L) + g)

    def merge(self, U, mean, a, k, eta, L):
        """``U <- U*(1 - a) + mean*(a/k)``."""
        return U * (1.0 - a) + mean * (a / k)


class AdamWTwin:
    """``--optimizer adamw``, written from PyTorch's AdamW (ALGORITHM.md 14): a state is ``{"m", "v",
    "count"}``, a new dict at every step (never written into). With ``c`` the count after the step::

        g <- g * min(1, C/(sqrt(g.g) + 1e-6))             (--grad-clip C > 0)
        W <- W*(1 - eta*lam) where mask is 1
        m <- m + (g - m)*(1 - b1);  v <- v*b2 + (g*g)*(1 - b2)
        W <- W + (m*(-(eta/(1 - b1^c)))) / (sqrt(v)/(1 - b2^c)^0.5 + eps)
    """

    def __init__(self, c, mask):
        self.b1, self.b2, self.eps, self.lam, self.clip = c.beta1, c.beta2, c.eps, c.weight_decay, c.grad_clip
        self.mask = mask

    def init(self, W):
        return {"m": np.zeros_like(W), "v": np.zeros_like(W), "count": 0}

    def _clipped(self, g):
        if not self.clip:
            return g
        scale = min(1.0, self.clip / (float(np.sqrt(float(np.dot(g, g)))) + 1e-6))
        return g * scale if scale < 1.0 else g

    def _moved(self, W, st, g, eta):
        """``(W after the step, the new state)``."""
        g = self._clipped(g)
        c = st["count"] + 1
        W = np.where(self.mask == 1, W * (1 - eta * self.lam), W)
        m = st["m"] + (g - st["m"]) * (1 - self.b1)
        v = st["v"] * self.b2 + (g * g) * (1 - self.b2)
        denom = np.sqrt(v) / (1 - self.b2 ** c) ** 0.5 + self.eps
        return W + (m * -(eta / (1 - self.b1 ** c))) / denom, {"m": m, "v": v, "count": c}

    def step(self, W, st, G, eta):
        return self._moved(W, st, G, eta)

    local_step = step

    def read_only(self, L, st, g, eta):
        return self._moved(L, st, g, eta)[0]

    def merge(self, st, mean, a, k, eta, L):
        """``m <- m*(1 - a) + a*est``: ``est`` the first moment whose step is the mean step ``mean/k``
        (less the decoupled decay), with this rank's ``v``: ``-(mean/(k*eta) + lam*mask*L)*(sqrt(v)/
        sqrt(bc2) + eps)*bc1``."""
        c = st["count"]
        if not a or not eta or c == 0:
            return st
        denom = np.sqrt(st["v"]) / (1 - self.b2 ** c) ** 0.5 + self.eps
        est = ((mean / (k * eta)) + (L * self.mask) * self.lam) * denom * -(1 - self.b1 ** c)
        return {"m": st["m"] * (1 - a) + est * a, "v": st["v"], "count": c}


OPTIMIZER_TWINS = {"sgd": SGDTwin, "adamw": AdamWTwin}


class OuterTwin:
    """The outer optimizer (ALGORITHM.md 16), written from ``torch.optim.SGD`` (dampening 0, no weight decay)
    on the pseudo-gradient ``g`` of a merged average (the global weights before it minus the ranks' mean
    model), with the global buffer ``b`` (zeros at the start)::

        b <- mu*b + g;  W <- W - lr*(g + mu*b)   (--outer-optimizer nesterov)   or   W - lr*b   (sgd)

    ``Simulation.outer`` is None for ``--outer-lr 1 --outer-momentum 0``: the plain average itself. Returns new
    arrays, writes into none."""

    def __init__(self, c):
        self.nesterov, self.lr, self.mu = c.outer_optimizer == "nesterov", c.outer_lr, c.outer_momentum

    @staticmethod
    def of(c):
        """The twin for a resolved config, or None where the plain average is the step (or none applies)."""
        if c.outer_optimizer is None or (c.outer_lr == 1.0 and c.outer_momentum == 0.0):
            return None
        return OuterTwin(c)

    def step(self, W, b, g):
        """``(W, b)`` after one step with the pseudo-gradient ``g``."""
        b = b * self.mu + g
        d = g + b * self.mu if self.nesterov else b
        return W - d * self.lr, b


class Simulation:
    """``N`` simulated workers running ``config`` (an ``AlgoConfig``) step by step."""

    def __init__(self, config, model_factory, batches, world_size: int):
        self.N = int(world_size)
        self.cfg = c = config.validate(world_size=self.N)
        self.model = model_factory()
        self.mask = np.asarray(self.model.flat.decay_mask())
        self.sched = c.global_schedule()
        self.local_sched = c.local_schedule()
        if callable(batches):
            self._batch = batches
        else:
            loaders = list(batches)
            if len(loaders) != self.N:
                raise ValueError(f"need {self.N} loaders, got {len(loaders)}")
            self._batch = lambda r, t: loaders[r].next_batch()
        self.mu, self.lam, self.k = c.momentum, c.weight_decay, c.delay
        self.opt = OPTIMIZER_TWINS[c.optimizer](c, self.mask)
        self.outer = OuterTwin.of(c)
        spec = ALGORITHMS[c.algo]
        self.T_w = c.warmup_steps if spec.delay_stage else None
        self.twin = load(spec.reference(c, RULES.get(c.period_rule)))(self) if spec.delay_stage else None
        self.wire = Wire(c.comm_dtype, self.N) if c.comm_dtype not in (None, "float32") else None  # --comm-dtype
        self.W = np.array(self.model.params, copy=True)
        self.M = self.opt.init(self.W)
        self.B = np.zeros_like(self.W)          # the outer optimizer's buffer (used with self.outer only)
        self.L = self.P = self.V = self.U = self.S = self.A = None
        self.pending = None
        self.t = self.s = 0
        self.losses = []
        bufs = self.model.buffers()
        self._bn = [{k: np.array(v, copy=True) for k, v in bufs.items()} for _ in range(self.N)] if bufs else None
        if self.T_w == 0:
            self._switch()

    @property
    def stage(self) -> str:
        return "delay" if self.L is not None else "warmup"

    # --- pieces ----------------------------------------------------------------------

    def _grad(self, r: int, weights):
        """Worker ``r``'s mean loss and MEAN gradient at ``weights`` on its batch of this iteration."""
        x, y = self._batch(r, self.t)
        self.model.params[...] = weights
        if self._bn:
            self.model.load_buffers(self._bn[r])
        loss = self.model.loss_and_grad(x, y)
        if self._bn:
            self._bn[r] = {k: np.array(v, copy=True) for k, v in self.model.buffers().items()}
        return loss, np.array(self.model.grads, copy=True)

    def _mean(self, xs):
        """Pairwise sum over workers, divided by N (the MPI allreduce's order for N <= 2)."""
        xs = list(xs)
        while len(xs) > 1:
            xs = [xs[i] + xs[i + 1] if i + 1 < len(xs) else xs[i] for i in range(0, len(xs), 2)]
        return xs[0] / self.N if self.N > 1 else xs[0]

    def _posted_mean(self, xs):
        """The mean of a period's posts as the transport delivers it (``--comm-dtype``: verify/quantize.py)."""
        return self._mean(xs) if self.wire is None else self.wire.mean(xs)

    def _global_update(self, G):
        """ALGORITHM.md 3: the optimizer's step at ``eta_g(s)`` (momentum SGD: ``M <- mu*M - eta_g(s)*(lam*mask*W
        + G); W <- W + M``); ``s += 1``."""
        self.W, self.M = self.opt.step(self.W, self.M, G, self.sched(self.s))
        self.s += 1

    def _merged(self, W, mean):
        """``W`` after a merge of the ranks' mean displacement ``mean``: ``W + mean``, or the outer step with
        the pseudo-gradient ``-mean``."""
        if self.outer is None:
            return W + mean
        W, self.B = self.outer.step(W, self.B, -mean)
        return W

    def _averaged(self, W, mean_model):
        """``W`` after localsgd's average ``mean_model``: itself, or the outer step with ``W - mean_model``."""
        if self.outer is None:
            return mean_model
        W, self.B = self.outer.step(W, self.B, W - mean_model)
        return W

    def _lr_local(self) -> float:
        c = self.cfg
        if c.local_update in ("glu-paper", "sgd"):
            if self.local_sched is not None:
                return self.local_sched(self.t - self.T_w)
            return c.local_lr * self.sched.factor(self.t)
        return self.sched(self.t)

    def _local_update(self, r: int, g, m: int):
        """ALGORITHM.md 4 on worker ``r``'s ``L`` with its own mean gradient ``g``."""
        c, L, lam, mask = self.cfg, self.L[r], self.lam, self.mask
        lr = self._lr_local()
        if c.local_update == "global-momentum":            # 4b: the optimizer's step with M read only
            self.L[r] = self.opt.read_only(L, self.M, g, lr)
        elif c.local_update == "sgd":                      # 4c
            self.L[r] = L - lr * (lam * (mask * L) + g / self.N)
        else:                                              # 4a glu-paper
            snap = m % self.k == 0
            f = 1.0 if snap else 0.5
            Gs = ((1 - lr * lam * mask) * self.P[r] - L) / c.glu_divisor
            delta = -(lr * f) * ((2 * (g / self.N) + lam * (mask * L)) + 0.5 * Gs)
            if snap:
                self.P[r] = L.copy()
            self.L[r] = L + delta

    def _momentum_step(self, r: int, g):
        """Per-rank optimizer steps (localsgd) at ``eta_g(t)``, in the global order (momentum SGD:
        ``V <- mu*V - eta_g(t)*(lam*mask*L + g); L <- L + V``)."""
        self.L[r], self.V[r] = self.opt.step(self.L[r], self.V[r], g, self.sched(self.t))

    def _switch(self):
        """ALGORITHM.md 1.2: ``L <- W`` on every worker; also ``P <- L`` (glu-paper), ``V <- M``
        (localsgd), ``U <- M`` and ``S <- L`` (delta-own)."""
        self.L = [self.W.copy() for _ in range(self.N)]
        self.P = [self.W.copy() for _ in range(self.N)]
        self.V = [self.M.copy() for _ in range(self.N)]      # a state is never written into: copies suffice
        self.U = [self.M.copy() for _ in range(self.N)]
        self.S = [self.W.copy() for _ in range(self.N)]
        self.A = [None] * self.N

    # --- one iteration ----------------------------------------------------------------

    def step(self) -> list:
        """Run iteration ``t`` on every worker; return the workers' mean losses."""
        if self.stage == "warmup":
            out = [self._grad(r, self.W) for r in range(self.N)]
            self._global_update(self._mean(g for _, g in out))
            self.t += 1
            if self.T_w is not None and self.t == self.T_w:
                self._switch()
        else:
            m = self.t - self.T_w
            out = [self._grad(r, self.L[r]) for r in range(self.N)]
            self.twin.step([g for _, g in out], m)
            self.t += 1
        self.losses = [loss for loss, _ in out]
        return self.losses

    def accuracy(self, weights, x, y, batch_size: int = 1000) -> tuple[float, float]:
        """``(accuracy, mean loss)`` of ``weights`` (e.g. ``sim.W`` or ``sim.L[0]``) on ``(x, y)``.

        Inference mode, with worker 0's BatchNorm statistics (as the trainer reports rank 0's).
        Leaves the simulation's state untouched.
        """
        saved = np.array(self.model.params, copy=True)
        self.model.params[...] = weights
        if self._bn:
            self.model.load_buffers(self._bn[0])
        loss_sum, correct = 0.0, 0
        try:
            for i in range(0, len(x), batch_size):
                batch_loss, batch_correct = self.model.evaluate(x[i:i + batch_size], y[i:i + batch_size])
                loss_sum, correct = loss_sum + batch_loss, correct + batch_correct
        finally:
            self.model.params[...] = saved
        return correct / len(x), loss_sum / len(x)

    def finalize(self):
        """The end of training (the MPI path's ``finalize``): what is in flight is applied to ``W``,
        and a partial period's work too, as its period end would have applied it (each twin's
        ``finalize``)."""
        if self.stage == "delay":
            self.twin.finalize((self.t - self.T_w) % self.k)   # iterations of the period not yet communicated

    def finalized_W(self):
        """``W`` as ``finalize()`` would leave it now; the simulation itself is left as it is (a run
        that calls this between steps computes bitwise what one that does not computes).

        ``finalize()`` runs on a shallow copy: every update of this simulator and its twins binds new
        arrays (``W = W + ...``) and never writes into one in place, so only the per-worker lists
        need copies of their own."""
        if self.stage != "delay":
            return self.W
        sim = copy.copy(self)
        for name in ("L", "P", "V", "U", "S", "A"):
            setattr(sim, name, list(getattr(self, name)))
        sim.twin = copy.copy(self.twin)
        sim.twin.sim = sim
        sim.finalize()
        return sim.W


# --- the delay stage of each algorithm and period rule: the twins the registry names ----------------

class StepTwin:
    """5a (``ssd --comm step``, ``odsgd``): the server applies iteration t-1's mean gradient, then the
    pull (``m % k == 0``), then the local update (section 4)."""

    def __init__(self, sim: Simulation):
        self.sim = sim

    def step(self, grads, m):
        sim = self.sim
        if sim.pending is not None:
            sim._global_update(sim.pending)
        sim.pending = sim._mean(grads)
        if m % sim.k == 0:
            sim.L = [sim.W.copy() for _ in range(sim.N)]
        for r, g in enumerate(grads):
            sim._local_update(r, g, m)

    def apply_pending(self):
        if self.sim.pending is not None:
            self.sim._global_update(self.sim.pending)
            self.sim.pending = None

    def finalize(self, j):
        self.apply_pending()


class ReplayTwin(StepTwin):
    """5b gradient replay: accumulate; at a period end replay the previous period's average k times;
    at the end, ``j`` iterations into a period: ``j`` global steps with ``mean_r A_r / j``."""

    def step(self, grads, m):
        sim = self.sim
        for r, g in enumerate(grads):
            sim.A[r] = g.copy() if m % sim.k == 0 else sim.A[r] + g
            sim._local_update(r, g, m)
        if (m + 1) % sim.k == 0:
            self.apply_pending()
            sim.pending = sim._posted_mean(sim.A)
            sim.L = [sim.W.copy() for _ in range(sim.N)]

    def apply_pending(self):
        sim = self.sim
        if sim.pending is not None:
            G = sim.pending / sim.k
            for _ in range(sim.k):
                sim._global_update(G)
            sim.pending = None

    def finalize(self, j):
        sim = self.sim
        self.apply_pending()
        if j:
            G = sim._mean(sim.A) / j
            for _ in range(j):
                sim._global_update(G)


class DeltaOwnTwin(StepTwin):
    """docs/PERIOD_RULE.md 3, ``delta-own``: local momentum SGD; at a boundary W gets the previous
    period's mean displacement and each worker restarts from W plus its own displacement; at the end
    ``W <- W + mean_r(L_r - S_r)``, ``S <- L`` (PERIOD_RULE.md 4). With an outer optimizer each ``W + mean``
    is its step from the pseudo-gradient ``-mean`` (``Simulation._merged``)."""

    def local_step(self, grads):
        sim = self.sim
        eta = sim.sched(sim.t)
        for r, g in enumerate(grads):
            sim.L[r], sim.U[r] = sim.opt.local_step(sim.L[r], sim.U[r], g, eta)

    def step(self, grads, m):
        sim = self.sim
        self.local_step(grads)
        if (m + 1) % sim.k == 0:
            changed = sim.pending is not None
            self.apply_pending()
            D = [sim.L[r] - sim.S[r] for r in range(sim.N)]
            if changed:
                sim.L = [sim.W + D[r] for r in range(sim.N)]
            sim.pending = sim._posted_mean(D)
            sim.S = [L.copy() for L in sim.L]

    def apply_pending(self):
        sim = self.sim
        if sim.pending is not None:
            sim.W = sim._merged(sim.W, sim.pending)
            sim.s += sim.k
            sim.pending = None

    def finalize(self, j):
        sim = self.sim
        self.apply_pending()
        if j:
            sim.W = sim._merged(sim.W, sim._mean([sim.L[r] - sim.S[r] for r in range(sim.N)]))
            sim.S = [L.copy() for L in sim.L]


class DeltaMergeTwin(DeltaOwnTwin):
    """docs/PERIOD_RULE.md 3, ``delta-merge``: the local step of delta-own; the sum posted at a period's
    end is merged d iterations later: ``W <- W + mean D``, with ``a = --merge-momentum`` > 0 also
    ``U <- (1 - a) U + (a/k) mean D``, then ``L <- W + (L - S)``, ``S <- W`` (before the post when both
    fall on one iteration, d = k); at a period's end ``D = L - S`` is posted, ``S <- L``. The end of
    training as delta-own."""

    def step(self, grads, m):
        sim = self.sim
        k, d, a = sim.k, sim.cfg.merge_delay, sim.cfg.merge_momentum
        self.local_step(grads)
        if (m + 1 - d) % k == 0 and m + 1 - d >= k:
            if a:
                eta = sim.sched(sim.t)
                sim.U = [sim.opt.merge(U, sim.pending, a, k, eta, sim.L[r]) for r, U in enumerate(sim.U)]
            self.apply_pending()
            sim.L = [sim.W + (sim.L[r] - sim.S[r]) for r in range(sim.N)]
            sim.S = [sim.W.copy() for _ in range(sim.N)]
        if (m + 1) % k == 0:
            D = [sim.L[r] - sim.S[r] for r in range(sim.N)]
            sim.pending = sim._posted_mean(D)
            sim.S = [L.copy() for L in sim.L]


class LocalSGDTwin(StepTwin):
    """5c local SGD: per-rank momentum SGD; every k-th iteration W <- mean L (or the outer step with
    ``W - mean L``), L <- W (and at the end, mid-period)."""

    def step(self, grads, m):
        sim = self.sim
        for r, g in enumerate(grads):
            sim._momentum_step(r, g)
        if (m + 1) % sim.k == 0:
            sim.W = sim._averaged(sim.W, sim._mean(sim.L))
            sim.L = [sim.W.copy() for _ in range(sim.N)]
            sim.s += sim.k

    def finalize(self, j):
        sim = self.sim
        if j:
            sim.W = sim._averaged(sim.W, sim._mean(sim.L))
            sim.L = [sim.W.copy() for _ in range(sim.N)]


class ASGDSimulation:
    """``--algo asgd --asgd-order round-robin`` (ALGORITHM.md 11): one server state, ``K`` workers.

    ``world_size`` counts every rank, ``K = world_size - servers`` of them workers (sharding
    the server changes no arithmetic: the update is elementwise). ``batches`` holds the
    ``K`` workers' loaders (``ShardedLoader(x, y, B, w, K, seed)``) or is ``batches(w, t)``.
    After each ``step()``: ``W``, ``M``, ``s`` (updates applied), ``t``, ``L[w]`` (the weights
    worker ``w`` pulled last and computes on next), ``version[w]`` (``s`` when it pulled),
    ``staleness`` (one entry per update, in order) and ``losses`` (one per worker). With
    ``asgd_rate`` ``staleness`` each asynchronous push steps with ``eta / (1 + its staleness)``.
    """

    def __init__(self, config, model_factory, batches, world_size: int):
        self.cfg = c = config.validate(world_size=int(world_size))
        self.K = int(world_size) - c.servers
        self.model = model_factory()
        self.mask = np.asarray(self.model.flat.decay_mask())
        self.sched = c.global_schedule()
        self.mu, self.lam, self.T_w = c.momentum, c.weight_decay, c.warmup_steps
        self.opt = OPTIMIZER_TWINS[c.optimizer](c, self.mask)
        if callable(batches):
            self._batch = batches
        else:
            loaders = list(batches)
            if len(loaders) != self.K:
                raise ValueError(f"need {self.K} worker loaders, got {len(loaders)}")
            self._batch = lambda w, t: loaders[w].next_batch()
        self.W = np.array(self.model.params, copy=True)
        self.M = self.opt.init(self.W)
        self.L = [self.W.copy() for _ in range(self.K)]
        self.version = [0] * self.K
        self.t = self.s = 0
        self.staleness, self.losses = [], []
        bufs = self.model.buffers()
        self._bn = [{k: np.array(v, copy=True) for k, v in bufs.items()} for _ in range(self.K)] if bufs else None

    @property
    def stage(self) -> str:
        return "warmup" if self.t < self.T_w else "async"

    def _grad(self, w: int):
        x, y = self._batch(w, self.t)
        self.model.params[...] = self.L[w]
        if self._bn:
            self.model.load_buffers(self._bn[w])
        loss = self.model.loss_and_grad(x, y)
        if self._bn:
            self._bn[w] = {k: np.array(v, copy=True) for k, v in self.model.buffers().items()}
        return loss, np.array(self.model.grads, copy=True)

    def _update(self, G, staleness: int = 0):
        """The server's optimizer step (ALGORITHM.md 3) at the lr of iteration ``t`` (with ``--asgd-rate
        staleness``, divided by ``1 + staleness``)."""
        eta = self.sched(self.t)
        if self.cfg.asgd_rate == "staleness":
            eta = eta / (1 + staleness)
        self.W, self.M = self.opt.step(self.W, self.M, G, eta)
        self.s += 1

    def step(self) -> list:
        """Iteration ``t``: SSGD through the server in the warm-up, else each worker in turn pushes
        its gradient (computed on its last pull), the server applies it, the worker pulls."""
        if self.t < self.T_w:
            out = [self._grad(w) for w in range(self.K)]
            grads = [g for _, g in out]
            while len(grads) > 1:        # pairwise, in worker order
                grads = [grads[i] + grads[i + 1] if i + 1 < len(grads) else grads[i]
                         for i in range(0, len(grads), 2)]
            self.staleness += [0] * self.K
            self._update(grads[0] / self.K if self.K > 1 else grads[0])
            self.L = [self.W.copy() for _ in range(self.K)]
            self.version = [self.s] * self.K
        else:
            out = []
            for w in range(self.K):
                loss, g = self._grad(w)
                out.append((loss, g))
                self.staleness.append(self.s - self.version[w])
                self._update(g, self.staleness[-1])
                self.L[w] = self.W.copy()
                self.version[w] = self.s
        self.t += 1
        self.losses = [loss for loss, _ in out]
        return self.losses

    def finalize(self):
        """Nothing is ever in flight between iterations."""

    def finalized_W(self):
        """``W``: ``finalize()`` changes nothing."""
        return self.W

    def accuracy(self, weights, x, y, batch_size: int = 1000) -> tuple[float, float]:
        """As ``Simulation.accuracy`` (worker 0's BatchNorm statistics)."""
        saved = np.array(self.model.params, copy=True)
        self.model.params[...] = weights
        if self._bn:
            self.model.load_buffers(self._bn[0])
        loss_sum, correct = 0.0, 0
        try:
            for i in range(0, len(x), batch_size):
                batch_loss, batch_correct = self.model.evaluate(x[i:i + batch_size], y[i:i + batch_size])
                loss_sum, correct = loss_sum + batch_loss, correct + batch_correct
        finally:
            self.model.params[...] = saved
        return correct / len(x), loss_sum / len(x)


def simulate(config, model_factory, batches, steps: int, world_size: int | None = None, callback=None) -> Simulation:
    """Run ``steps`` iterations of ``N`` simulated workers; return the ``Simulation``.

    ``world_size`` defaults to ``len(batches)`` when ``batches`` is a list of loaders (for
    asgd: pass it, servers included). asgd runs ``ASGDSimulation`` (round-robin order).
    ``callback(sim)`` runs after every iteration; returning True stops early.
    """
    if world_size is None:
        if callable(batches):
            raise ValueError("world_size is required when batches is a callable")
        world_size = len(batches)
    sim = load(ALGORITHMS[config.algo].simulation)(config, model_factory, batches, world_size)
    for _ in range(int(steps)):
        sim.step()
        if callback is not None and callback(sim):
            break
    return sim
