"""Every rank: the run's objects from its resolved config (``setup``: data, model, algorithm, loader,
checkpoint writer, the ``Job``) and the checkpoint's state given to them (``resume``). The config was
resolved once, on rank 0 (``ssdmpi/run/start.py``); the algorithm gets it in steps
(``config.algo_config``), not resolved again.
"""

from __future__ import annotations

import os

import numpy as np

from ssdmpi import backend, checkpoint
from ssdmpi import config as configuration
from ssdmpi.algos import build_algorithm
from ssdmpi.checkpoint import CheckpointWriter
from ssdmpi.config.settings import model_options
from ssdmpi.data import ShardedLoader, load_dataset
from ssdmpi.errors import UserError
from ssdmpi.nn import build_model
from ssdmpi.run.evaluation import Evaluator
from ssdmpi.run.job import Job
from ssdmpi.run.state import TrainingState


def check_lr_warmup(cfg, algo_cfg) -> None:
    """``UserError`` unless the lr warm-up (``--lr-warmup-epochs``) ends before the run does: a
    warm-up as long as the run never trains at ``--lr`` (at 50 epochs of warm-up in a 20-epoch
    run the lr ends at 40% of it)."""
    warmup, total = int(algo_cfg.lr_warmup_steps), int(algo_cfg.total_steps)
    if warmup and warmup >= total:
        raise UserError(f"--lr-warmup-epochs {cfg.lr_warmup_epochs:g} ({warmup} steps) is not shorter than the run "
                        f"({total} steps): the lr would never reach --lr {cfg.lr:g}; give a warm-up shorter than the "
                        "run, or train longer (--epochs, --steps)")


def is_language(dataset) -> bool:
    """Whether ``dataset`` is text (``ssdmpi/data/text.py``: token windows), whose run trains a language model."""
    return dataset.kind == "text"


def model_inputs(dataset, context) -> tuple[tuple, int]:
    """``(input_shape, num_classes)`` a model of ``dataset`` is built for: a text dataset's windows of
    ``context`` tokens and its vocabulary, or an image or tabular dataset's samples and classes."""
    return dataset.model_inputs(context) if is_language(dataset) else (dataset.input_shape, dataset.num_classes)


def eval_split(dataset, context) -> tuple:
    """``(x, y)`` a model of ``dataset`` is evaluated on: a text dataset's validation windows of ``context``
    tokens (all of them), else its test split."""
    return dataset.val_windows(context) if is_language(dataset) else (dataset.test_x, dataset.test_y)


def check_kinds(model, dataset, name) -> None:
    """A collective ``UserError`` unless ``model`` (``--model name``) takes what ``dataset`` holds: token
    ids for a text dataset (``model.input_kind == "tokens"``), images or feature vectors for the others."""
    if (model.input_kind == "tokens") == is_language(dataset):
        return
    if is_language(dataset):
        raise UserError(f"--model {name} takes images or feature vectors, but {dataset.name} is text (windows of "
                        "tokens for a language model): use --model gpt, or an image or tabular --dataset",
                        collective=True)
    raise UserError(f"--model {name} is a language model (it takes token ids), but {dataset.name} holds images "
                    "or feature vectors: use a text --dataset (devils-dictionary, kjv, text)", collective=True)


def train_loader(cfg, dataset, rank: int, workers: int) -> ShardedLoader:
    """This rank's loader: a text dataset's windows of ``cfg.context`` tokens, or the samples of another."""
    prefetch = backend.device() == "gpu"
    if is_language(dataset):
        return dataset.loader(cfg.context, cfg.batch_size, rank, workers, seed=cfg.seed, prefetch=prefetch)
    return ShardedLoader(dataset.train_x, dataset.train_y, cfg.batch_size, rank, workers, seed=cfg.seed,
                         augment=None if cfg.augment == "none" else cfg.augment, prefetch=prefetch)


def data_signature(cfg, dataset) -> dict:
    """What every rank must agree on about the data: its name and sizes (tokens for a text dataset)."""
    if is_language(dataset):
        return {"train.dataset": dataset.name, "train.tokens": dataset.num_train_tokens,
                "train.val_tokens": dataset.num_val_tokens, "train.context": cfg.context}
    return {"train.dataset": dataset.name, "train.samples": len(dataset.train_x),
            "train.test_samples": len(dataset.test_x)}


