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

With ``--fragments F``, ``--fragment-delay TAU``, ``--fragment-alpha A`` (Streaming DiLoCo;
``ssdmpi/algos/fragments.py``) the average, or the outer step, is taken fragment by fragment: fragment ``f``
of the flat weights is posted ``q = (f+1) k/F - TAU`` local steps into the period and lands ``TAU`` steps
later, mixed back by ``A``. The defaults (1, 0, 0) are the blocking average of the whole model at each
period's end above, in the same operations.
"""

from __future__ import annotations

from ssdmpi.algos import fragments
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

    def __init__(self, config, model, communicator, parts):
        # the fragments, cut before anything is built: a model with too few layers is refused at once
        self.cuts = fragments.split(model.layer_offsets, model.params.size, config.fragments)
        self.sync = None
        super().__init__(config, model, communicator, parts)

    def _begin_delay(self) -> None:
        c = self.config
        self.V = self.M.copy()      # this rank's optimizer state, from the global one
        self.sync = fragments.Fragments(self.W, self.L, self.B, self.mask, self.cuts, self.comm, self.N, self.k,
                                        self.outer, c.fragment_delay, c.fragment_alpha, poll=self.poll)

    def _delay_step(self, x, y) -> float:
        m = self.t - self.T_w
        loss = self._loss_and_grad(x, y)
        self.optimizer.update(self.L, self.V, self.model.grads, self.schedule(self.t))
        self.sync.after_step(m)     # the posts and merges due (the whole model at the period's end by default)
        if (m + 1) % self.k == 0:
            self.s += self.k
        return loss

    def drain(self) -> None:
        """Complete a fragment's sum in flight and hold its mean for its merge step."""
        if self.sync is not None:
            self.sync.drain()

    def finalize(self) -> None:
        """End of training: a partial period's local progress is averaged too, as its period end
        would have: ``W <- mean_r L_r`` (or the outer step from it), ``L <- W`` (blocking, collective);
        with fragments, each fragment not just merged (``Fragments.finalize``)."""
        if self.stage == "delay":
            self.sync.finalize(self.t - self.T_w)

    def _delay_state(self) -> dict:
        return {**self.V.entries("V"), **self.sync.state_dict()}

    def _replicated_delay(self) -> tuple:
        return self.sync.replicated()

    def _load_delay_state(self, d: dict) -> None:
        self.V.load_entries(d, "V", self.xp)
        self.sync.load_state_dict(d)

    def _reset_inflight(self) -> None:
        if self.sync is not None:
            self.sync.reset_inflight()

    def _shown(self) -> list:
        c, shown = self.config, super()._shown()
        own = [(s.name, getattr(c, s.name)) for s in fragments.SETTINGS] if fragments.streaming(c) else []
        return shown[:2] + own + shown[2:]


def _linear_map(x, k, N, mu):
    """Blocking local SGD: local momentum steps, every ``k`` steps ``W <- mean L``, ``L <- W``."""
    from ssdmpi.algos.stability import LinearState, chain, local_steps, power

    s = LinearState(N, shared=("W",), per_rank=("L", "U"))
    average = chain(s.assign(x, {"W": {f"L{r}": 1.0 / N for r in range(N)}}),
                    s.assign(x, {f"L{r}": {"W": 1.0} for r in range(N)}))
    return chain(power(local_steps(s, x, mu), k), average)


def _check(run, world_size) -> None:
    refuse_auto(run)


def _twin(cfg, rule) -> str:
    """The plain blocking average's twin, or the fragment schedule's (``ssdmpi/verify/fragments_twin.py``)."""
    return "ssdmpi.verify.fragments_twin:FragmentsTwin" if fragments.streaming(cfg) else \
        "ssdmpi.verify.reference:LocalSGDTwin"


def _pattern(cfg):
    """``bench model``'s averaging every k steps; None for a delayed fragment merge (overlapped, a pattern the
    step model has no formula for). Fragments merged at once send the same bytes per period, blocking."""
    return None if (getattr(cfg, fragments.FRAGMENT_DELAY.name, None) or 0) > 0 else ("averaging", cfg.delay)


SPEC = AlgorithmSpec("localsgd", lambda cfg: "ssdmpi.algos.localsgd:LocalSGD", _twin,
                     lambda cfg, workers: f"localsgd (k={cfg.delay}{outer.describe(cfg)}{fragments.describe(cfg)})",
                     settings=(DELAY, DELAY_MAX, *outer.SETTINGS, *fragments.SETTINGS),
                     why="it averages models every --delay steps, blocking",
                     inspect=lambda cfg: f"k={cfg.get('delay')}{outer.describe(cfg)}{fragments.describe(cfg)}",
                     label=("k={delay}",),
                     bench=("delay",),
                     variants={"localsgd": {}}, accuracy_defaults=("localsgd",),
                     pattern=_pattern, torch_peer="postlocal", check=_check,
                     linear_map=LinearMap(_linear_map), outer_step=lambda run: True)
