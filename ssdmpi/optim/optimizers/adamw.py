"""``--optimizer adamw``: AdamW (decoupled weight decay on the mask, bias correction) on flat buffers.

PyTorch's ``torch.optim.AdamW`` (its single-tensor CPU path), per element, with ``c = count`` after
the increment::

    W <- W * (1 - eta*lam)                       where mask = 1 (biases, norms, embeddings: not decayed)
    m <- m + (g - m)*(1 - beta1)                 (torch's lerp, its branch for beta1 > 0.5)
    v <- v*beta2 + (g*g)*(1 - beta2)
    W <- W + (m * -(eta/bc1)) / (sqrt(v)/sqrt(bc2) + eps)     bc1 = 1 - beta1^c, bc2 = 1 - beta2^c

``g`` is the mean gradient (with ``--grad-clip C``: times ``min(1, C/(||g|| + 1e-6))``, as
``torch.nn.utils.clip_grad_norm_`` scales it). The state is ``m``, ``v`` and the integer step ``count``
(checkpoint keys ``M.m``, ``M.v``, ``M.count`` for the global one). The scalars (``1 - eta*lam``,
``eta/bc1``, ``bc2 ** 0.5``) are computed in Python floats as PyTorch computes them and cast to the
buffers' dtype; every product, quotient and sum is rounded on its own in the order above. PyTorch's
CPU kernels may contract ``lerp`` and ``addcdiv`` into fused multiply-adds, so the two agree to about
1e-15 relative per step in float64, not bitwise.

Clipping makes each step depend on the whole gradient: its norm ``||g|| = sqrt(g . g)`` (one dot
product over the flat buffer, NumPy's or CuPy's, a separate cheap pass before the update) is of the
averaged gradient for a global update and of the rank's own gradient for a local step. asgd's servers
each hold a slice of the gradient, so clipping there needs a single server.

One operation order serves every step (``local_form`` is the optimizer itself). ``update_read_only``
is the step the state would give: the moments advanced virtually with ``g`` and the bias correction
at ``count + 1``, the state left as it is (``--local-update global-momentum``). The momentum merge
(``merge_mean_step``, delta-merge's ``--merge-momentum a``) sets the first moment from the ranks' mean
displacement ``D`` over the ``k`` steps of the merged period: the normalised step that gives it,
``u = -(D/(k*eta) + lam*mask*L)`` (the per-step displacement less the decoupled decay, divided by
``-eta``), times this rank's denominator and ``bc1``, is the first moment that would have taken that
step::

    m <- m*(1 - a) + (-(D/(k*eta) + (L*mask)*lam) * (sqrt(v)/sqrt(bc2) + eps) * bc1) * a

``v`` and ``count`` are kept. docs/ALGORITHM.md section 14 says what each algorithm does with the state.
"""

from __future__ import annotations

import functools
import math

from ssdmpi.optim.part import WEIGHT_DECAY, Optimizer, OptState, PlanPoll, array_module
from ssdmpi.spec import OPTIMIZER, OptimizerSpec, Setting
from ssdmpi.validate import number

CLIP_EPS = 1e-6      # clip_grad_norm_'s: the factor is C / (norm + 1e-6)

# The GPU kernel: the NumPy loop of ``adamw_pass`` statement for statement (``G / n`` and ``g * c``
# with n = c = 1 are exact, so the kernel always does them; ``write`` 0: the read-only step).
KERNEL = ("ssdmpi_adamw", (
    "T mask, T inv, T keep, T w1, T w2, T b2, T bc2s, T eps, T negstep, T n, T c, int32 write", "T W, T m, T v, T G",
    "T g = G / n; if (write) G = g; g = g * c; T f = mask * keep; f = f + inv; W = W * f; "
    "T d = g - m; d = d * w1; T mm = m + d; T a = g * g; a = a * w2; T vv = v * b2; vv = vv + a; "
    "if (write) m = mm; if (write) v = vv; a = sqrt(vv); a = a / bc2s; a = a + eps; "
    "d = mm * negstep; d = d / a; W = W + d;"))


