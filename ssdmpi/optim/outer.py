"""The outer optimizer: SGD or Nesterov momentum on the pseudo-gradient of a merged average (DiLoCo).

Where the ranks' local models meet (``localsgd``'s average every ``k`` steps; the merge of the period
rules that add the ranks' mean displacement to ``W``: ``delta-merge``, ``delta-own``), the plain average
moves ``W`` by the ranks' mean displacement ``P``. With an outer optimizer ``W`` moves by a step of
``torch.optim.SGD`` (``dampening`` 0, no weight decay; ``nesterov`` for ``--outer-optimizer nesterov``)
on the pseudo-gradient ``g = -P`` (the global weights before the merge minus the ranks' mean model),
with a momentum buffer ``b`` on the flat weights, global and identical on every rank::

    b <- b*mu + g
    d <- g + b*mu        (nesterov)      d <- b        (sgd)
    W <- W - d*lr

(``lr`` = ``--outer-lr``, ``mu`` = ``--outer-momentum``; ``b`` starts at zero, which is where PyTorch's
first step leaves its buffer too: ``b = g``). ``lr`` 1 with ``mu`` 0 is the plain average: ``build``
then returns None and the algorithms run the code they run without an outer optimizer, bit for bit
(``W - (W - x)`` is not always ``x`` in floating point, so that case never goes through the step).

Two forms of the same step, each one fused pass over the buffers (``ssdmpi/optim/fused.py``'s way:
a NumPy loop over cache-sized blocks, or one CuPy kernel with the same operations):

- ``step(W, b, R, n)``: ``R`` holds the SUM of the ranks' displacements over ``n`` ranks (None: their
  mean), made the mean in place as it is read; ``g = -R``, so per element ``r = R/n; R = r;
  b = b*mu - r; d = b*mu - r`` (nesterov) or ``d = b``; ``W = W - d*lr``;
- ``average_step(W, b, L, n)``: ``L`` holds the SUM of the ranks' models (``localsgd``); ``g = W - L/n``,
  per element ``l = L/n; g = W - l; b = b*mu + g; d = b*mu + g`` (nesterov) or ``d = b``;
  ``W = W - d*lr; L = W``.

``x - r`` is ``x + (-r)`` and IEEE sums commute, so both are PyTorch's formula above operation for
operation (its CPU kernels may fuse a multiply-add: equal to about 1e-16 relative in float64, not
bitwise). ``host_step`` is the displacement form on host arrays, whole-array NumPy (the same bits as the
blocked loop), for a resume on another number of ranks.

State and resume: ``b`` is saved as ``outer.momentum`` (replicated: stored once, kept exactly on another
number of ranks). A checkpoint without it (written before the outer optimizer existed, or by a run whose
outer step was the plain average) resumes with ``b = 0``: the buffer before the first outer step. The
three settings may change at a resume (like ``--lr``); the buffer carries on. docs/ALGORITHM.md section
16 says what each algorithm and rule does with it.
"""

from __future__ import annotations

import functools

from ssdmpi.errors import UserError
from ssdmpi.optim.part import PlanPoll
from ssdmpi.spec import ALGORITHM, Setting
from ssdmpi.validate import number

STATE_KEY = "outer.momentum"    # the buffer's name in an algorithm's state (and a checkpoint)
KINDS = ("sgd", "nesterov")     # --outer-optimizer: heavy-ball momentum, or Nesterov's

# The GPU kernels: the NumPy loops below statement for statement (n = 1 divides exactly).
KERNELS = {
    "ssdmpi_outer_step": ("T n, T lr, T mu, int32 nesterov", "T W, T b, T R",
                          "T r = R / n; R = r; T m = b * mu; m = m - r; b = m; T d = m; if (nesterov) d = m * mu; "
                          "if (nesterov) d = d - r; d = d * lr; W = W - d;"),
    "ssdmpi_outer_average_step": ("T n, T lr, T mu, int32 nesterov", "T W, T b, T L",
                                  "T l = L / n; T g = W - l; T m = b * mu; m = m + g; b = m; T d = m; "
                                  "if (nesterov) d = m * mu; if (nesterov) d = d + g; d = d * lr; T w = W - d; W = w; "
                                  "L = w;"),
}


