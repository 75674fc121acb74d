"""``--algo asgd``: asynchronous SGD with parameter-server ranks (docs/ALGORITHM.md section 11).

Roles: of the ``N`` ranks, the last ``S = --servers`` are servers and ranks ``0..K-1``
(``K = N - S``) are workers; worker ``w`` is rank ``w`` and reads data shard ``w`` of ``K``.
Server ``j`` (rank ``K + j``) owns the contiguous slice ``shard(j)`` of the flat parameter
buffer: its part of ``W`` and ``M``, updated with ``MomentumSGD`` (ALGORITHM.md 3).

One iteration ``t`` (one ``step()``), after the warm-up:

- worker: gradient ``g`` (its mean gradient) on the weights it pulled last; post the
  receives of every server's fresh slice into ``model.params``, post the sends of ``g``'s
  slices, wait for all (the servers work in parallel; the next gradient needs the pull,
  so there is nothing else to overlap with);
- server: serve ``K`` pushes, each in turn: receive a slice (from any worker in
  ``arrival`` order, from worker ``0, 1, ..., K-1`` in ``round-robin`` order), record its
  staleness ``tau = s - version[w]``, apply ``M <- mu*M - eta*(lam*mask*W + g)``,
  ``W <- W + M``, ``s += 1``, send ``W``'s slice back to that worker and set
  ``version[w] = s``. ``eta = eta_g(t_w)`` (``t_w``: the iteration the gradient belongs to);
  with ``--asgd-rate staleness``, ``eta = eta_g(t_w) / (1 + tau)``.

In the warm-up (``t < T_w``) the same exchange is SSGD: a server receives the ``K`` pushes
of iteration ``t`` in worker order, applies one update with their mean (summed pairwise in
worker order), and sends the new slice to every worker.

Between iterations nothing is in flight but the servers' last replies, which ``drain()``
completes. ``drain()`` also refreshes ``W`` on every rank: each server broadcasts its slice,
so ``global_weights()`` is the servers' ``W`` after a drain (on a server its own slice is
live: it IS that rank's part of the replica). ``local_weights()`` is None: evaluation reports
``W`` only.

``lockstep = False``: the trainer reduces its sync points' metrics without aligning the ranks
there (``ssdmpi/run/loop.py``, ``LaggedSums``).
"""

from __future__ import annotations

from ssdmpi.algos import resize
from ssdmpi.algos.contract import TrainingAlgorithm
from ssdmpi.errors import UserError
from ssdmpi.metrics import counted
from ssdmpi.phases import clock
from ssdmpi.spec import ALGORITHM, AlgorithmSpec, Setting
from ssdmpi.validate import positive_int

PUSH_TAG, PULL_TAG = 7401, 7402
ORDERS = ("arrival", "round-robin")   # pushes applied as they arrive, or in worker order (tests)
RATES = ("plain", "staleness")        # each push's lr: the global lr, or it / (1 + staleness)


def worker_count(size: int, servers: int) -> int:
    """Ranks that train (the first ``size - servers``); the others are servers."""
    return int(size) - int(servers)


def shard(num_params: int, j: int, servers: int) -> slice:
    """Server ``j``'s contiguous slice of the flat buffer (sizes differ by at most one)."""
    base, extra = divmod(int(num_params), int(servers))
    start = j * base + min(j, extra)
    return slice(start, start + base + (1 if j < extra else 0))


def push_lr(eta: float, staleness: int, staleness_rate: bool) -> float:
    """The lr of one push in the asynchronous stage: ``eta``, or with ``--asgd-rate staleness``
    ``eta / (1 + staleness)`` (ALGORITHM.md 11)."""
    return eta / (1 + staleness) if staleness_rate else eta


def pairwise_sum(xs: list):
    """``(x0 + x1) + (x2 + x3)`` in list order (``x0`` itself for one element)."""
    xs = list(xs)
    while len(xs) > 1:
        xs = [xs[i] + xs[i + 1] if i + 1 < len(xs) else xs[i] for i in range(0, len(xs), 2)]
    return xs[0]