def adamw_pass(plan, W, m, v, G, keep, w1, w2, b2, bc2s, eps, negstep, n=None, c=1.0, write=True) -> None:
    """One AdamW step of ``W`` in one pass (``plan.consts = (mask, 1 - mask)``, scratch 4). Per element::

        [G = G/n;]  [g = g*c;]  f = mask*keep;  f = f + inv;  W = W*f
        d = g - m;  d = d*w1;  m' = m + d;  a = g*g;  a = a*w2;  v' = v*b2;  v' = v' + a;  [m = m'; v = v']
        a = sqrt(v');  a = a/bc2s;  a = a + eps;  d = m'*negstep;  d = d/a;  W = W + d

    ``keep = 1 - lr*lam``, ``w1 = 1 - beta1``, ``w2 = 1 - beta2``, ``bc2s = sqrt(bc2)``,
    ``negstep = -(lr/bc1)``. ``n``: ``G`` holds a sum over ``n`` ranks, divided in place as it is read
    (with ``write`` only). ``c``: the clipping factor (into scratch: ``G`` keeps its values). ``write``
    False: ``m`` and ``v`` are read, not written (``m'``, ``v'`` in scratch)."""
    import numpy as np

    plan.check(W, m, v, G)
    if plan.device:
        mask, inv = plan.consts
        plan.kernel(*KERNEL)(mask, inv, *plan.scalars(keep, w1, w2, b2, bc2s, eps, negstep, n or 1, c),
                             np.int32(write), W, m, v, G)
        return
    mul, add, sub, div, sqrt = np.multiply, np.add, np.subtract, np.divide, np.sqrt
    fold, clip = write and n is not None and n != 1, c != 1.0
    for sl, (mk, inv), (a, d, e, h) in plan.walk():
        w, g, mm, vv = W[sl], G[sl], m[sl], v[sl]
        if fold:
            div(g, n, g)
        if clip:
            mul(g, c, h)
            g = h
        f = a[:mk.size]                  # 1 element on a block of uniform mask: the same value for all
        mul(mk, keep, f)
        add(f, inv, f)
        mul(w, f, w)
        sub(g, mm, d)
        mul(d, w1, d)
        mul(g, g, a)
        mul(a, w2, a)
        if write:
            add(mm, d, mm)
            mul(vv, b2, vv)
            add(vv, a, vv)
            mnew, vnew = mm, vv
        else:
            add(mm, d, d)
            mul(vv, b2, e)
            add(e, a, e)
            mnew, vnew = d, e
        sqrt(vnew, a)
        div(a, bc2s, a)
        add(a, eps, a)
        mul(mnew, negstep, d)
        div(d, a, d)
        add(w, d, w)