class OuterOptimizer(PlanPoll):
    """The outer step (the module docstring) on 1-D buffers of one dtype and device.

    Args:
        mask: any flat array of the weights' size, dtype and device (the model's decay mask: the fused
            passes' plans are built on it; its values are not used).
        nesterov: Nesterov's momentum (else heavy-ball SGD). lr, momentum: ``--outer-lr``, ``--outer-momentum``.
    """

    def __init__(self, mask, nesterov: bool, lr: float, momentum: float):
        from ssdmpi.optim import fused  # late: the CLI parser reads this module's settings; fused imports NumPy

        self.nesterov, self.lr, self.mu, self._fused = bool(nesterov), float(lr), float(momentum), fused
        self._plan = fused.Plan((mask,), scratch=2)

    def init(self, params):
        """The momentum buffer, zero."""
        from ssdmpi.optim.part import array_module

        return array_module(params).zeros_like(params)

    def step(self, W, b, R, n: int | None = None) -> None:
        """The outer step of ``W`` and ``b`` in place from ``R``, the sum of the ranks' displacements over ``n``
        ranks (None or 1: their mean); ``R`` is left holding the mean."""
        import numpy as np

        plan = self._plan
        plan.check(W, b, R)
        if plan.device:
            plan.kernel("ssdmpi_outer_step", KERNELS["ssdmpi_outer_step"])(
                *plan.scalars(n or 1, self.lr, self.mu), np.int32(self.nesterov), W, b, R)
            return
        mul, sub = np.multiply, np.subtract
        fold, lr, mu = n is not None and n != 1, self.lr, self.mu
        for sl, _, (d, _) in plan.walk():
            w, m, r = W[sl], b[sl], R[sl]
            if fold:
                np.divide(r, n, r)
            mul(m, mu, m)
            sub(m, r, m)
            if self.nesterov:
                mul(m, mu, d)
                sub(d, r, d)
                mul(d, lr, d)
            else:
                mul(m, lr, d)
            sub(w, d, w)

    def average_step(self, W, b, L, n: int) -> None:
        """``localsgd``'s average: the outer step of ``W`` and ``b`` in place from ``L``, the sum of the ranks'
        models over ``n`` ranks (pseudo-gradient ``W - L/n``); then ``L = W``."""
        import numpy as np

        plan = self._plan
        plan.check(W, b, L)
        if plan.device:
            plan.kernel("ssdmpi_outer_average_step", KERNELS["ssdmpi_outer_average_step"])(
                *plan.scalars(n, self.lr, self.mu), np.int32(self.nesterov), W, b, L)
            return
        mul, add, sub = np.multiply, np.add, np.subtract
        lr, mu = self.lr, self.mu
        for sl, _, (d, _) in plan.walk():
            w, m, x = W[sl], b[sl], L[sl]
            np.divide(x, n, x)
            sub(w, x, x)                 # x is now g
            mul(m, mu, m)
            add(m, x, m)
            if self.nesterov:
                mul(m, mu, d)
                add(d, x, d)
                mul(d, lr, d)
            else:
                mul(m, lr, d)
            sub(w, d, w)
            x[...] = w

    def host_step(self, W, b, mean):
        """``step`` on host arrays with the ranks' mean displacement ``mean``, whole-array NumPy (the same
        bits): ``(new W, new b)``, the inputs left as they are."""
        b = b * self.mu - mean
        d = b * self.mu - mean if self.nesterov else b
        return W - d * self.lr, b

    def __repr__(self) -> str:
        return f"OuterOptimizer({KINDS[self.nesterov]}, lr={self.lr:g}, momentum={self.mu:g})"


