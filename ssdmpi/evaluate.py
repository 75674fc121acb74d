"""Evaluation on a test split, sharded across ranks; and ``ssdmpi eval --checkpoint PATH``.

``evaluate(model, x, y, comm, ...)`` is collective over the Communicator ``comm``: each
rank evaluates its contiguous shard (``ssdmpi.data.evaluation_shard``) in inference mode
with whatever weights and buffers the model holds, and one scalar allreduce sums the loss,
the correct count and the sample count, so every rank returns the same ``(loss, accuracy)``
over the whole split. With one rank (or ``comm=None``) it is plain serial evaluation.

``Evaluator`` is the trainer's: it evaluates the global model ``W`` with the BatchNorm
running statistics averaged over the ranks that train (``mean_buffers``: every rank's
statistics come from its own batches, and ``W`` is the average of all ranks' training),
and rank 0's local model ``L`` with rank 0's own statistics; then it puts the training
state back (the averaged statistics exist only for the evaluation).

``ssdmpi eval --checkpoint PATH`` rebuilds the checkpoint's model from its stored config,
loads the global model ``W`` with the BatchNorm statistics of every rank that trained,
averaged as above (``checkpoint.read_model``), and evaluates it on the test
split of the checkpoint's dataset (or ``--dataset``). Under ``mpiexec -n N`` the ranks share
the work. ``--local`` evaluates rank 0's local model ``L`` with rank 0's own statistics
instead (delay-stage checkpoints only). Each rank's threads and GPU are chosen as for
``ssdmpi train`` (``ssdmpi/comm/node.py``; ``--threads``, ``--gpu-id``).
"""

from __future__ import annotations

import json
import sys

EVAL_BATCH = 1000   # samples per forward pass in evaluation (memory, not semantics)


def evaluate(model, x, y, comm=None, batch_size: int = EVAL_BATCH) -> tuple[float, float, int]:
    """``(mean loss, accuracy, samples)`` of the model on ``(x, y)``; collective over ``comm``.

    ``x``: (n, ...) host float array, ``y``: (n,) int labels; every rank passes the whole
    split and evaluates only its shard. Blocking.
    """
    import numpy as np

    from ssdmpi import backend
    from ssdmpi.data import evaluation_shard

    rank, size = (comm.rank, comm.size) if comm is not None else (0, 1)
    shard = evaluation_shard(len(x), rank, size)
    loss_sum, correct = 0.0, 0
    for start in range(shard.start, shard.stop, batch_size):
        stop = min(start + batch_size, shard.stop)
        xb = backend.to_device(np.ascontiguousarray(x[start:stop], dtype=model.dtype))
        yb = backend.to_device(np.ascontiguousarray(y[start:stop]))
        batch_loss, batch_correct = model.evaluate(xb, yb)
        loss_sum += float(batch_loss)
        correct += int(batch_correct)
    totals = {"loss": loss_sum, "correct": float(correct), "n": float(shard.stop - shard.start)}
    if comm is not None and size > 1:
        totals = comm.allreduce_scalars(totals, op="sum")
    n = int(totals["n"])
    if n == 0:
        return float("nan"), float("nan"), 0
    return float(np.float64(totals["loss"]) / n), float(np.float64(totals["correct"]) / n), n


def mean_buffers(comm, model, trains: bool = True) -> dict:
    """Collective: the mean over the ranks that train of this model's float buffers (the
    BatchNorm running statistics), as host arrays of the buffers' own dtypes and shapes (the
    bits of ``ssdmpi/nn/buffers.py``'s ``average`` of every training rank's buffers); ``{}``
    for a model without them. ``trains``: False on a rank whose statistics never saw a batch
    (an asgd server): it adds nothing. One blocking allreduce of a float64 vector (the
    statistics and the count of ranks that train). Changes nothing."""
    from ssdmpi import backend
    from ssdmpi.nn.buffers import packed, unpacked

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
    return not getattr(algo, "is_server", False)


class Evaluator:
    """Test-split evaluation of ``W`` (averaged BatchNorm statistics) and rank 0's ``L`` (rank 0's
    own statistics) without disturbing the training state (see the module docstring)."""

    def __init__(self, comm, model, algo, dataset):
        self.comm, self.model, self.algo, self.dataset = comm, model, algo, dataset

    def __call__(self) -> dict:
        """Collective. ``{"test_acc", "test_loss"[, "test_acc_local", "test_loss_local"]}``."""
        import numpy as np

        from ssdmpi import backend

        model, algo, comm = self.model, self.algo, self.comm
        data = (self.dataset.test_x, self.dataset.test_y)
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
            out = {"test_acc": acc, "test_loss": loss}
            if L is not None:
                if own_buffers and comm.size > 1:   # rank 0's L with rank 0's own statistics
                    host = comm.broadcast_object({k: backend.to_host(v) for k, v in own_buffers.items()}, root=0)
                    model.load_buffers({k: backend.to_device(v) for k, v in host.items()})
                host = backend.to_host(L).copy() if comm.rank == 0 else np.empty(L.shape, dtype=L.dtype)
                comm.broadcast(host, root=0)
                model.params[...] = backend.to_device(host)
                loss, acc, _ = evaluate(model, *data, comm)
                out.update(test_acc_local=acc, test_loss_local=loss)
        finally:
            model.params[...] = own_params
            if own_buffers:
                model.load_buffers(own_buffers)
        return out