class AdamW(PlanPoll, Optimizer):
    """In-place AdamW (the module docstring) on 1-D buffers of one dtype.

    Args:
        mask: flat 0/1 weight-decay mask (dtype and device of the weights); it is kept, not copied.
        beta1, beta2, eps, weight_decay: PyTorch's ``betas``, ``eps``, ``weight_decay`` (decoupled:
        ``W <- W*(1 - lr*weight_decay)`` on the mask). grad_clip: the gradient's global-norm bound
        (None or 0: no clipping).
    A step allocates nothing (its scratch is four cache-sized blocks).
    """

    plain_local_updates = False

    def __init__(self, mask, beta1: float, beta2: float, eps: float, weight_decay: float,
                 grad_clip: float | None = None):
        super().__init__(mask, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, grad_clip=grad_clip)
        from ssdmpi.optim import fused  # late, like array_module: fused imports NumPy

        self.b1, self.b2, self.eps, self.lam = float(beta1), float(beta2), float(eps), float(weight_decay)
        self.clip = float(grad_clip or 0.0)
        self._inv = 1 - mask                         # exactly 0 or 1: f = mask*keep + inv is keep or 1
        self._plan = fused.Plan((mask, self._inv), scratch=4)

    def init(self, params) -> OptState:
        """``m``, ``v`` zero; ``count`` 0."""
        xp = array_module(params)
        return OptState(m=xp.zeros_like(params), v=xp.zeros_like(params), count=0)

    def clip_factor(self, grads) -> float:
        """``min(1, C/(||g|| + 1e-6))`` with ``||g|| = sqrt(g . g)`` (1.0 without clipping)."""
        if not self.clip:
            return 1.0
        norm = math.sqrt(float(array_module(grads).dot(grads, grads)))
        return min(1.0, self.clip / (norm + CLIP_EPS))

    def _scalars(self, lr: float, count: int) -> tuple:
        """``keep, w1, w2, b2, bc2s, eps, negstep`` of the step that makes the count ``count``, as PyTorch
        computes them."""
        bc1, bc2 = 1 - self.b1 ** count, 1 - self.b2 ** count
        return 1 - lr * self.lam, 1 - self.b1, 1 - self.b2, self.b2, bc2 ** 0.5, self.eps, -(lr / bc1)

    def update(self, params, state: OptState, grads, lr: float, divisor: int | None = None) -> None:
        """One step of ``params`` and the state in place with the mean gradient ``grads`` at rate ``lr``
        (``adamw_pass``). ``divisor``: ``grads`` holds a SUM over that many ranks, made the mean in place
        (the same bits as ``allreduce_mean``): as it is read, or, with clipping, in the norm pass first."""
        n = divisor if divisor not in (None, 1) else None
        if self.clip and n is not None:
            array_module(grads).divide(grads, n, out=grads)
            n = None
        c = self.clip_factor(grads)
        state["count"] += 1
        adamw_pass(self._plan, params, state["m"], state["v"], grads, *self._scalars(lr, state["count"]), n, c)

    def update_read_only(self, params, state: OptState, grads, lr: float) -> None:
        """The step the state gives ``params`` with ``grads``: moments advanced virtually, bias correction at
        ``count + 1``; ``m``, ``v``, ``count`` and ``grads`` unchanged."""
        c = self.clip_factor(grads)
        adamw_pass(self._plan, params, state["m"], state["v"], grads, *self._scalars(lr, state["count"] + 1),
                   None, c, write=False)

    def merge_mean_step(self, state: OptState, mean, share: float, k: int, lr: float | None = None,
                        params=None) -> None:
        """``m <- m*(1 - a) + est*a``, ``est = -(mean/(k*lr) + (L*mask)*lam) * (sqrt(v)/sqrt(bc2) + eps) * bc1``
        (the module docstring; ``a = share``, ``L = params``), in this operation order; nothing when ``a``
        or ``lr`` is 0 or no step was taken. Once per merge: it allocates three temporaries."""
        count = state["count"]
        if not share or not lr or count == 0:
            return
        xp, m = array_module(mean), state["m"]
        bc1, bc2 = 1 - self.b1 ** count, 1 - self.b2 ** count
        e = xp.sqrt(state["v"])
        e /= bc2 ** 0.5
        e += self.eps
        u = mean / (k * lr)
        t = params * self.mask
        t *= self.lam
        u += t
        u *= e
        u *= -bc1
        m *= 1 - share
        u *= share
        m += u

    @property
    def linear_momentum(self) -> float:
        """``beta1``: the stand-in momentum of ``--delay auto``'s linear model (``ssdmpi/algos/stability.py``
        models momentum SGD; AdamW's first moment averages the gradients with the same weights)."""
        return self.b1


BETA1 = Setting("beta1", 0.9, "AdamW's first-moment decay beta1", float,
                functools.partial(number, low=0.0, high=1.0, high_open=True), group=OPTIMIZER)
# 0.95, nanoGPT's: v follows the gradient's scale over ~20 steps (0.999: ~1000), so its bias correction
# has faded by the end of a warm-up of a few hundred steps and a burst of large gradients (a new period's
# first steps, a loss spike) reaches v before it has moved the weights far.
BETA2 = Setting("beta2", 0.95, "AdamW's second-moment decay beta2", float,
                functools.partial(number, low=0.0, high=1.0, high_open=True), group=OPTIMIZER)
EPS = Setting("eps", 1e-8, "AdamW's eps, added to sqrt(v)", float, functools.partial(number, low=0.0, strict=True),
              group=OPTIMIZER)
GRAD_CLIP = Setting("grad_clip", 0.0, "clip the gradient each AdamW step sees to this global norm (0: off)", float,
                    functools.partial(number, low=0.0), metavar="C", group=OPTIMIZER)

SPEC = OptimizerSpec("adamw", AdamW, settings=(BETA1, BETA2, EPS, WEIGHT_DECAY, GRAD_CLIP),
                     defaults={"weight_decay": 0.1}, merges=True,
                     summary="AdamW: W <- W (1 - lr wd mask); m, v <- EMA of g, g^2; W <- W - lr m^/(sqrt(v^) + eps)")
