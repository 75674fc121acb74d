"""Update rules of ``--comm period`` (ALGORITHM.md 5b): one allreduce per period of ``k``.

A period is the ``k`` iterations ``m = j*k ... j*k + k - 1`` of the delay stage; its
end is the iteration with ``(m + 1) % k == 0``. Each rule posts one nonblocking
allreduce at a period's end and completes it at the next period's end (a whole period
of compute to hide behind) or, for a rule with a merge delay ``d`` (a setting of its own),
``d`` iterations later. Two buffers alternate: one accumulating, one in flight. ``g`` is
this rank's MEAN gradient.

Each rule is one file of ``ssdmpi/algos/rules/`` holding its ``PeriodRule`` subclass and its
``SPEC`` (``RuleSpec``: name, settings, reference twin), found there by the registry
(``ssdmpi/algos/registry.py``); ``python -c "from ssdmpi.algos import registry;
print(registry.RULES)"`` lists them. A rule sees the algorithm only through its
``PeriodState``: the buffers, the counters, the optimizers and the communicator it may use.

A result drained between iterations (checkpoint) is held (``has_Rp``, ``Rp``) and
applied at the boundary where the wait would have returned it, so resuming is bitwise.

``--comm-dtype`` (``PeriodState.comm_dtype``): every post of a rule (``PeriodRule._post``) travels
compressed (``ssdmpi/comm/compressed.py``: bfloat16, float16 or int8 on the wire, summed in float32,
the same result on every rank) with error feedback; what the rule does with the sum is unchanged. The
residuals are the rule's state (``ef.residual``, ``ef.shard_residual``: resumed bitwise; restarted at
zero on another rank count, ``PeriodRule.resized_transport``). The blocking mean of a partial period at
the end of training (``finalize``) is float32.

Adding a rule: a file in ``ssdmpi/algos/rules/`` (a ``PeriodRule`` subclass and its ``SPEC``),
the same rule written independently from the spec in ``ssdmpi/verify/reference.py`` (the twin
its ``SPEC`` names), and its tests; nothing else names it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counts:
    """An algorithm's counters: ``t`` iterations done, ``s`` global steps applied to ``W``."""

    t: int = 0
    s: int = 0


@dataclass
class PeriodState:
    """All a period rule may use of the ``SSDPeriod`` that owns it.

    Buffers (1-D, updated in place; ``L`` is what the model computes on): ``W``, ``L`` and the
    weight-decay ``mask``; ``xp`` their array module. ``M``: the global optimizer state (an
    ``OptState``). ``counts``: ``t`` (read) and ``s`` (a rule adds the global steps it applies).
    ``N`` ranks, period ``k``, warm-up length ``T_w``; ``schedule`` the global lr ``eta_g``;
    ``optimizer`` the inner optimizer (``ssdmpi/optim/part.py``: it steps ``W`` with ``M``, and a
    rule's own per-rank state); ``local`` the ``--local-update`` (None for a rule without one) and
    ``local_lr(t)`` its lr; ``comm`` the Communicator (``allreduce_start``, ``allreduce_mean``);
    ``poll`` the progress hook of the fused passes (or None); ``comm_dtype`` what its posts travel as
    (``--comm-dtype``; None: uncompressed float32); ``outer`` the outer optimizer of a rule whose merge adds
    the ranks' mean displacement to ``W`` (``ssdmpi/optim/outer.py``; None: the plain addition) and ``B``
    its global momentum buffer. A rule's own settings are the keyword arguments it is built with, not in here.
    """

    xp: object
    W: object
    M: object
    L: object
    mask: object
    counts: Counts
    N: int
    k: int
    T_w: int
    schedule: object
    optimizer: object
    local: object
    local_lr: object
    comm: object
    poll: object = None
    comm_dtype: str | None = None
    outer: object = None
    B: object = None