# --- ssdmpi eval ---------------------------------------------------------------------------

def add_arguments(parser) -> None:
    parser.add_argument("--checkpoint", required=True, metavar="PATH",
                        help="checkpoint (RUN/checkpoints/ckpt-<step>, or its best or last link) or a run "
                             "directory (its newest checkpoint)")
    parser.add_argument("--dataset", help="dataset to evaluate on (default: the checkpoint's)")
    parser.add_argument("--data-path", metavar="PATH", help="where that dataset's files are")
    parser.add_argument("--model", metavar="NAME|package.module:factory",
                        help="the model to load the weights into (default: the checkpoint's; give it when the "
                             "factory the run was trained with cannot be imported, e.g. it lived in its script)")
    parser.add_argument("--local", action="store_true", help="evaluate rank 0's local model L instead of W")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto", help="array backend")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="BLAS/OpenMP threads per rank (default: as ssdmpi train chooses, see its --help)")
    parser.add_argument("--gpu-id", type=int, metavar="ID",
                        help="CUDA device of this rank (default: as ssdmpi train chooses)")
    parser.add_argument("--batch-size", type=int, default=EVAL_BATCH, help="samples per forward pass")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    """``ssdmpi eval``: rank 0 reads the checkpoint, every rank evaluates its shard."""
    from ssdmpi.comm import node, world
    from ssdmpi.comm.communicator import Communicator
    from ssdmpi.validate import nonnegative_int, positive_int

    positive_int("batch-size", args.batch_size)
    if args.threads is not None:
        positive_int("threads", args.threads)
    if args.gpu_id is not None:
        nonnegative_int("gpu-id", args.gpu_id)
    path, meta, shared = world.on_root(lambda: _read_checkpoint(args))   # everyone: the same answer or error
    placement = world.agree(lambda: node.place(node.discover(), args.device, args.threads, args.gpu_id))
    model, dataset = world.agree(lambda: _restore_model(args, path, meta.get("config", {}), shared))
    with Communicator(progress="blocking", stall_timeout=None) as comm:
        loss, acc, n = evaluate(model, dataset.test_x, dataset.test_y, comm, args.batch_size)
        if comm.rank == 0:
            _report(args, path, meta, dataset, (loss, acc, n), placement.describe())
    return 0


def _read_checkpoint(args):
    """Rank 0: ``(path, meta, shared)`` with ``shared["global_weights"]`` the model to evaluate and
    ``shared["buffers"]`` its statistics (``checkpoint.read_model``: for ``W`` the training
    ranks' averaged, for ``L`` rank 0's own)."""
    from ssdmpi import checkpoint

    path = checkpoint.resolve_path(args.checkpoint, deep=False)
    meta, weights, buffers = checkpoint.read_model(path, local=args.local)
    return path, meta, {"global_weights": weights, "buffers": buffers}


def _restore_model(args, path: str, cfg: dict, shared: dict):
    """The checkpoint's model (or ``--model``) with the weights and buffers to evaluate, and the dataset."""
    from ssdmpi import backend, restore

    dataset = restore.eval_dataset(path, cfg, args.dataset, args.data_path)
    model = restore.build(path, cfg, dataset.input_shape, dataset.num_classes, args.model, xp=backend.get_xp(),
                          instead="pass an importable --model package.module:factory (docs/API.md)")
    model = restore.load_weights(model, shared, path, instead="evaluate it on the dataset it was trained on "
                                                              "(--dataset), with its model (--model)")
    return model, dataset


def _report(args, path: str, meta: dict, dataset, result, placement: str) -> None:
    loss, acc, n = result
    which = "local model L of rank 0" if args.local else "global model W"
    report = {"checkpoint": path, "model": meta.get("config", {})["model"], "dataset": dataset.name, "which": which,
              "step": meta.get("step"), "epoch": meta.get("epoch"), "stage": meta.get("stage"),
              "test_acc": acc, "test_loss": loss, "samples": n, "placement": f"rank 0: {placement}"}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{path}: {which} at step {meta.get('step')} (epoch {meta.get('epoch'):.2f}): "
              f"test accuracy {acc:.2%}, loss {loss:.4f} on {n} samples of {dataset.name}")
    sys.stdout.flush()
