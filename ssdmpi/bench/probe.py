"""The compute probe of ``ssdmpi bench peers``: after the runs, this process times one forward pass, one
backward pass and one update of the model at the per-rank batch, ssdmpi's engine and the PyTorch twin
interleaved (``--probe-repeats``, medians), with the threads each rank gets (``rank_threads``). It says
how much of a gap is engine speed, and splits the baseline's measured forward+backward into ``c_fwd`` and
``c_bwd`` for the overlap bound (``peers.add_overlap_bounds``).
"""

from __future__ import annotations

import os
import time

from ssdmpi.bench.stats import median

WARMUP_ROUNDS = 2            # untimed passes of each engine before the compute probe's timed ones


def rank_threads(args) -> int:
    """The BLAS threads each rank of the runs gets (``ssdmpi/comm/node.py``'s rule): the thread
    variables when set; 1 on the namespaced cluster (``launch.single_threaded_env``); else the
    usable CPUs divided among the ranks."""
    from ssdmpi.comm.node import usable_cpus

    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        if os.environ.get(name, "").isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    if args.nodes:
        return 1
    return max(1, len(usable_cpus()) // args.ranks)


def compute_probe(args, repeats: int) -> dict | None:
    """Median seconds of one forward, one backward pass (train mode, the per-rank batch) and one
    update (momentum SGD with weight decay on the weights) of ssdmpi's engine and of its PyTorch
    twin (when PyTorch imports; the peers' ``SpecSGD``), interleaved, single process, no MPI, with
    ``rank_threads`` threads. None with ``repeats`` 0."""
    if repeats < 1:
        return None
    import numpy as np
    from threadpoolctl import threadpool_limits

    from ssdmpi.bench.runner import subset_path
    from ssdmpi.data import load_dataset
    from ssdmpi.nn import build_model
    from ssdmpi.nn.loss import softmax_cross_entropy
    from ssdmpi.optim.optimizers.sgd import MomentumSGD
    from ssdmpi.verify.torch_ref import torch_available

    data = load_dataset("hdf5", str(subset_path(args))) if args.train_subset else load_dataset(args.dataset)
    model = build_model(args.model, data.input_shape, data.num_classes, seed=args.seed)
    threads = rank_threads(args)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch_size,) + tuple(data.input_shape)).astype(np.float32)
    y = rng.integers(0, data.num_classes, args.batch_size)
    clock = time.perf_counter
    timings = {f"{who}_{what}": [] for who in ("engine", "torch") for what in ("fwd", "bwd", "update")}
    sgd = MomentumSGD(model.flat.decay_mask(), momentum=0.9, weight_decay=1e-4)
    velocity = sgd.init(model.params)

    def engine():
        t0 = clock()
        logits = model.forward(x, train=True)
        _, dlogits = softmax_cross_entropy(logits, y)
        t1 = clock()
        model.backward(dlogits)
        t2 = clock()
        sgd.update(model.params, velocity, model.grads, args.lr)
        return t1 - t0, t2 - t1, clock() - t2

    steps = [("engine", engine)]
    has_torch = torch_available()[0]
    if has_torch:
        import torch

        old_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        steps.append(("torch", _torch_step(model, x, y, args.lr)))
    try:
        with threadpool_limits(threads):
            for i in range(repeats + WARMUP_ROUNDS):     # alternating order; the first rounds untimed
                for name, step in (steps if i % 2 else steps[::-1]):
                    times = step()
                    if i >= WARMUP_ROUNDS:
                        for what, seconds in zip(("fwd", "bwd", "update"), times):
                            timings[f"{name}_{what}"].append(seconds)
    finally:
        if has_torch:
            torch.set_num_threads(old_threads)
    out = {"threads": threads, "batch_size": args.batch_size, "repeats": repeats}
    out.update({f"{k}_ms": 1e3 * median(v) for k, v in timings.items() if v})
    out["engine_fwd_share"] = out["engine_fwd_ms"] / (out["engine_fwd_ms"] + out["engine_bwd_ms"])
    if has_torch:
        out["engine_over_torch"] = (out["engine_fwd_ms"] + out["engine_bwd_ms"]) / \
            (out["torch_fwd_ms"] + out["torch_bwd_ms"])
        out["update_engine_over_torch"] = out["engine_update_ms"] / out["torch_update_ms"]
    return out


def _torch_step(model, x, y, lr: float):
    """The compute probe's PyTorch step on the twin of ``model``: ``() -> (fwd_s, bwd_s, update_s)``."""
    import torch
    import torch.nn.functional as F

    from ssdmpi.bench.torch_parts import spec_sgd
    from ssdmpi.verify.torch_ref import build_torch_model

    twin, tx, ty = build_torch_model(model), torch.from_numpy(x), torch.from_numpy(y)
    opt = spec_sgd(twin, model, 0.9, 1e-4)
    for group in opt.param_groups:
        group["lr"] = lr
    clock = time.perf_counter

    def step():
        t0 = clock()
        loss = F.cross_entropy(twin(tx), ty)
        t1 = clock()
        loss.backward()
        t2 = clock()
        opt.step()
        twin.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1, clock() - t2
    return step


def probe_line(probe) -> str:
    if not probe:
        return ""
    line = (f"Compute probe (one process, {probe['threads']} thread(s), batch {probe['batch_size']}, median of "
            f"{probe['repeats']}): engine forward {probe['engine_fwd_ms']:.3g} ms + backward "
            f"{probe['engine_bwd_ms']:.3g} ms, update {probe['engine_update_ms']:.3g} ms")
    if "torch_fwd_ms" in probe:
        line += (f"; PyTorch forward {probe['torch_fwd_ms']:.3g} ms + backward {probe['torch_bwd_ms']:.3g} ms "
                 f"(engine / PyTorch: {probe['engine_over_torch']:.2f}x), update {probe['torch_update_ms']:.3g} ms "
                 f"(engine / PyTorch: {probe['update_engine_over_torch']:.2f}x)")
    return line + "."
