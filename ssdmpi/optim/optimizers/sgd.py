"""``--optimizer sgd``: SGD with momentum and masked weight decay on flat buffers (the default).

ALGORITHM.md section 3, in the momentum form of the spec (not PyTorch's)::

    M <- mu*M - eta * (lam*mask*W + G)
    W <- W + M

``G`` is a mean gradient (ALGORITHM.md's ``G/(B*N)`` for the global update). Rounding follows
the factored form above: ``eta*(lam*(mask*W) + G)`` is formed first, then subtracted from
``mu*M``. With a constant ``eta`` this is exactly PyTorch's ``SGD(momentum=mu, weight_decay=lam)``
with ``M = -eta * momentum_buffer``; when ``eta`` changes the two differ (here the velocity
carries the old learning rate, as in the published MXNet code).

The per-rank steps of the period rules (docs/PERIOD_RULE.md 3) use the same update in the
expanded order ``U <- (mu*U - (eta*lam*mask)*L) - eta*g`` (``local_form()``); the two orders are
the same arithmetic, rounded differently, and each is kept so that every run reproduces bit for
bit. The state is one buffer, the velocity (``M`` for the global weights). The momentum merge
(``merge_mean_step``): ``U <- (1 - a)*U + (a/k)*mean``, the ranks' mean step over the merged period.
"""

from __future__ import annotations

import functools

from ssdmpi.optim.part import WEIGHT_DECAY, Optimizer, OptState, array_module
from ssdmpi.spec import OPTIMIZER, OptimizerSpec, Setting
from ssdmpi.validate import number


class MomentumSGD(Optimizer):
    """In-place ``M <- mu*M - eta*(lam*mask*W + G); W <- W + M`` on 1-D buffers of one dtype.

    Args:
        mask: flat 0/1 weight-decay mask (dtype and device of the weights); it is kept, not copied.
        momentum: ``mu``. weight_decay: ``lam``. expanded: the per-rank operation order (``local_form``).
    Buffers are 1-D and contiguous; a step allocates nothing (its scratch is one cache-sized block).
    """

    def __init__(self, mask, momentum: float, weight_decay: float, expanded: bool = False):
        super().__init__(mask, momentum=momentum, weight_decay=weight_decay)
        from ssdmpi.optim import fused  # late, like array_module: fused imports NumPy

        self.mu, self.lam, self.expanded, self._fused = float(momentum), float(weight_decay), expanded, fused
        # lam*mask is exactly lam or 0, so W*(lam*mask) rounds like lam*(mask*W): one pass fewer per step.
        self._decay = mask * self.lam
        self._plans = (fused.Plan((mask,), scratch=1) if expanded else fused.Plan((self._decay,), scratch=1),
                       fused.Plan((self._decay,), scratch=2))

    @property
    def poll(self):
        return self._plans[0].poll

    @poll.setter
    def poll(self, hook) -> None:
        for plan in self._plans:
            plan.poll = hook

    def init(self, params) -> OptState:
        """The velocity, zero."""
        return OptState(velocity=array_module(params).zeros_like(params))

    def update(self, params, state: OptState, grads, lr: float, divisor: int | None = None) -> None:
        """One step of ``params`` and the velocity in place with the mean gradient ``grads`` at rate ``lr``.

        One fused pass (``ssdmpi/optim/fused.py``) of, per element and in this order::

            [G = G/divisor;]  tmp = W*(lam*mask);  tmp = tmp + G;  tmp = tmp*lr;  M = M*mu;  M = M - tmp;  W = W + M

        or, in the expanded order (``local_form``; no ``divisor``)::

            t = L*mask;  t = t*(lr*lam);  U = U*mu;  U = U - t;  t = g*lr;  U = U - t;  L = L + U

        ``divisor``: ``grads`` holds a SUM over that many ranks (``Communicator.allreduce(average=False)``);
        it is made the mean in place as it is read, the same bits as ``allreduce_mean`` gives.
        """
        velocity = state["velocity"]
        if self.expanded:
            if divisor not in (None, 1):
                raise ValueError("the expanded order takes a mean gradient (no divisor)")
            self._fused.momentum_sgd_expanded(self._plans[0], velocity, params, grads, lr * self.lam, self.mu, lr)
        else:
            self._fused.momentum_sgd(self._plans[0], params, velocity, grads, lr, self.mu, divisor)

    def update_read_only(self, params, state: OptState, grads, lr: float) -> None:
        """``L <- (L + mu*M) - lr*(lam*mask*L + g)``, ``M`` read only: per element
        ``a = L*decay; a = a + g; a = a*lr; L = L + M*mu; L = L - a`` (``a`` from the old ``L``)."""
        self._fused.momentum_sgd_read_only(self._plans[1], params, grads, state["velocity"], lr, self.mu)

    def merge_mean_step(self, state: OptState, mean, share: float, k: int, lr: float | None = None,
                        params=None) -> None:
        """``U <- U*(1 - a) + mean*(a/k)`` (``a = share``; nothing when ``a = 0``; ``lr``, ``params`` unused)."""
        if share:
            velocity = state["velocity"]
            array_module(velocity).multiply(velocity, 1.0 - share, out=velocity)
            velocity += mean * (share / k)

    @property
    def linear_momentum(self) -> float:
        return self.mu

    def local_form(self) -> MomentumSGD:
        return MomentumSGD(self.mask, self.mu, self.lam, expanded=True)

    def sliced(self, sl) -> MomentumSGD:
        return MomentumSGD(self.mask[sl], self.mu, self.lam, expanded=self.expanded)


MOMENTUM = Setting("momentum", 0.9, "momentum mu of --optimizer sgd", float,
                   functools.partial(number, low=0.0, high=1.0, high_open=True), group=OPTIMIZER)

SPEC = OptimizerSpec("sgd", MomentumSGD, settings=(MOMENTUM, WEIGHT_DECAY), defaults={"weight_decay": 1e-4},
                     summary="momentum SGD: M <- mu M - lr (wd mask W + g); W <- W + M", merges=True, default=True)
