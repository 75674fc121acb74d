"""The measurements of ``ssdmpi bench model`` (collective: every rank calls them).

What it measures (all ranks together, rank 0 prints; ``--ranks`` >= 2, default 2):

1. allreduce time vs size on this network (the Communicator's blocking allreduce of a
   float32 buffer; median of ``--allreduce-repeats``), at the ``--fit-sizes`` and at the held-out
   ``--check-sizes`` plus the model's own gradient size;
2. step loops of the real model (``--model``, random batches of ``--batch-size``): the
   same step (forward, backward, an SGD update of the flat weights) with no communication
   (that is ``c``, the compute time per step), and with each variant's communication
   pattern: ``blocking`` (blocking allreduce of the gradient every step: ssgd), ``averaging:K``
   (blocking allreduce of the weights every k steps: localsgd), ``step`` (nonblocking allreduce of
   each step's gradient, waited one step later: ``ssd --comm step`` / ``odsgd``) and
   ``period:K`` (gradients accumulated over k steps, one nonblocking allreduce per period,
   waited at the end of the next period: ``ssd --comm period``) and ``servers:P`` (the last
   ``P`` ranks are parameter servers, the others workers that push their gradient's slices
   and pull fresh weights every step, as asgd does, with message tags of its own). Variants are interleaved
   and repeated ``--repeats`` times; each time per step is the slowest rank's, median over
   repeats;
3. overlap, in every repeat: compute steps run while an allreduce of the gradient size is
   in flight, giving ``c_busy`` (a compute step that ended before the allreduce completed)
   and ``T_busy`` (the allreduce's in-flight time while compute ran). On a GPU, or with
   spare cores, ``c_busy = c`` and ``T_busy = T``; on a CPU whose cores all compute, the
   communication (an MPI library busy-polling the network, the kernel copying TCP data,
   the reduction) and the compute take cycles from each other, and both grow.
"""

from __future__ import annotations

import statistics
import time

from ssdmpi.bench.model.alphabeta import Pattern, parse_pattern
from ssdmpi.parsing import parse_list

MB = 1_000_000
PUSH_TAG, PULL_TAG = 7501, 7502     # the servers loop's messages (point to point, on the bench's communicator)


def sizes_mb(text: str, flag: str) -> list:
    """``"1,4,16"`` -> ``[1.0, 4.0, 16.0]`` (MB); a one-line ``UserError`` naming ``flag`` otherwise."""
    return parse_list(text, flag, float, minimum=0, strict=True, example="1,4,16")


def _time_allreduce(comm, nbytes: int, reps: int) -> float:
    """Median seconds of the slowest rank's blocking allreduce of ``nbytes`` (float32)."""
    import numpy as np

    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    comm.allreduce(buf, average=False)   # first touch, connection set-up
    times = []
    for _ in range(reps):
        comm.barrier()
        start = time.perf_counter()
        comm.allreduce(buf, average=False)
        times.append(_slowest(comm, time.perf_counter() - start))
    return statistics.median(times)


def _slowest(comm, seconds: float) -> float:
    """Collective: the largest of the ranks' ``seconds``."""
    return comm.allreduce_scalars({"s": seconds}, op="max")["s"]


def _compute(model, x, labels) -> None:
    """One compute step: forward, backward, and an SGD update of the flat weights.

    A tiny learning rate keeps the weights sane over any number of steps; the update is
    done in place, as the optimizers do (two passes over the flat buffers).
    """
    model.loss_and_grad(x, labels)
    model.grads *= 1e-6
    model.params -= model.grads


