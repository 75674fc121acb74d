"""Training algorithms (ALGORITHM.md): ``ssgd``, ``ssd`` (both schedules), ``odsgd``, ``localsgd``,
``asgd`` (parameter-server ranks; ``asgd.py`` says where it differs from the API below).

Each algorithm and each period rule is declared once, in the registry (``registry.py``, the
rules in ``rules/``): its settings, its implementation, its twin in ``reference.py`` (the
single-process simulator of ``N`` workers that the tests use as the oracle).
Build one with ``build_algorithm(config, model, communicator)``.

The Algorithm API (what the trainer uses)
-----------------------------------------

``algo = build_algorithm(config: AlgoConfig, model, communicator)``
    Validates ``config`` (``UserError`` on nonsense) and builds the algorithm its spec names. ``W`` is
    initialised from ``model.params``: broadcast rank 0's weights BEFORE building. From
    then on ``model.params`` belongs to the algorithm: it holds the weights the model
    computes on (``W`` in the warm-up, ``L`` in the delay stage); do not write it.
    Collective: every rank builds with the same config.

``algo.step(x, y) -> float``  (collective)
    Runs iteration ``t`` on this rank's batch: forward/backward on the current compute
    weights (``model.loss_and_grad``), the communication of the schedule, the global
    and local updates. Returns the mean loss of the batch (computed before the update):
    a float on NumPy, a 0-d device array on CuPy (reading it waits for the GPU).

``algo.drain()``  (collective)
    Completes any request in flight. ``ssd --comm step`` applies the completed global
    update at once; ``--comm period`` holds the result until the iteration where the
    schedule applies it (see ``SSDPeriod``). Either way, continuing after ``drain()`` is
    bitwise the same as not draining. No-op for ssgd, localsgd and in the warm-up.

``algo.finalize()``  (collective)
    End of training: drain and apply every held result to ``W`` now (so ``W`` contains
    every gradient that was communicated); ``delta-merge`` and ``delta-own`` also fold the
    progress not yet posted into ``W`` with one blocking allreduce (docs/PERIOD_RULE.md),
    so ``W`` is the mean of the ranks' local models. Not trajectory-preserving: call it once, at the end.

``algo.global_weights()`` -> ``W`` (1-D view, identical on every rank);
``algo.local_weights()`` -> ``L`` (this rank's) or None outside the delay stage.
``algo.stage`` -> ``"warmup"`` | ``"delay"``; ``algo.t`` -> iterations done (the index of
the next one); ``algo.s`` -> global steps applied to ``W`` (for localsgd and the ``delta``
rule: iterations' worth averaged into ``W``); ``algo.m`` -> ``t - T_w`` or None;
``algo.lr_global`` -> the global lr the next iteration steps with: ``eta_g(s)`` of the next
global update, or ``eta_g(t)`` where the delay stage's only steps are SGD on ``L`` (localsgd,
delta-merge, delta-own); ``algo.lr_local`` -> the lr of the next local step (None in the warm-up). These
are what metrics.jsonl logs as ``lr`` and ``lr_local``.

``algo.state_dict() -> dict``  (collective: drains first)
    NumPy arrays and plain scalars (HDF5-storable): ``algo``, ``t``, ``s``, ``stage``,
    ``W``, ``M``; in the delay stage also ``L`` and the schedule's state: ``local.P``
    (glu-paper); ``period.acc``, ``period.has_Rp`` and, when 1, ``period.Rp`` (a drained,
    not yet applied mean; --comm period); ``period.U``, ``period.S`` (delta-merge, delta-own); ``V``
    (localsgd). ``--comm step`` has nothing in flight after the drain. BatchNorm buffers are the trainer's
    (``model.buffers()``), as are data order and RNG state.
``algo.load_state_dict(d)``
    Restores it into an algorithm built with the same config and model (``UserError``
    when the state does not fit). Continuing is bit for bit the uninterrupted run.

``algo.signature() -> dict``
    The settings every rank must agree on (resolved config, world size, parameter count,
    dtype), as plain scalars keyed ``algo.*``.

Gradient scaling: the engine leaves the MEAN gradient ``g/B`` in ``model.grads``;
``allreduce_mean`` of it is ALGORITHM.md's ``G/(B*N)``, and ``gbar = g/(B*N)`` is the
mean gradient divided by ``N``.
"""

from __future__ import annotations

from ssdmpi.algos.registry import AlgoConfig, build_algorithm

__all__ = ["AlgoConfig", "build_algorithm"]