class ASGD(TrainingAlgorithm):
    """The parameter-server baseline; the public API of ``ssdmpi.algos`` (stage ``warmup``|``async``)."""

    name = "asgd"
    lockstep = False     # the workers meet only through the servers (see the module docstring)

    def __init__(self, config, model, communicator, parts):
        super().__init__()
        from ssdmpi import backend  # late: the registry reads this module's settings for the CLI parser

        self.config, self.model, self.comm = config, model, communicator
        self.optimizer = parts.optimizer
        self.N, self.S = int(communicator.size), int(config.servers)
        self.K = worker_count(self.N, self.S)
        self.T_w = int(config.warmup_steps)
        self.round_robin = config.asgd_order == ORDERS[1]
        self.staleness_rate = config.asgd_rate == RATES[1]
        self.xp = backend.array_module(model.params)
        self.schedule = config.global_schedule()
        self.shards = [shard(model.params.size, j, self.S) for j in range(self.S)]
        self.server_ranks = [self.K + j for j in range(self.S)]
        self.is_server = communicator.rank >= self.K
        self.W = model.params.copy()      # replica of the servers' W (see the module docstring)
        self.t = self.s = 0
        self.stale_sum = self.stale_n = self.stale_max = 0
        self._stats = getattr(communicator, "stats", None)
        if self.is_server:
            self._init_server(model)

    def _init_server(self, model) -> None:
        import numpy as np

        self.j = self.comm.rank - self.K
        sl = self.shards[self.j]
        self.Wj = self.W[sl]
        self.sgd = self.optimizer.sliced(sl)      # the inner optimizer on this server's shard
        self.Mj = self.sgd.init(self.Wj)
        self.version = np.zeros(self.K, dtype=np.int64)   # s when each worker last pulled
        self.pushes = np.zeros(self.K, dtype=np.int64)    # pushes applied per worker (its next t)
        self._inbox = [self.xp.empty_like(self.Wj) for _ in range(self.K)]
        self._outbox = [self.xp.empty_like(self.Wj) for _ in range(self.K)]
        self._replies = [None] * self.K

    # --- public API ----------------------------------------------------------------------

    @property
    def stage(self) -> str:
        return "warmup" if self.t < self.T_w else "async"

    m = None           # no local-update counter
    lr_local = None    # no local learning rate

    @property
    def lr_global(self) -> float:
        """``eta_g(t)``: the learning rate of the next iteration's updates."""
        return self.schedule(self.t)

    def global_weights(self):
        """The servers' ``W`` as of the last ``drain()`` (a view; do not modify)."""
        return self.W

    def local_weights(self):
        return None

    def step(self, x, y) -> float | None:
        """Iteration ``t``: a worker's gradient, push and pull (returns its loss); a server's ``K``
        pushes (returns None). ``x, y`` are ignored on a server.

        Adds to ``phases`` as ``Algorithm.step`` does: ``fb_s`` the worker's gradient, ``update_s``
        the rest outside the Communicator's exposed time (a server's updates and reply copies; a
        worker's posting of its pushes and pulls), so that the waits for pushes and replies are
        the step's exposed wait."""
        return self.phases.time_step(self._stats, self._iteration, x, y)

    def _iteration(self, x, y) -> float | None:
        if self.is_server:
            self._serve_warmup() if self.t < self.T_w else self._serve_async()
            loss = None
        else:
            loss = self._push_pull(x, y)
            self.s += 1 if self.t < self.T_w else self.K    # what the servers applied meanwhile
        self.t += 1
        return loss

    def drain(self) -> None:
        """Collective: complete the replies in flight, then every rank's ``W`` <- the servers' slices."""
        if self.is_server:
            for w in range(self.K):
                self._wait_reply(w)
        for j, root in enumerate(self.server_ranks):
            self.comm.broadcast(self.W[self.shards[j]], root=root)

    def finalize(self) -> None:
        self.drain()

    def interval_staleness(self) -> dict:
        """This rank's staleness sums since the last call (then reset): ``stale_sum``, ``stale_n``, ``stale_max``."""
        out = {"stale_sum": self.stale_sum, "stale_n": self.stale_n, "stale_max": self.stale_max}
        self.stale_sum = self.stale_n = self.stale_max = 0
        return out

    def signature(self) -> dict:
        d = {f"algo.{k}": v for k, v in self.config.to_dict().items() if v is not None}
        d.update({"algo.world_size": self.N, "algo.num_params": int(self.model.params.size),
                  "algo.dtype": str(self.model.params.dtype)})
        return d

    def __repr__(self) -> str:
        c = self.config
        return (f"ASGD(asgd, N={self.N}, servers={self.S}, workers={self.K}, order={c.asgd_order}, rate={c.asgd_rate}, "
                f"T_w={self.T_w}, lr={c.lr}, optimizer={self.optimizer}, t={self.t}, stage={self.stage})")

    # --- worker --------------------------------------------------------------------------

    def _push_pull(self, x, y) -> float:
        t0 = clock()
        loss = self.model.loss_and_grad(x, y)
        self.phases.fb_s += clock() - t0
        g, params = self.model.grads, self.model.params
        pulls = [self.comm.recv_start(params[sl], rank, PULL_TAG) for sl, rank in zip(self.shards, self.server_ranks)]
        pushes = [self.comm.send_start(g[sl], rank, PUSH_TAG) for sl, rank in zip(self.shards, self.server_ranks)]
        self.comm.wait_all(pushes + pulls)
        return loss

    # --- server --------------------------------------------------------------------------

    def _serve_warmup(self) -> None:
        """SSGD: the ``K`` pushes of iteration ``t`` in worker order, one update with their mean."""
        handles = [self.comm.recv_start(self._inbox[w], w, PUSH_TAG) for w in range(self.K)]
        self.comm.wait_all(handles)
        G = self._inbox[0] if self.K == 1 else pairwise_sum(self._inbox) / self.K
        self.sgd.update(self.Wj, self.Mj, G, self.schedule(self.t))
        self.s += 1
        self.stale_n += self.K
        for w in range(self.K):
            self.pushes[w] += 1
            self._reply(w)

    def _serve_async(self) -> None:
        """``K`` pushes, each applied as it arrives (or in worker order with ``round-robin``)."""
        buf = self._inbox[0]
        for i in range(self.K):
            handle = self.comm.recv_start(buf, i if self.round_robin else None, PUSH_TAG)
            handle.wait()
            w = handle.source
            staleness = int(self.s - self.version[w])
            self.stale_sum += staleness
            self.stale_n += 1
            self.stale_max = max(self.stale_max, staleness)
            self.sgd.update(self.Wj, self.Mj, buf, push_lr(self.schedule(int(self.pushes[w])), staleness,
                                                           self.staleness_rate))
            self.s += 1
            self.pushes[w] += 1
            self._reply(w)

    def _reply(self, w: int) -> None:
        """Send ``W``'s slice to worker ``w`` (from its own buffer: ``W`` changes before it is sent)."""
        self._wait_reply(w)
        self._outbox[w][...] = self.Wj
        self.version[w] = self.s
        self._replies[w] = self.comm.send_start(self._outbox[w], w, PULL_TAG)

    def _wait_reply(self, w: int) -> None:
        if self._replies[w] is not None:
            self._replies[w].wait()
            self._replies[w] = None

    # --- state ---------------------------------------------------------------------------

    def state_dict(self, copy: bool = True) -> dict:
        """Collective (drains first). Every rank: ``algo``, ``role``, ``t``, ``s`` (updates the
        servers applied), ``stage``; a worker
        also ``L`` (the weights it pulled and computes on next); a server ``W_shard``, ``M_shard``,
        ``shard`` ([start, stop)), ``version`` and ``pushes`` (per worker). ``copy=False``: the
        live buffers, valid until the next step."""
        import numpy as np

        self.drain()
        d = {"algo": self.name, "role": "server" if self.is_server else "worker", "t": int(self.t),
             "s": int(self.s), "stage": self.stage}
        if self.is_server:
            sl = self.shards[self.j]
            d.update(W_shard=self.Wj, **self.Mj.entries("M_shard"), shard=np.array([sl.start, sl.stop], dtype=np.int64),
                     version=self.version, pushes=self.pushes)
        else:
            d["L"] = self.model.params
        return resize.host_copies(d) if copy else d

    def replicated(self) -> tuple:
        """None of the state is the same on every rank (``W`` is the servers' shards)."""
        return ()

    def resized_state(self, ctx) -> tuple[dict, str]:
        """Collective: this rank's state from a checkpoint of another number of workers (``resize.asgd``)."""
        return resize.asgd(self, ctx)

    def load_state_dict(self, d: dict) -> None:
        """Restore ``state_dict()`` output into an ASGD built with the same config and world size."""
        import numpy as np

        if str(d.get("algo")) != self.name:
            raise UserError(f"the checkpoint holds the state of algorithm {d.get('algo')!r}, not {self.name!r}")
        role = "server" if self.is_server else "worker"
        if str(d.get("role")) != role:
            raise UserError(f"rank {self.comm.rank} is a {role} but the checkpoint holds a {d.get('role')}'s "
                            "state there; resume with the same number of ranks and --servers")
        if self.is_server:
            sl = self.shards[self.j]
            if list(np.asarray(d["shard"])) != [sl.start, sl.stop] or len(np.asarray(d["version"])) != self.K:
                raise UserError("the checkpoint's server shards do not fit this model and --servers")
            self._wait_all_replies()
            self.Wj[...] = self.xp.asarray(d["W_shard"])
            self.Mj.load_entries(d, "M_shard", self.xp)
            self.version[...] = np.asarray(d["version"])
            self.pushes[...] = np.asarray(d["pushes"])
        else:
            if np.asarray(d["L"]).shape != self.model.params.shape:
                raise UserError(f"the checkpoint's algorithm state L does not fit this model "
                                f"({self.model.params.size} parameters); was it trained with another model?")
            self.model.params[...] = self.xp.asarray(d["L"])
        self.t, self.s = int(d["t"]), int(d["s"])
        # W elsewhere than on its server is refreshed by the next drain(): not here, because a
        # rank that raised above must not leave the others waiting in a broadcast.

    def _wait_all_replies(self) -> None:
        for w in range(self.K):
            self._wait_reply(w)


