"""``--algo localsgd``: periodic blocking model averaging, for comparison (ALGORITHM.md 5c).

After the SSGD warm-up, each rank runs SGD with its own momentum buffer ``V``
(initialised to the global ``M`` at the switch, so the first local steps continue the
warm-up's velocity) at the global lr of iteration ``t``::

    V <- mu*V - eta_g(t)*(lam*mask*L + g);  L <- L + V          (every iteration)
    every k-th iteration ((m+1) % k == 0): W <- mean_r L_r (blocking allreduce);  L <- W;  s += k
    finalize (end of training, mid-period):  W <- mean_r L_r;  L <- W

The momentum buffers stay per rank (not averaged), as in post-local SGD. ``V`` is this rank's state of
the inner optimizer (``--optimizer``), copied from the global one at the switch; the steps above are
momentum SGD's, and another optimizer's steps take their place.

With an outer optimizer (``--outer-optimizer``, ``--outer-lr``, ``--outer-momentum``; ``ssdmpi/optim/outer.py``)
the average is DiLoCo's outer step instead: ``W`` is the global model the period started from, so with
the pseudo-gradient ``g = W - mean_r L_r`` (blocking allreduce of the sum of ``L``) and the global buffer
``B``::

    B <- B*mu_o + g;  W <- W - lr_o*(g + B*mu_o) (nesterov) or W - lr_o*B (sgd);  L <- W;  s += k

at every period's end and at ``finalize`` mid-period alike. ``--outer-lr 1 --outer-momentum 0`` is the plain
average above, bit for bit (the same code).
"""

from __future__ import annotations

from ssdmpi.algos.base import DELAY, DELAY_MAX, Algorithm, refuse_auto
from ssdmpi.optim import outer
from ssdmpi.spec import AlgorithmSpec, LinearMap


class LocalSGD(Algorithm):
    """``--algo localsgd`` (the module docstring)."""

    name = "localsgd"

    @property
    def lr_global(self) -> float:
        """In the delay stage every step is SGD on ``L`` at ``eta_g(t)`` (``W`` is only averaged):
        that is the lr it steps with, so that is the one reported."""
        return self.schedule(self.t if self.stage == "delay" else self.s)

    def _begin_delay(self) -> None:
        from ssdmpi.optim import fused

        self.V = self.M.copy()      # this rank's optimizer state, from the global one
        self._fused, self._plan = fused, fused.Plan((self.mask,), scratch=0)
        self._plan.poll = self.poll

    def _delay_step(self, x, y) -> float:
        m = self.t - self.T_w
        loss = self._loss_and_grad(x, y)
        self.optimizer.update(self.L, self.V, self.model.grads, self.schedule(self.t))
        if (m + 1) % self.k == 0:
            self.comm.allreduce(self.L, average=False)
            self._average()
            self.s += self.k
        return loss

    def _average(self) -> None:
        """``L`` holds the sum of the ranks' models: ``W`` <- their mean (or the outer step from it); ``L = W``.
        One pass either way."""
        if self.outer is None:
            self._fused.divide_copy(self._plan, self.L, self.W, self.N)   # L = sum/N; W = L
        else:
            self.outer.average_step(self.W, self.B, self.L, self.N)

    def finalize(self) -> None:
        """End of training: a partial period's local progress is averaged too, as its period end
        would have: ``W <- mean_r L_r`` (or the outer step from it), ``L <- W`` (blocking, collective)."""
        if self.stage == "delay" and (self.t - self.T_w) % self.k != 0:
            if self.outer is None:
                self.comm.allreduce_mean(self.L)
                self.W[...] = self.L
            else:
                self.comm.allreduce(self.L, average=False)
                self.outer.average_step(self.W, self.B, self.L, self.N)

    def _delay_state(self) -> dict:
        return self.V.entries("V")

    def _load_delay_state(self, d: dict) -> None:
        self.V.load_entries(d, "V", self.xp)


def _linear_map(x, k, N, mu):
    """Blocking local SGD: local momentum steps, every ``k`` steps ``W <- mean L``, ``L <- W``."""
    from ssdmpi.algos.stability import LinearState, chain, local_steps, power

    s = LinearState(N, shared=("W",), per_rank=("L", "U"))
    average = chain(s.assign(x, {"W": {f"L{r}": 1.0 / N for r in range(N)}}),
                    s.assign(x, {f"L{r}": {"W": 1.0} for r in range(N)}))
    return chain(power(local_steps(s, x, mu), k), average)


def _check(run, world_size) -> None:
    refuse_auto(run)


SPEC = AlgorithmSpec("localsgd", lambda cfg: "ssdmpi.algos.localsgd:LocalSGD",
                     lambda cfg, rule: "ssdmpi.verify.reference:LocalSGDTwin",
                     lambda cfg, workers: f"localsgd (k={cfg.delay}{outer.describe(cfg)})",
                     settings=(DELAY, DELAY_MAX, *outer.SETTINGS),
                     why="it averages models every --delay steps, blocking",
                     inspect=lambda cfg: f"k={cfg.get('delay')}{outer.describe(cfg)}", label=("k={delay}",),
                     bench=("delay",),
                     variants={"localsgd": {}}, accuracy_defaults=("localsgd",),
                     pattern=lambda cfg: ("averaging", cfg.delay), torch_peer="postlocal", check=_check,
                     linear_map=LinearMap(_linear_map), outer_step=lambda run: True)