class PeriodRule:
    """Base: the double buffer and the request in flight, over a ``PeriodState`` ``st``.

    Contract: built as ``Rule(state, **own)`` (``own``: the values of the settings its spec declares;
    a rule with settings takes them as keyword arguments and passes none on); ``begin()`` at the switch (``L`` has just been set to ``W``); ``step(g, m)``
    once per delay iteration after the gradient; ``drain()`` completes the request in flight
    and holds its (averaged) result; ``apply_held()`` applies a held result now;
    ``state_dict()``/``load_state_dict()``; ``local_lr(t)`` for rules without ``--local-update``.
    """

    folds_mean = False   # True: post the SUM; the rule divides by N as it applies it (no separate pass)

    def __init__(self, state: PeriodState, **own):
        if own:
            raise TypeError(f"{type(self).__name__} has no settings of its own, got {sorted(own)}")
        self.st = state
        self._acc = state.xp.zeros_like(state.W)       # being filled this period
        self._other = state.xp.zeros_like(state.W)     # in flight, or a held result, or free
        self._handle = None
        self._held = False
        # the posts' compressed transport and its error feedback (None: float32, a plain allreduce)
        self._compressor = None if state.comm_dtype is None else state.comm.compressor(state.comm_dtype, state.W)

    def begin(self) -> None:
        pass

    def local_lr(self, t: int) -> float:
        return self.st.schedule(t)

    def _post(self, buf):
        """Start the allreduce of ``buf`` (sum, or mean unless ``folds_mean``), in ``--comm-dtype``."""
        if self._compressor is None:
            return self.st.comm.allreduce_start(buf, average=not self.folds_mean)
        return self.st.comm.allreduce_start(buf, average=not self.folds_mean, compressor=self._compressor)

    def drain(self) -> None:
        """Complete the request in flight and hold its mean (a folded sum is divided here: drains
        happen at checkpoints and evaluations, and a checkpoint's held result is the mean)."""
        if self._handle is not None:
            self._handle.wait()
            self._handle = None
            self._held = True
            if self.folds_mean and self.st.N > 1:
                self._other /= self.st.N

    def _swap_in(self, handle) -> None:
        """``_acc`` was just posted as ``handle``: it becomes the in-flight buffer."""
        self._acc, self._other = self._other, self._acc
        self._handle = handle

    def finalize(self) -> None:
        """End of training: complete and apply whatever is in flight now."""
        self.drain()
        self.apply_held()

    def apply_held(self) -> None:
        if self._held:
            self._apply(self._other)
            self._held = False

    def _apply(self, reduced) -> None:
        raise NotImplementedError

    def reset_inflight(self) -> None:
        self._handle, self._held = None, False

    def state_dict(self) -> dict:
        """The live buffers: ``acc``, ``has_Rp`` and, when 1, the held mean ``Rp``; with ``--comm-dtype``
        the error feedback (``ef.residual``, ``ef.shard_residual``: this rank's)."""
        d = {"acc": self._acc, "has_Rp": int(self._held)}
        if self._held:
            d["Rp"] = self._other
        if self._compressor is not None:
            d.update({f"ef.{k}": v for k, v in self._compressor.state_dict().items()})
        return d

    def replicated(self) -> tuple:
        """Keys of ``state_dict()`` identical on every rank: a held mean is the allreduce's result."""
        return ("Rp",) if self._held else ()

    @staticmethod
    def resized(state: dict, k: int, outer=None) -> str:
        """Resuming on another number of ranks: change the averaged ``state`` (``resize.averaged``)
        where this rule needs more; return what was merged ("": nothing more). ``outer``: the outer step on
        host arrays, ``outer(W, mean) -> W`` (None: the plain addition)."""
        return ""

    @staticmethod
    def resized_transport(state: dict, prefix: str = "") -> str:
        """Resuming on another number of ranks: the error feedback restarts at zero (the shards are
        others, and an average would owe the old ranks' debt ``N'/N`` times); "" when there was none."""
        keys = [key for key in state if key.startswith(f"{prefix}ef.")]
        for key in keys:
            del state[key]
        return "the compressed transport's error-feedback residuals restart at zero" if keys else ""

    def load_state_dict(self, d: dict) -> None:
        xp = self.st.xp
        if self._compressor is not None:
            if "ef.residual" in d:
                self._compressor.load_state_dict({k[3:]: v for k, v in d.items() if k.startswith("ef.")})
            else:
                self._compressor.reset()
        self._handle = None
        if "acc" in d:
            self._acc[...] = xp.asarray(d["acc"])
        self._held = bool(int(d["has_Rp"]))
        if self._held:
            self._other[...] = xp.asarray(d["Rp"])