def is_plain_average(lr, momentum) -> bool:
    """``--outer-lr 1`` with ``--outer-momentum 0``: the outer step is the plain average."""
    return float(lr) == 1.0 and float(momentum) == 0.0


def build(cfg, mask) -> OuterOptimizer | None:
    """The outer optimizer of a resolved config, or None where its settings do not apply or make the plain
    average (the algorithms then average as they do without one)."""
    if cfg.outer_optimizer is None or is_plain_average(cfg.outer_lr, cfg.outer_momentum):
        return None
    return OuterOptimizer(mask, cfg.outer_optimizer == KINDS[1], cfg.outer_lr, cfg.outer_momentum)


def describe(cfg) -> str:
    """``", outer nesterov lr 0.7 momentum 0.9"`` for a run's config (a mapping, as a checkpoint stores it, or
    a config object) with an outer step; "" without."""
    get = cfg.get if isinstance(cfg, dict) else lambda name: getattr(cfg, name, None)
    kind, lr, mu = get(OUTER_OPTIMIZER.name), get(OUTER_LR.name), get(OUTER_MOMENTUM.name)
    if kind is None or lr is None or mu is None or is_plain_average(lr, mu):
        return ""
    return f", outer {kind} lr {float(lr):g} momentum {float(mu):g}"


# --- the settings (each algorithm that averages lists them; they apply where its spec's outer_step says) ---

def _applies(run) -> bool:
    return run.spec.outer_step is not None and bool(run.spec.outer_step(run))


def _where(registry) -> str:
    """Where the outer step applies, from what the registry found: the algorithms whose spec has an
    ``outer_step``, and for one with period rules, the rules whose spec says ``outer_step``."""
    rules = registry.or_(r for r, s in registry.RULES.items() if s.outer_step)
    out = []
    for name, spec in registry.ALGORITHMS.items():
        if spec.outer_step is None:
            continue
        selector = next((s for s in spec.settings if s.name == registry.RULE_SELECTOR), None)
        out.append(f"{selector.where} --{selector.flag} {rules}" if selector is not None else f"--algo {name}")
    return ", or ".join(out)


def _not_with_auto(run) -> None:
    """``--delay auto`` keeps to the stable region of the rule's linear model, which has no outer step."""
    if run.delay == "auto" and run.rule is not None and run.rule.auto_chooses and run.outer_lr is not None \
            and run.outer_momentum is not None and not is_plain_average(run.outer_lr, run.outer_momentum):
        raise UserError("--delay auto chooses k and the merge delay within the stable region of the period rule's "
                        "linear model, which has no outer step; give a fixed --delay K with --outer-lr and "
                        "--outer-momentum, or drop them")


OUTER_OPTIMIZER = Setting("outer_optimizer", KINDS[0], "outer optimizer on the pseudo-gradient of each merged "
                          "average (the global weights before it minus the ranks' mean model): sgd (heavy-ball "
                          "momentum) or nesterov; with --outer-lr 1 and --outer-momentum 0 it is the plain average "
                          "(docs/ALGORITHM.md section 16)", choices=KINDS, group=ALGORITHM, applies=_applies,
                          where=_where)
OUTER_LR = Setting("outer_lr", 1.0, "learning rate of the outer optimizer (1 with --outer-momentum 0: the plain "
                   "average)", float, functools.partial(number, low=0.0, strict=True), metavar="LR", group=ALGORITHM,
                   applies=_applies, where=_where)
OUTER_MOMENTUM = Setting("outer_momentum", 0.0, "momentum of the outer optimizer, a buffer on the global weights "
                         "(0: none)", float, functools.partial(number, low=0.0, high=1.0, high_open=True),
                         metavar="MU", group=ALGORITHM, applies=_applies, where=_where,
                         context_check=_not_with_auto)
SETTINGS = (OUTER_OPTIMIZER, OUTER_LR, OUTER_MOMENTUM)
