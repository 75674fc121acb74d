"""Evaluation on a test split (a language model's: the validation windows), sharded across ranks.

``evaluate(model, x, y, comm, ...)`` is collective over the Communicator ``comm``: each
rank evaluates its contiguous shard (``ssdmpi.data.evaluation_shard``) of the samples (a
language model's: of the windows) in inference mode with whatever weights and buffers the
model holds, and one scalar allreduce sums the loss, the correct count and the target count
(one per sample; one per token of a window), so every rank returns the same ``(loss per target,
accuracy, targets)`` over the whole split. With one rank (or ``comm=None``) it is plain serial
evaluation. ``scores`` names the results: ``test_acc``, ``test_loss`` for a classifier;
``val_loss`` (nats per token), ``val_ppl`` (its perplexity, exp of the loss) and ``val_acc``
(next-token accuracy) for a language model.

``Evaluator`` is the trainer's: it evaluates the global model ``W`` with the BatchNorm
running statistics averaged over the ranks that train (``mean_buffers``: every rank's
statistics come from its own batches, and ``W`` is the average of all ranks' training),
and rank 0's local model ``L`` with rank 0's own statistics; then it puts the training
state back (the averaged statistics exist only for the evaluation). ``ssdmpi eval`` is
``ssdmpi/eval_cli.py``.
"""

from __future__ import annotations

import math

import numpy as np

from ssdmpi import backend
from ssdmpi.data import evaluation_shard
from ssdmpi.nn.buffers import packed, unpacked

EVAL_BATCH = 1000     # samples per forward pass in evaluation (memory, not semantics)
EVAL_TOKENS = 8192    # a language model's: tokens per forward pass (64 windows of 128)


def eval_batch(model) -> int:
    """Samples (windows) per forward pass when none is asked for: ``EVAL_BATCH``, or ``EVAL_TOKENS``
    worth of windows for a language model."""
    return max(1, EVAL_TOKENS // model.targets_per_sample) if model.input_kind == "tokens" else EVAL_BATCH


def evaluate(model, x, y, comm=None, batch_size: int | None = None) -> tuple[float, float, int]:
    """``(mean loss per target, accuracy, targets)`` of the model on ``(x, y)``; collective over ``comm``.

    ``x``: (n, ...) host float array and ``y``: (n,) int labels, or a language model's windows:
    ``x``, ``y`` (n, T) int token ids (``TextDataset.val_windows``), ``n * T`` targets; every rank
    passes the whole split and evaluates only its shard. ``batch_size``: samples per forward pass
    (None: ``eval_batch``). Blocking.
    """
    rank, size = (comm.rank, comm.size) if comm is not None else (0, 1)
    shard = evaluation_shard(len(x), rank, size)
    batch_size = batch_size or eval_batch(model)
    dtype = model.dtype if model.input_kind != "tokens" else None   # token ids stay integers
    loss_sum, correct, targets = 0.0, 0, 0
    for start in range(shard.start, shard.stop, batch_size):
        stop = min(start + batch_size, shard.stop)
        xb = backend.to_device(np.ascontiguousarray(x[start:stop], dtype=dtype))
        yb = backend.to_device(np.ascontiguousarray(y[start:stop]))
        batch_loss, batch_correct = model.evaluate(xb, yb)
        loss_sum += float(batch_loss)
        correct += int(batch_correct)
        targets += int(yb.size)
    totals = {"loss": loss_sum, "correct": float(correct), "n": float(targets)}
    if comm is not None and size > 1:
        totals = comm.allreduce_scalars(totals, op="sum")
    n = int(totals["n"])
    if n == 0:
        return float("nan"), float("nan"), 0
    return float(np.float64(totals["loss"]) / n), float(np.float64(totals["correct"]) / n), n


def perplexity(loss: float) -> float:
    """``exp(loss)``, the perplexity of a loss in nats per token (inf past the largest float)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def scores(loss: float, acc: float, language: bool, suffix: str = "") -> dict:
    """An evaluation's results by name (the module docstring), each with ``suffix`` (``"_local"``: of ``L``)."""
    if language:
        return {f"val_loss{suffix}": loss, f"val_ppl{suffix}": perplexity(loss), f"val_acc{suffix}": acc}
    return {f"test_acc{suffix}": acc, f"test_loss{suffix}": loss}


def mean_buffers(comm, model, trains: bool = True) -> dict:
    """Collective: the mean over the ranks that train of this model's float buffers (the
    BatchNorm running statistics), as host arrays of the buffers' own dtypes and shapes (the
    bits of ``ssdmpi/nn/buffers.py``'s ``average`` of every training rank's buffers); ``{}``
    for a model without them. ``trains``: False on a rank whose statistics never saw a batch
    (an asgd server): it adds nothing. One blocking allreduce of a float64 vector (the
    statistics and the count of ranks that train). Changes nothing."""
    own = {k: backend.to_host(v) for k, v in model.buffers().items()}
    flat, names = packed(own)
    if not names:
        return {}
    if not trains:
        flat[...] = 0.0
    if comm is not None and comm.size > 1:
        comm.allreduce(flat, average=False)
    return unpacked(flat, names, own)


def trains_on_data(algo) -> bool:
    """False on a rank that runs no forward pass in training (an asgd server), True elsewhere."""
    return not algo.is_server


class Evaluator:
    """Test-split evaluation of ``W`` (averaged BatchNorm statistics) and rank 0's ``L`` (rank 0's
    own statistics) without disturbing the training state (see the module docstring). ``x``, ``y``:
    the split (a language model's validation windows: ``language``)."""

    def __init__(self, comm, model, algo, x, y, language: bool = False):
        self.comm, self.model, self.algo, self.data, self.language = comm, model, algo, (x, y), language

    def __call__(self) -> dict:
        """Collective. ``scores`` of ``W``, then of ``L`` (``_local``) in the delay stage:
        ``{"test_acc", "test_loss"[, "test_acc_local", "test_loss_local"]}``, a language model's
        ``{"val_loss", "val_ppl", "val_acc"[, ..._local]}``."""
        model, algo, comm, data = self.model, self.algo, self.comm, self.data
        own_params = model.params.copy()
        own_buffers = {k: v.copy() for k, v in model.buffers().items()}
        L = algo.local_weights()
        L = None if L is None else (L.copy() if L is not model.params else own_params)   # before params change
        try:
            if own_buffers and comm.size > 1:   # W: the statistics of every rank that trains, averaged
                mean = mean_buffers(comm, model, trains_on_data(algo))
                model.load_buffers({**own_buffers, **{k: backend.to_device(v) for k, v in mean.items()}})
            W = algo.global_weights()
            if W is not model.params:
                model.params[...] = W
            loss, acc, _ = evaluate(model, *data, comm)
            out = scores(loss, acc, self.language)
            if L is not None:
                if own_buffers and comm.size > 1:   # rank 0's L with rank 0's own statistics
                    host = comm.broadcast_object({k: backend.to_host(v) for k, v in own_buffers.items()}, root=0)
                    model.load_buffers({k: backend.to_device(v) for k, v in host.items()})
                host = backend.to_host(L).copy() if comm.rank == 0 else np.empty(L.shape, dtype=L.dtype)
                comm.broadcast(host, root=0)
                model.params[...] = backend.to_device(host)
                loss, acc, _ = evaluate(model, *data, comm)
                out.update(scores(loss, acc, self.language, "_local"))
        finally:
            model.params[...] = own_params
            if own_buffers:
                model.load_buffers(own_buffers)
        return out