def setup(cfg, ckpt_meta, comm, xp, resources, model=None, dataset=None) -> Job:
    """Collective: build the run's objects (model seeded, rank 0's weights broadcast); a
    ``UserError`` on any rank is raised on every rank; the loader is closed by ``resources``.
    ``cfg``: the resolved, frozen config (``ssdmpi/run/start.py``). ``model`` (a factory or a ``Model``)
    and ``dataset`` (a ``Dataset``) come from the Python API; None: ``cfg.model`` and ``cfg.dataset``
    name them. A text dataset trains a language model on windows of ``cfg.context`` tokens
    (``ssdmpi/data/text.py``'s contract); its evaluations are on the validation windows."""
    size = comm.size
    workers = comm.agree(lambda: cfg.workers(size))   # asgd: the servers load no data
    dataset = comm.agree(lambda: load_dataset(cfg.dataset, cfg.data_path) if dataset is None else dataset)
    if cfg.augment != "none" and (is_language(dataset) or len(dataset.input_shape) != 3):
        what = "text" if is_language(dataset) else f"flat feature vectors of shape {dataset.input_shape}"
        raise UserError(f"--augment {cfg.augment} needs images; {dataset.name} has {what}: use --augment none",
                        collective=True)
    input_shape, num_classes = comm.agree(lambda: model_inputs(dataset, cfg.context))
    model = comm.agree(lambda: build_model(cfg.model if model is None else model, input_shape, num_classes, xp=xp,
                                           dtype=np.dtype(cfg.dtype), seed=cfg.seed,
                                           **model_options(cfg)))
    check_kinds(model, dataset, cfg.model)
    comm.broadcast(model.params, root=0)
    loader = comm.agree(lambda: None if comm.rank >= workers else train_loader(cfg, dataset, comm.rank, workers))
    if loader is not None:
        resources.enter_context(loader)      # closes its prefetch thread
    E = loader.steps_per_epoch if workers == size else comm.broadcast_object(
        loader and loader.steps_per_epoch, root=0)
    total_steps = cfg.total_steps(E)
    algo_cfg = comm.agree(lambda: configuration.algo_config(cfg, E, total_steps, size))
    comm.agree(lambda: check_lr_warmup(cfg, algo_cfg))
    cfg = configuration.recorded(cfg, algo_cfg)
    if ckpt_meta is not None:
        comm.agree(lambda: configuration.check_resume(ckpt_meta.get("config", {}), cfg))
    algo = comm.agree(lambda: build_algorithm(algo_cfg, model, comm))
    comm.check_agreement(dict(algo.signature(), **data_signature(cfg, dataset), **{
        "train.batch_size": cfg.batch_size, "train.seed": cfg.seed, "train.steps_per_epoch": E,
        "train.total_steps": total_steps, "train.model": cfg.model}))
    writer = resources.enter_context(CheckpointWriter(os.path.join(cfg.run_dir, "checkpoints"), cfg.keep_checkpoints))
    evaluator = Evaluator(comm, model, algo, *eval_split(dataset, cfg.context), language=is_language(dataset))
    return Job(cfg=cfg, algo_cfg=algo_cfg, dataset=dataset, model=model, loader=loader, algo=algo,
               state=TrainingState(model, algo, loader), evaluator=evaluator,
               E=E, total_steps=total_steps, workers=workers, checkpoints=writer,
               context=cfg.context if is_language(dataset) else None)


def resume(job: Job, comm, ckpt_path: str, ckpt_meta: dict) -> None:
    """Collective: every rank's state from the checkpoint rank 0 verified (on another number of
    ranks: rebuilt from the old ranks' states, ``job.resize`` says how)."""
    comm.agree(lambda: checkpoint.check_compatible(ckpt_meta, job.cfg.model, int(job.model.params.size)))
    job.resize = checkpoint.restore(comm, ckpt_path, ckpt_meta, job.state)
    job.state.check_consistent(ckpt_path)
    job.last_checkpoint = ckpt_path
