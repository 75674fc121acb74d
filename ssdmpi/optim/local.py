"""The local updates of SSD-SGD (ALGORITHM.md section 4), on flat buffers, in place.

Every rule has ``step(L, g, m, lr)``: ``L`` this rank's local weights, ``g`` this rank's
MEAN gradient over its batch (the engine's ``model.grads``, ALGORITHM.md's ``g/B``),
``m`` the local-update counter (0 at the first local update), ``lr`` the learning rate of
this step (the caller evaluates the schedule). ``lam*mask`` is the masked weight decay
(weights and BN gamma only), as for the global optimizer. ``begin(L)`` is called once at
the switch, when ``L`` has just been set to ``W``. Scratch buffers are allocated once.

| ``--local-update`` | rule |
|---|---|
| ``global-momentum`` (default, 4b) | ``L <- (L + mu*M) - eta_g*(lam*mask*L + g)`` with the replicated global momentum ``M`` |
| ``glu-paper`` (4a) | the published GLU, see ``GLUPaper`` |
| ``sgd`` (4c) | ``L <- L - eta_l*(gbar + lam*mask*L)``, ``gbar = g/N`` |

``gbar = g/(B*N)`` of the spec is ``g/N`` here (``g`` being already the mean over ``B``).
"""

from __future__ import annotations

from ssdmpi.optim.sgd import array_module

LOCAL_UPDATES = ("global-momentum", "glu-paper", "sgd")


class LocalUpdate:
    """Shared set-up of the rules: masked weight decay and scratch buffers; no state by default."""

    name = "base"
    uses_local_lr = False

    def __init__(self, weight_decay: float, decay_mask, scratch: int = 2):
        self.lam, self.mask = float(weight_decay), decay_mask
        self._decay = decay_mask * self.lam          # exactly lam or 0: same rounding as lam*(mask*L)
        xp = array_module(decay_mask)
        self._scratch = tuple(xp.empty_like(decay_mask) for _ in range(scratch))

    def begin(self, L) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass


class GlobalMomentumLocal(LocalUpdate):
    """ALGORITHM.md 4b: ``L <- (L + mu*M) - eta_g*(lam*mask*L + g)``.

    ``M`` is the global momentum buffer (identical on all ranks), read, never written;
    the object keeps a reference, so ``M`` must be updated in place. ``lr`` is ``eta_g``.
    """

    name = "global-momentum"
    uses_local_lr = False

    def __init__(self, M, momentum: float, weight_decay: float, decay_mask):
        super().__init__(weight_decay, decay_mask)
        self.M, self.mu = M, float(momentum)

    def step(self, L, g, m: int, lr: float) -> None:
        xp = array_module(L)
        a, b = self._scratch
        xp.multiply(L, self._decay, out=a)    # a = eta*(lam*mask*L + g), from the old L
        a += g
        a *= lr
        xp.multiply(self.M, self.mu, out=b)
        L += b
        L -= a


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
        super().__init__(weight_decay, decay_mask, scratch=3)
        self.N, self.k, self.C = int(world_size), int(delay), float(divisor)
        self.P = array_module(decay_mask).zeros_like(decay_mask)

    def begin(self, L) -> None:
        self.P[...] = L

    def step(self, L, g, m: int, lr: float) -> None:
        xp = array_module(L)
        a, b, c = self._scratch
        snap = m % self.k == 0
        f = 1.0 if snap else 0.5
        xp.multiply(self.mask, lr * self.lam, out=a)     # a = 1 - eta_l*lam*mask
        xp.subtract(1, a, out=a)
        xp.multiply(a, self.P, out=b)                     # b = 0.5*Gs
        b -= L
        b /= self.C
        b *= 0.5
        xp.divide(g, self.N, out=a)                       # a = 2*gbar
        a *= 2
        xp.multiply(L, self._decay, out=c)
        a += c
        a += b
        a *= -(lr * f)                                    # a = Delta
        if snap:
            self.P[...] = L
        L += a

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
        xp = array_module(L)
        a, b = self._scratch
        xp.multiply(L, self._decay, out=a)
        xp.divide(g, self.N, out=b)
        a += b
        a *= lr
        L -= a


def make_local_update(name: str, *, M, world_size: int, delay: int, momentum: float, weight_decay: float,
                      glu_divisor: float, decay_mask):
    """The local update called ``name`` (one of ``LOCAL_UPDATES``)."""
    if name == "global-momentum":
        return GlobalMomentumLocal(M, momentum, weight_decay, decay_mask)
    if name == "glu-paper":
        return GLUPaper(world_size, delay, glu_divisor, weight_decay, decay_mask)
    if name == "sgd":
        return PlainLocalSGD(world_size, weight_decay, decay_mask)
    raise ValueError(f"unknown local update {name!r}")