def _step_loop(comm, model, x, labels, pattern: Pattern, steps: int, warm: int) -> float:
    """Seconds per step (slowest rank) of ``steps`` steps after ``warm`` unmeasured ones."""
    import numpy as np

    params, grads = model.params, model.grads
    inflight = np.empty_like(grads)
    acc = np.zeros_like(grads)
    handle = None
    start = None
    for i in range(warm + steps):
        if i == warm:
            comm.barrier()
            start = time.perf_counter()
        _compute(model, x, labels)
        blocking, periodic = pattern.comm.allreduce == "blocking", pattern.comm.periodic
        if blocking and not periodic:                   # blocking (ssgd)
            comm.allreduce(grads, average=False)
        elif pattern.comm.allreduce == "overlapped" and not periodic:        # step (ssd --comm step)
            if handle is not None:
                handle.wait()
            np.copyto(inflight, grads)
            handle = comm.allreduce_start(inflight, average=False)
        elif pattern.comm.allreduce == "overlapped":  # period (ssd --comm period)
            acc += grads
            if (i + 1) % pattern.k == 0:
                if handle is not None:
                    handle.wait()
                np.copyto(inflight, acc)
                acc.fill(0)
                handle = comm.allreduce_start(inflight, average=False)
        if blocking and periodic and (i + 1) % pattern.k == 0:      # averaging (localsgd)
            comm.allreduce(params, average=True)
    elapsed = time.perf_counter() - start
    if handle is not None:
        handle.wait()
    return _slowest(comm, elapsed / steps)


def _ps_loop(comm, model, x, labels, servers: int, steps: int, warm: int) -> float:
    """The parameter servers' exchange (asgd's): seconds per step of the slowest worker.

    Ranks ``0..K-1`` are workers: compute, then push each server its slice of the gradient
    and receive that server's fresh slice of the weights into ``model.params``. The last
    ``servers`` ranks serve ``K`` pushes per step in arrival order: receive, a tiny SGD
    update of their slice, send it back (the reply overlaps the next receive). Every count is
    fixed (``K * (warm + steps)`` pushes per server), so the loop cannot hang on a lost message.
    """
    import numpy as np

    K = comm.size - servers
    shards = [shard(model.params.size, j, servers) for j in range(servers)]
    comm.barrier()
    elapsed = 0.0
    if comm.rank >= K:
        mine = model.params[shards[comm.rank - K]].copy()
        inbox = np.empty_like(mine)
        outbox = [np.empty_like(mine) for _ in range(K)]
        replies = [None] * K
        for _ in range(K * (warm + steps)):
            handle = comm.recv_start(inbox, None, PUSH_TAG)
            handle.wait()
            w = handle.source
            mine -= 1e-6 * inbox
            if replies[w] is not None:
                replies[w].wait()
            outbox[w][...] = mine
            replies[w] = comm.send_start(outbox[w], w, PULL_TAG)
        comm.wait_all([r for r in replies if r is not None])
    else:
        start = time.perf_counter()
        for i in range(warm + steps):
            if i == warm:
                start = time.perf_counter()
            model.loss_and_grad(x, labels)
            pulls = [comm.recv_start(model.params[sl], K + j, PULL_TAG) for j, sl in enumerate(shards)]
            pushes = [comm.send_start(model.grads[sl], K + j, PUSH_TAG) for j, sl in enumerate(shards)]
            comm.wait_all(pushes + pulls)
        elapsed = (time.perf_counter() - start) / steps
    return _slowest(comm, elapsed)


def shard(n: int, j: int, servers: int) -> slice:
    """Server ``j``'s contiguous slice of ``n`` weights (sizes differ by at most one)."""
    base, extra = divmod(int(n), int(servers))
    start = j * base + min(j, extra)
    return slice(start, start + base + (1 if j < extra else 0))


