"""Resuming on another number of ranks: a new rank's algorithm state from the old ranks' state.

What happens to each part of the state (docs/ALGORITHM.md section 6):

- **replicated state is exact**: ``W``, ``M``, a drained mean held for the next period end
  (``period.Rp``), read from the shared arrays of the checkpoint (``Algorithm.replicated``);
- **counters are kept**: ``t``, ``s``, the stage and ``--delay auto``'s choice are the same on
  every rank, taken from old rank 0 (so the learning-rate schedules go on where they were);
- **per-rank arrays are averaged over the old ranks**: local models ``L``, local momentum
  (localsgd's ``V``, delta-own's ``U``), the GLU snapshot ``P`` (equal on every rank anyway),
  the replay accumulator ``A`` (its mean over the new ranks plus their new gradients is then the
  same global sum the old ranks would have posted), the warm-up samples of ``--delay auto``.
  For ``--comm step`` nothing is in flight after the checkpoint's drain: the in-flight sum was
  already applied to ``W``;
- **delta-merge and delta-own** (``merge_displacements``): the held mean displacement and the
  ranks' mean displacement of the partial period are merged into ``W`` (``W <- W + Rp + mean(L - S)``,
  what ``finalize`` does), and the period restarts from there: ``L = S = W`` on every rank, nothing in
  flight; its end posts the displacement made since the resume. A delta-merge sum in flight
  mid-delay (posted, not yet merged) is the held ``Rp``: merged now; its merge iteration then has
  nothing to add. With an outer optimizer both merges are its steps, and its momentum buffer
  (``outer.momentum``, replicated) is kept exactly;
- **asgd** (``asgd``): the servers' ``W`` and optimizer state (every part of ``M_shard``: momentum
  SGD's velocity, AdamW's ``m``, ``v`` and ``count``) are kept exactly (the servers, hence their shards,
  are the same), every worker starts from a fresh pull of ``W``, and the staleness
  counters restart (``version = s``, ``pushes = t``).

``ctx`` is ``ssdmpi/checkpoint/load.py``'s ``OldRanks``: ``ctx.values(group)`` (old rank 0's
plain values), ``ctx.arrays(group)`` (the per-rank arrays there: name -> shape and dtype),
``ctx.shared_names(group)``, ``ctx.shared(name)`` (exact, collective), ``ctx.weights()`` (the
global model, collective), ``ctx.mean(path)``
(collective), ``ctx.of_rank(r, path)`` (old rank ``r``'s value, read by this rank alone). Every
new rank makes the collective calls in the same order.
"""

from __future__ import annotations


def host_copies(d: dict) -> dict:
    """``d`` with every array (host or device) replaced by a NumPy copy."""
    import numpy as np

    from ssdmpi import backend

    return {k: backend.to_host(v).copy() if backend.is_device_array(v) or isinstance(v, np.ndarray) else v
            for k, v in d.items()}


def averaged(ctx) -> tuple[dict, str]:
    """Replicated arrays exact, plain values from old rank 0, per-rank float arrays averaged over
    the old ranks (other arrays from old rank 0); returns ``(state, what was averaged)``."""
    state = dict(ctx.values("algo"))
    for name in ctx.shared_names("algo"):
        state[name.split("/", 1)[1]] = ctx.shared(name)
    means = []
    for key, info in sorted(ctx.arrays("algo").items()):
        if info.dtype.kind == "f":
            state[key] = ctx.mean(f"algo/{key}")
            means.append(key)
        else:
            state[key] = ctx.of_rank(0, f"algo/{key}")
    return state, (f"averaged over the {ctx.old_size} old ranks: {', '.join(means)}" if means
                   else "no per-rank state to merge")


def merge_displacements(state: dict, k: int, outer=None) -> str:
    """delta-merge, delta-own: ``W <- W + Rp + mean(L - S)`` (``s += k`` for a held ``Rp``), then ``L = S = W``
    and nothing held. ``state`` is ``averaged``'s (``L``, ``period.S`` and ``period.U`` are means). ``outer``:
    the outer step, ``outer(W, mean) -> W`` (advancing the global buffer kept exactly in ``state``), applied
    to ``Rp`` and to ``mean(L - S)`` in turn, as ``finalize`` does (None: the additions)."""
    add = outer or (lambda W, mean: W + mean)
    W = state["W"]
    if int(state.get("period.has_Rp", 0)):
        W = add(W, state.pop("period.Rp"))
        state["s"] = int(state["s"]) + int(k)
    W = add(W, state["L"] - state["period.S"])
    state.update({"W": W, "L": W.copy(), "period.S": W.copy(), "period.has_Rp": 0})
    return ("merged into W" + (" through the outer step" if outer else "") + ": the mean displacement in flight "
            "and the old ranks' mean displacement of the partial period; L = S = W (the period restarts); local "
            "momentum U averaged")


def asgd(algo, ctx) -> tuple[dict, str]:
    """The asgd state of this rank (server or worker) from a checkpoint with another worker count."""
    import numpy as np

    old_workers = ctx.old_size - algo.S
    W = ctx.weights()
    first = ctx.values("algo")
    t, s = int(first["t"]), int(first["s"])
    state = {"algo": algo.name, "role": "server" if algo.is_server else "worker", "t": t, "s": s,
             "stage": first["stage"]}
    if algo.is_server:
        part = algo.shards[algo.j]
        old = old_workers + algo.j      # the old rank of the same server
        state.update({key: ctx.of_rank(old, f"algo/{key}") for key in algo.Mj.entries("M_shard")})
        state.update(W_shard=W[part].copy(), shard=ctx.of_rank(old, "algo/shard"),
                     version=np.full(algo.K, s, dtype=np.int64), pushes=np.full(algo.K, t, dtype=np.int64))
    else:
        state["L"] = W.copy()
    return state, ("servers' W and M kept exactly; every worker starts from a fresh pull of W; "
                   "staleness counters restart")
