"""The global optimizer: SGD with momentum and masked weight decay on flat buffers.

ALGORITHM.md section 3, in the momentum form of the spec (not PyTorch's)::

    M <- mu*M - eta(s) * (lam*mask*W + G)
    W <- W + M
    s <- s + 1

``G`` is ALGORITHM.md's ``G/(B*N)``: with the engine's MEAN gradients it is the average
over ranks of the ranks' mean gradients, i.e. what ``Communicator.allreduce_mean`` of
``model.grads`` returns. ``mask`` is ``model.flat.decay_mask()`` (1 on weights and BN
gamma, 0 on biases and BN beta). Rounding follows the factored form above:
``eta*(lam*(mask*W) + G)`` is formed first, then subtracted from ``mu*M``. With a constant
``eta`` this is exactly PyTorch's ``SGD(momentum=mu, weight_decay=lam)`` with
``M = -eta * momentum_buffer``; when ``eta`` changes the two differ (here the velocity
carries the old learning rate, as in the published MXNet code).

The same update with a per-rank momentum buffer ``V`` in place of ``M`` is the local
optimizer of ``localsgd`` and of the ``delta`` period rule.
"""

from __future__ import annotations


def array_module(x):
    """``numpy`` or ``cupy``, whichever owns ``x`` (imported late: the CLI parser imports this package)."""
    from ssdmpi.backend import array_module as owner

    return owner(x)


class MomentumSGD:
    """In-place ``M <- mu*M - eta*(lam*mask*W + G); W <- W + M`` on 1-D buffers of one dtype.

    Args:
        momentum: ``mu``. weight_decay: ``lam``.
        decay_mask: flat 0/1 array (dtype and device of the weights); it is kept, not copied.
    Buffers are 1-D and contiguous; ``step`` allocates nothing (its scratch is one cache-sized block).
    """

    def __init__(self, momentum: float, weight_decay: float, decay_mask):
        self.mu, self.lam, self.mask = float(momentum), float(weight_decay), decay_mask
        # lam*mask is exactly lam or 0, so W*(lam*mask) rounds like lam*(mask*W): one pass fewer per step.
        self._decay = decay_mask * self.lam
        from ssdmpi.optim import fused  # late, like array_module: fused imports NumPy

        self._plan, self._step = fused.Plan((self._decay,), scratch=1), fused.momentum_sgd

    def step(self, W, M, G, lr: float, divisor: int | None = None) -> None:
        """One update of ``W`` and ``M`` in place with the averaged mean gradient ``G`` at rate ``lr``.

        One fused pass (``ssdmpi/optim/fused.py``) of, per element and in this order::

            [G = G/divisor;]  tmp = W*(lam*mask);  tmp = tmp + G;  tmp = tmp*lr;  M = M*mu;  M = M - tmp;  W = W + M

        ``divisor``: ``G`` holds a SUM over that many ranks (``Communicator.allreduce(average=False)``);
        it is made the mean in place as it is read, the same bits as ``allreduce_mean`` gives.
        """
        self._step(self._plan, W, M, G, lr, self.mu, divisor)