def _overlapped(comm, model, x, labels, nbytes: int, reps: int) -> tuple:
    """Compute and an allreduce of ``nbytes`` at the same time: ``(c_busy, T_busy)``, the
    median seconds of a compute step that ran entirely while the allreduce was in flight,
    and the median in-flight time of the allreduce while compute ran (slowest rank each).

    ``c_busy`` is None when no step fitted inside an allreduce. ``T_busy`` is the
    Communicator's own in-flight time (exact with the thread strategy).
    """
    import numpy as np

    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    steps, flights = [], []
    for _ in range(reps):
        comm.barrier()
        comm.stats.reset()
        handle = comm.allreduce_start(buf, average=False)
        while not handle.test():
            start = time.perf_counter()
            _compute(model, x, labels)
            elapsed = time.perf_counter() - start
            if not handle.test():
                steps.append(elapsed)
        handle.wait()
        flights.append(comm.stats.snapshot()["inflight_s"])
    # A rank without a sample says so explicitly: MPI's MAX of a NaN depends on the order.
    worst = comm.allreduce_scalars({"c_busy": statistics.median(steps) if steps else 0.0,
                                    "no_sample": 0.0 if steps else 1.0,
                                    "t_busy": statistics.median(flights)}, op="max")
    return (None if worst["no_sample"] else worst["c_busy"]), worst["t_busy"]


def measure(args, comm, log) -> dict:
    """Every measurement of the module docstring, identical on all ranks (collective)."""
    import numpy as np

    from ssdmpi.nn import build_model

    model = build_model(args.model, (1, 28, 28), 10, seed=args.seed)
    grad_bytes = int(model.grads.nbytes)
    rng = np.random.default_rng(args.seed + comm.rank)
    x = rng.standard_normal((args.batch_size, 1, 28, 28)).astype(model.dtype)
    labels = rng.integers(0, 10, args.batch_size)

    fit_bytes = [int(s * MB) for s in sizes_mb(args.fit_sizes, "--fit-sizes")]
    check_bytes = [int(s * MB) for s in sizes_mb(args.check_sizes, "--check-sizes")] + [grad_bytes]
    allreduce = {}
    for nbytes in fit_bytes + check_bytes:
        allreduce[nbytes] = _time_allreduce(comm, nbytes, args.allreduce_repeats)
        log(f"allreduce {nbytes / MB:8.2f} MB: {allreduce[nbytes] * 1e3:9.2f} ms")

    patterns = [Pattern("none")] + [parse_pattern(p) for p in args.patterns.split(",")]
    loops, busy, flights = {p: [] for p in patterns}, [], []
    for rep in range(args.repeats):
        # Measured in every repeat, next to c and the loops, so all of them see the same load.
        c_busy, t_busy = _overlapped(comm, model, x, labels, grad_bytes, 2)
        busy.append(c_busy)
        flights.append(t_busy)
        log(f"repeat {rep + 1}/{args.repeats} overlapped: compute "
            f"{'n/a' if c_busy is None else f'{c_busy * 1e3:.2f} ms/step'}, allreduce {t_busy * 1e3:.2f} ms")
        for p in patterns:
            if p.comm.allreduce == "servers":
                loops[p].append(_ps_loop(comm, model, x, labels, p.k, args.steps, 2))
                log(f"repeat {rep + 1}/{args.repeats} {p.name:>18}: {loops[p][-1] * 1e3:9.2f} ms/step")
                continue
            steps = max(args.steps, 2 * p.k)
            steps += -steps % p.k                     # whole periods only
            warm = max(2, p.k + 1)                    # an allreduce already in flight when timing starts
            loops[p].append(_step_loop(comm, model, x, labels, p, steps, warm))
            log(f"repeat {rep + 1}/{args.repeats} {p.name:>18}: {loops[p][-1] * 1e3:9.2f} ms/step")
    busy = [b for b in busy if b is not None]
    compute_busy = statistics.median(busy) if busy else None
    allreduce_busy = statistics.median(flights)
    return {"model": args.model, "num_params": int(model.num_params), "grad_bytes": grad_bytes,
            "batch_size": args.batch_size, "ranks": comm.size,
            "fit_bytes": fit_bytes, "check_bytes": check_bytes,
            "allreduce_s": {str(n): t for n, t in allreduce.items()},
            "step_s": {p.name: statistics.median(v) for p, v in loops.items()}, "compute_busy_s": compute_busy,
            "allreduce_busy_s": allreduce_busy,
            "patterns": [[p.kind, p.k] for p in patterns]}