# --- the settings of asgd and its spec -------------------------------------------------------

SERVERS = Setting("servers", 1, "asgd: parameter-server ranks (the last S ranks)", int, positive_int, metavar="S",
                  group=ALGORITHM, structural=True, bench_tag="s{}")
ASGD_ORDER = Setting("asgd_order", ORDERS[0], "asgd: apply pushes as they arrive, or in worker order "
                     "(deterministic, for tests)", choices=ORDERS, group=ALGORITHM)
ASGD_RATE = Setting("asgd_rate", RATES[1], "asgd: the lr of each push: the global lr, or the global lr / (1 + the "
                    "push's staleness)", choices=RATES, group=ALGORITHM)


def _check_servers(run, world_size) -> None:
    if run.grad_clip and run.servers > 1:
        raise UserError(f"--grad-clip needs the whole gradient's norm, and each of --servers {run.servers} holds a "
                        "slice of it; use --servers 1 with --grad-clip")
    if world_size is not None and world_size <= run.servers:
        raise UserError(f"--algo asgd with --servers {run.servers} needs at least {run.servers + 1} ranks (the "
                        f"servers and at least one worker), got {world_size}; run more ranks or use fewer --servers")


SPEC = AlgorithmSpec("asgd", lambda cfg: "ssdmpi.algos.asgd:ASGD", lambda cfg, rule: None,
                     lambda cfg, workers: f"asgd ({counted(cfg.servers, 'server')}, {counted(workers, 'worker')}, "
                                          f"order {cfg.asgd_order}, warm-up {cfg.warmup_steps} steps)",
                     settings=(SERVERS, ASGD_ORDER, ASGD_RATE), why="a parameter server applying each push",
                     delay_stage=False, simulation="ssdmpi.verify.reference:ASGDSimulation", bench=("servers",),
                     bench_required=0, bench_default=False, inspect=lambda cfg: f"{cfg.get('servers')} server(s)",
                     variants={"asgd": {"servers": 1, "asgd_order": ORDERS[1]},
                               "asgd/plain": {"servers": 1, "asgd_order": ORDERS[1], "asgd_rate": RATES[0]}},
                     check=_check_servers, workers=lambda run, world_size: world_size - run.servers,
                     pattern=lambda cfg: ("servers", cfg.servers))
