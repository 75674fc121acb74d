"""The local updates of SSD-SGD (ALGORITHM.md section 4), on flat buffers, in place.

Every rule has ``step(L, g, m, lr)``: ``L`` this rank's local weights, ``g`` this rank's
MEAN gradient over its batch (the engine's ``model.grads``, ALGORITHM.md's ``g/B``),
``m`` the local-update counter (0 at the first local update), ``lr`` the learning rate of
this step (the caller evaluates the schedule). ``lam*mask`` is the masked weight decay
(weights and BN gamma only), as for the global optimizer. ``begin(L)`` is called once at
the switch, when ``L`` has just been set to ``W``. Each ``step`` is one fused pass over the
buffers (``ssdmpi/optim/fused.py``), with the operation order given in its docstring; the
buffers are 1-D and contiguous, and ``step`` allocates nothing.

| ``--local-update`` | rule |
|---|---|
| ``global-momentum`` (default, 4b) | the inner optimizer's step with the replicated global state ``M`` read, not advanced (momentum SGD: ``L <- (L + mu*M) - eta_g*(lam*mask*L + g)``) |
| ``glu-paper`` (4a) | the published GLU, see ``GLUPaper`` |
| ``sgd`` (4c) | ``L <- L - eta_l*(gbar + lam*mask*L)``, ``gbar = g/N`` |

``gbar = g/(B*N)`` of the spec is ``g/N`` here (``g`` being already the mean over ``B``).
"""

from __future__ import annotations

from ssdmpi.optim.part import PlanPoll, array_module


class LocalUpdate(PlanPoll):
    """Shared set-up of the rules: masked weight decay and the fused-update plan; no state by default."""

    name = "base"
    uses_local_lr = False

    def __init__(self, weight_decay: float, decay_mask, consts=("decay",), scratch: int = 2):
        from ssdmpi.optim import fused  # late: fused imports NumPy, and the CLI parser imports this module

        self.lam, self.mask = float(weight_decay), decay_mask
        self._decay = decay_mask * self.lam          # exactly lam or 0: same rounding as lam*(mask*L)
        arrays = {"decay": self._decay, "mask": decay_mask}
        self._fused = fused
        self._plan = fused.Plan(tuple(arrays[c] for c in consts), scratch)

    def begin(self, L) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass


class GlobalMomentumLocal:
    """ALGORITHM.md 4b: the inner optimizer's step with the global state ``M`` read, never written
    (``Optimizer.update_read_only``; momentum SGD: ``L <- (L + mu*M) - eta_g*(lam*mask*L + g)``).

    ``M`` (an ``OptState``) is identical on all ranks; the object keeps a reference, so ``M`` must be
    updated in place. ``lr`` is ``eta_g``. The optimizer's own ``poll`` is the progress hook.
    """

    name = "global-momentum"
    uses_local_lr = False
    poll = None

    def __init__(self, optimizer, global_state):
        self.optimizer, self.M = optimizer, global_state

    def begin(self, L) -> None:
        pass

    def step(self, L, g, m: int, lr: float) -> None:
        """One fused pass (momentum SGD, per element: ``a = L*decay; a = a + g; a = a*lr; L = L + M*mu;
        L = L - a``, ``a`` from the old ``L``)."""
        self.optimizer.update_read_only(L, self.M, g, lr)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass


class GLUPaper(LocalUpdate):
    """ALGORITHM.md 4a, GLU as in the published prototype. With ``snap = (m mod k == 0)``::

        Gs    = ((1 - eta_l*lam*mask)*P - L) / C
        f     = 1.0 if snap else 0.5
        Delta = -(eta_l*f) * ((2*gbar + lam*mask*L) + 0.5*Gs)      gbar = g/N
        if snap: P <- L          # snapshot BEFORE adding Delta
        L <- L + Delta

    ``m`` counts iterations (once per iteration for the whole model). Local momentum is 0.
    ``P`` is set to ``L`` by ``begin`` (ssdmpi choice: the spec leaves ``P`` undefined at the
    first local update; with ``P = L`` its ``Gs`` is ``-eta_l*lam*mask*L/C``, a small decay term).
    """

    name = "glu-paper"
    uses_local_lr = True

    def __init__(self, world_size: int, delay: int, divisor: float, weight_decay: float, decay_mask):
        super().__init__(weight_decay, decay_mask, consts=("mask", "decay"), scratch=3)
        self.N, self.k, self.C = int(world_size), int(delay), float(divisor)
        self.P = array_module(decay_mask).zeros_like(decay_mask)

    def begin(self, L) -> None:
        self.P[...] = L

    def step(self, L, g, m: int, lr: float) -> None:
        """Per element, in this order (``neg = -(eta_l*f)``, Python scalars cast to the dtype)::

            a = mask*(eta_l*lam); a = 1 - a; b = a*P; b = b - L; b = b/C; b = b*0.5
            a = g/N; a = a*2; c = L*decay; a = a + c; a = a + b; a = a*neg; [P = L]; L = L + a
        """
        snap = m % self.k == 0
        f = 1.0 if snap else 0.5
        self._fused.glu_paper(self._plan, L, g, self.P, lr * self.lam, self.C, self.N, -(lr * f), snap)

    def state_dict(self) -> dict:
        return {"P": self.P}

    def load_state_dict(self, d: dict) -> None:
        self.P[...] = array_module(self.P).asarray(d["P"])


class PlainLocalSGD(LocalUpdate):
    """ALGORITHM.md 4c: ``L <- L - eta_l*(gbar + lam*mask*L)``, ``gbar = g/N``, no momentum."""

    name = "sgd"
    uses_local_lr = True

    def __init__(self, world_size: int, weight_decay: float, decay_mask):
        super().__init__(weight_decay, decay_mask)
        self.N = int(world_size)

    def step(self, L, g, m: int, lr: float) -> None:
        """Per element: ``a = L*decay; b = g/N; a = a + b; a = a*lr; L = L - a``."""
        self._fused.plain_local_sgd(self._plan, L, g, lr, self.N)


def make_local_update(name: str, *, optimizer, global_state, world_size: int, delay: int, weight_decay: float,
                      glu_divisor: float, decay_mask):
    """The local update called ``name`` (one of ``LOCAL_UPDATES``): ``global-momentum`` follows the inner
    ``optimizer``'s global state; ``glu-paper`` and ``sgd`` are plain SGD formulas of their own."""
    if name == "global-momentum":
        return GlobalMomentumLocal(optimizer, global_state)
    if name == "glu-paper":
        return GLUPaper(world_size, delay, glu_divisor, weight_decay, decay_mask)
    if name == "sgd":
        return PlainLocalSGD(world_size, weight_decay, decay_mask)
    raise ValueError(f"unknown local update {name!r}")


LOCAL_UPDATES = ("global-momentum", "glu-paper", "sgd")
LOCAL_LR_UPDATES = tuple(c.name for c in (GlobalMomentumLocal, GLUPaper, PlainLocalSGD) if c.uses_local_lr)
