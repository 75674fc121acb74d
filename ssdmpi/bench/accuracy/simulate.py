"""One configuration of ``ssdmpi bench accuracy`` in the reference simulator (``ssdmpi/verify/reference.py``):
its CSV row.
"""

from __future__ import annotations

import time

from ssdmpi.algos import registry
from ssdmpi.bench.accuracy.configs import FIELDS, variant_settings
from ssdmpi.errors import UserError

# --- one configuration -----------------------------------------------------------------

def run_config(cfg: dict, data_path: str | None = None) -> dict:
    """Simulate one configuration; return its CSV row (``acc_W`` after finalize, in percent).

    It runs with one BLAS thread, whatever the caller's limits: a matrix product split over more
    threads sums in another order, and at a high learning rate that rounding changes the final
    accuracy by points, so the table would depend on the machine's cores and ``--jobs``."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _simulate_config(cfg, data_path)


def _simulate_config(cfg: dict, data_path: str | None) -> dict:
    import numpy as np

    from ssdmpi.algos import AlgoConfig
    from ssdmpi.data import ShardedLoader, load_dataset
    from ssdmpi.nn import build_model
    from ssdmpi.verify.reference import simulate

    ds = load_dataset(cfg["dataset"], data_path)
    x, y = ds.train_x, ds.train_y
    if cfg["train_subset"]:
        if cfg["train_subset"] > len(x):
            raise UserError(f"--train-subset {cfg['train_subset']} is more than the "
                            f"{len(x)} training samples of {cfg['dataset']}")
        # A fixed subset (independent of --seed), so runs with other seeds see the same data.
        idx = np.sort(np.random.default_rng(12345).permutation(len(x))[:cfg["train_subset"]])
        x, y = x[idx], y[idx]
    n, model = cfg["N"], cfg["model"]
    options = dict(widths=(256,)) if model == "mlp" else {}

    def factory():
        return build_model(model, ds.input_shape, ds.num_classes, seed=cfg["seed"], **options)

    # N = the workers that train on data (asgd's server is an extra rank: world N + servers).
    loaders = [ShardedLoader(x, y, cfg["batch_size"], r, n, cfg["seed"]) for r in range(n)]
    steps = max(1, int(round(cfg["epochs"] * loaders[0].steps_per_epoch)))
    algo = variant_settings(cfg["variant"], cfg["k"])
    optimizer = cfg.get("optimizer") or registry.DEFAULT_OPTIMIZER
    momentum = {} if cfg["momentum"] in ("", None) else {"momentum": cfg["momentum"]}
    config = AlgoConfig(lr=cfg["lr"], optimizer=optimizer, weight_decay=cfg["weight_decay"],
                        warmup_steps=cfg["warmup_steps"], **momentum, **algo)
    at = set(tail_iterations(steps, cfg["tail"]))
    tail = []

    def evaluate(sim):
        if sim.t in at and sim.t < steps:
            tail.append(sim.accuracy(sim.finalized_W(), ds.test_x, ds.test_y)[0])

    start = time.perf_counter()
    sim = simulate(config, factory, loaders, steps, world_size=n + algo.get("servers", 0), callback=evaluate)
    acc_noflush, _ = sim.accuracy(sim.W, ds.test_x, ds.test_y)
    sim.finalize()
    acc, _ = sim.accuracy(sim.W, ds.test_x, ds.test_y)
    if at:
        tail.append(acc)                                  # the last evaluation is the end of training
    row = dict(cfg, optimizer=optimizer, steps=steps, acc_W=round(100 * acc, 2),
               acc_W_noflush=round(100 * acc_noflush, 2),
               acc_W_tail=round(100 * sum(tail) / len(tail), 2) if tail else "",
               seconds=round(time.perf_counter() - start, 1))
    return {f: row[f] for f in FIELDS}


def tail_iterations(steps: int, evals: int) -> list[int]:
    """The ``evals`` iterations of ``--tail`` (after that many iterations), spread evenly over the second
    half of ``steps``; the last is ``steps`` (the end of training). Fewer when the half is shorter."""
    half = steps // 2
    return sorted({half + (i * (steps - half)) // evals for i in range(1, evals + 1)} - {half}) if evals else []
