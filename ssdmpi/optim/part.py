"""The inner optimizer as a part (Optax-like): ``init`` a state on flat buffers, ``update`` in one fused pass.

An algorithm never writes an optimizer's arithmetic itself: it holds an ``Optimizer`` (the one
``--optimizer`` names, built by the registry from its ``OptimizerSpec``) and one ``OptState`` per
set of weights it steps (the global ``W``; a rank's local ``L``), and calls:

- ``init(params) -> OptState``: a fresh state for weights like ``params`` (zeros);
- ``update(params, state, grads, lr, divisor=None)``: one step of ``params`` in place, the state
  advanced; ``grads`` is a mean gradient (or, with ``divisor`` N, a sum over N ranks, made the mean
  in place as it is read);
- ``update_read_only(params, state, grads, lr)``: the step ``state`` would give ``params`` with
  these gradients, the state left as it is (a local step that follows the global optimizer's state:
  ``--local-update global-momentum``);
- ``merge_mean_step(state, mean, share, k, lr, params)``: at a period rule's merge, ``share`` of the
  state replaced by what the ranks' mean displacement ``mean`` over ``k`` steps says (``--merge-momentum``;
  ``lr`` the rate of the last step, ``params`` the rank's weights before the merge); an optimizer whose
  spec has ``merges = False`` has none;
- ``local_form()``: the same optimizer in the operation order of the per-rank steps of the period
  rules (docs/PERIOD_RULE.md 3), for an optimizer that has two; else itself;
- ``sliced(sl)``: the same optimizer on a slice of the buffers (asgd's parameter servers).

``plain_local_updates``: the plain-SGD local updates of ``--comm step`` (``glu-paper``, ``sgd``: formulas of
their own, not the optimizer's) fit between its global steps (False: ``--local-update`` refuses them).

``mask`` is the model's weight-decay mask (``model.flat.decay_mask()``: 1 on weights, 0 on biases,
norms and embeddings). ``poll`` (settable) is called every few MB of a pass: the progress hook of a
nonblocking allreduce (``ssdmpi/optim/fused.py``).

Adding an optimizer is one file in ``ssdmpi/optim/optimizers/``: an ``Optimizer`` subclass and its ``SPEC``
(``ssdmpi.spec.OptimizerSpec``); the registry finds it.
"""

from __future__ import annotations

import functools

from ssdmpi.spec import OPTIMIZER, Setting
from ssdmpi.validate import number


def array_module(x):
    """``numpy`` or ``cupy``, whichever owns ``x`` (imported late: the CLI parser imports this package)."""
    from ssdmpi.backend import array_module as owner

    return owner(x)


class PlanPoll:
    """``poll``: the progress hook of the one fused-update plan ``self._plan`` (``ssdmpi/optim/fused.py``) that a
    fused pass calls between its blocks, read and set through the plan."""

    @property
    def poll(self):
        return self._plan.poll

    @poll.setter
    def poll(self, hook) -> None:
        self._plan.poll = hook


# Every optimizer has one; its default is the optimizer's (``OptimizerSpec.defaults``).
WEIGHT_DECAY = Setting("weight_decay", None, "weight decay on weights (not on biases, norms and embeddings)",
                       float, functools.partial(number, low=0.0), group=OPTIMIZER)


class OptState(dict):
    """One optimizer state: name -> flat buffer (the parameters' size, dtype and device) or an int.

    In a checkpoint a state is stored under its holder's name: a state of one buffer as that name
    itself (momentum SGD's global velocity is ``M``, as ALGORITHM.md names it), a larger one as
    ``name.part`` (AdamW's ``M.m``, ``M.v``, ``M.count``)."""

    def copy(self) -> OptState:
        """A deep copy (buffers copied on their device)."""
        return OptState({k: v.copy() if hasattr(v, "copy") and not isinstance(v, int) else v for k, v in self.items()})

    def assign(self, other: dict) -> None:
        """Every part set from ``other`` in place (buffers copied into, counters replaced)."""
        for k, v in self.items():
            if isinstance(v, int):
                self[k] = int(other[k])
            else:
                v[...] = other[k]

    def entries(self, name: str) -> dict:
        """``{checkpoint key: buffer or int}`` of this state held as ``name``."""
        if len(self) == 1:
            return {name: next(iter(self.values()))}
        return {f"{name}.{k}": v for k, v in self.items()}

    def load_entries(self, d: dict, name: str, xp) -> None:
        """Restore ``entries(name)`` as read from a checkpoint (host arrays and scalars)."""
        for key, part in zip(self.entries(name), list(self)):
            if isinstance(self[part], int):
                self[part] = int(d[key])
            else:
                self[part][...] = xp.asarray(d[key])

    def buffers(self) -> list:
        """The buffers (not the counters), in order."""
        return [v for v in self.values() if not isinstance(v, int)]


class Optimizer:
    """Base of an inner optimizer (the module docstring is the contract). Subclasses set ``SPEC``-named
    settings from keyword arguments and implement ``init``, ``update`` and ``update_read_only``."""

    poll = None
    plain_local_updates = True

    def __init__(self, mask, **settings):
        self.mask, self.settings = mask, dict(settings)

    def init(self, params) -> OptState:
        raise NotImplementedError

    def update(self, params, state: OptState, grads, lr: float, divisor: int | None = None) -> None:
        raise NotImplementedError

    def update_read_only(self, params, state: OptState, grads, lr: float) -> None:
        raise NotImplementedError

    def merge_mean_step(self, state: OptState, mean, share: float, k: int, lr: float | None = None,
                        params=None) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no momentum merge")

    def local_form(self) -> Optimizer:
        return self

    @property
    def linear_momentum(self) -> float:
        """The momentum of the momentum-SGD linear model that stands for this optimizer in the stability
        map of the period rules (``ssdmpi/algos/stability.py``, ``--delay auto``'s stable region)."""
        raise NotImplementedError

    def sliced(self, sl) -> Optimizer:
        return type(self)(self.mask[sl], **self.settings)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        return f"{type(self).__name__}({shown})"
