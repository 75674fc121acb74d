"""One configuration of ``ssdmpi bench accuracy`` in the reference simulator (``ssdmpi/verify/reference.py``):
its CSV row.

An image model trains on the dataset's training samples (``--train-subset``: a fixed subset of them) and is
scored on its test split; a language model (``LANGUAGE_MODELS``) trains on the windows of ``context`` tokens
of a text dataset, each simulated worker's loader built as ``ssdmpi train`` builds a rank's
(``TextDataset.loader``), and is scored on the validation windows (``TextDataset.val_windows``: all, or
``val_windows`` of them evenly spread): its loss per token, its perplexity and its next-token accuracy.
"""

from __future__ import annotations

import math
import time

from ssdmpi.algos import registry
from ssdmpi.bench.accuracy.configs import ADDED_FIELDS, FIELDS, LANGUAGE_MODELS, variant_settings, warmup_iterations
from ssdmpi.errors import UserError

# --- one configuration -----------------------------------------------------------------

def run_config(cfg: dict, data_path: str | None = None) -> dict:
    """Simulate one configuration; return its CSV row (``acc_W`` after finalize, in percent; a language
    model's ``val_loss`` after finalize, in nats per token).

    It runs with one BLAS thread, whatever the caller's limits: a matrix product split over more
    threads sums in another order, and at a high learning rate that rounding changes the final
    accuracy by points, so the table would depend on the machine's cores and ``--jobs``."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _simulate_config(cfg, data_path)


def _image_data(cfg: dict, ds):
    """``(model factory, loader of each worker, (test x, test y))`` of an image model."""
    import numpy as np

    from ssdmpi.data import ShardedLoader
    from ssdmpi.nn import build_model

    x, y = ds.train_x, ds.train_y
    if cfg["train_subset"]:
        if cfg["train_subset"] > len(x):
            raise UserError(f"--train-subset {cfg['train_subset']} is more than the "
                            f"{len(x)} training samples of {cfg['dataset']}")
        # A fixed subset (independent of --seed), so runs with other seeds see the same data.
        idx = np.sort(np.random.default_rng(12345).permutation(len(x))[:cfg["train_subset"]])
        x, y = x[idx], y[idx]
    model = cfg["model"]
    options = dict(widths=(256,)) if model == "mlp" else {}

    def factory():
        return build_model(model, ds.input_shape, ds.num_classes, seed=cfg["seed"], **options)

    loaders = [ShardedLoader(x, y, cfg["batch_size"], r, cfg["N"], cfg["seed"]) for r in range(cfg["N"])]
    return factory, loaders, (ds.test_x, ds.test_y)


def _text_data(cfg: dict, ds):
    """``(model factory, loader of each worker, validation windows (x, y))`` of a language model."""
    from ssdmpi.nn import build_model

    sizes = language_model_sizes(cfg["gpt"])
    context = sizes["context"]

    def factory():
        return build_model(cfg["model"], *ds.model_inputs(context), seed=cfg["seed"], **sizes)

    loaders = [ds.loader(context, cfg["batch_size"], r, cfg["N"], cfg["seed"]) for r in range(cfg["N"])]
    return factory, loaders, ds.val_windows(context, cfg.get("val_windows") or None)


def language_model_sizes(text: str) -> dict:
    """A row's ``gpt`` (``"n_layer=2,...,context=64"``) as the model factory's keywords."""
    return {name: int(value) for name, _, value in (part.partition("=") for part in text.split(","))}


def score(sim, weights, split, targets_per_sample: int) -> tuple[float, float]:
    """``(accuracy, loss per target)`` of ``weights`` on ``split``: ``Simulation.accuracy`` counts per sample,
    and a language model's sample (a full validation window) has ``targets_per_sample`` targets, one a token."""
    acc, loss = sim.accuracy(weights, *split)
    return acc / targets_per_sample, loss / targets_per_sample


def _simulate_config(cfg: dict, data_path: str | None) -> dict:
    from ssdmpi.algos import AlgoConfig
    from ssdmpi.data import load_dataset
    from ssdmpi.verify.reference import simulate

    ds = load_dataset(cfg["dataset"], data_path)
    language = cfg["model"] in LANGUAGE_MODELS
    factory, loaders, split = (_text_data if language else _image_data)(cfg, ds)
    n = cfg["N"]
    # N = the workers that train on data (asgd's server is an extra rank: world N + servers).
    steps = max(1, int(round(cfg["epochs"] * loaders[0].steps_per_epoch)))
    algo = variant_settings(cfg["variant"], cfg["k"])
    optimizer = cfg.get("optimizer") or registry.DEFAULT_OPTIMIZER
    momentum = {} if cfg["momentum"] in ("", None) else {"momentum": cfg["momentum"]}
    config = AlgoConfig(lr=cfg["lr"], optimizer=optimizer, weight_decay=cfg["weight_decay"],
                        warmup_steps=warmup_iterations(cfg["warmup_steps"], steps), **momentum, **algo)
    per_sample = split[0].shape[1] if language else 1
    at = set(tail_iterations(steps, cfg["tail"]))
    tail = []

    def evaluate(sim):
        if sim.t in at and sim.t < steps:
            tail.append(score(sim, sim.finalized_W(), split, per_sample))

    start = time.perf_counter()
    sim = simulate(config, factory, loaders, steps, world_size=n + algo.get("servers", 0), callback=evaluate)
    acc_noflush, loss_noflush = score(sim, sim.W, split, per_sample)
    sim.finalize()
    acc, loss = score(sim, sim.W, split, per_sample)
    if at:
        tail.append((acc, loss))                          # the last evaluation is the end of training
    row = {**ADDED_FIELDS, **cfg}                        # a configuration may leave out what it does not use
    row.update(optimizer=optimizer, steps=steps, acc_W=round(100 * acc, 2), acc_W_noflush=round(100 * acc_noflush, 2),
               acc_W_tail=round(100 * sum(a for a, _ in tail) / len(tail), 2) if tail else "",
               seconds=round(time.perf_counter() - start, 1))
    if language:
        row.update(val_loss=round(loss, 5), val_loss_noflush=round(loss_noflush, 5), val_ppl=round(math.exp(loss), 4),
                   val_loss_tail=round(sum(v for _, v in tail) / len(tail), 5) if tail else "")
    return {f: row[f] for f in FIELDS}


def tail_iterations(steps: int, evals: int) -> list[int]:
    """The ``evals`` iterations of ``--tail`` (after that many iterations), spread evenly over the second
    half of ``steps``; the last is ``steps`` (the end of training). Fewer when the half is shorter."""
    half = steps // 2
    return sorted({half + (i * (steps - half)) // evals for i in range(1, evals + 1)} - {half}) if evals else []
