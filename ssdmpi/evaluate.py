"""Evaluation on a test split, sharded across ranks; and ``ssdmpi eval --checkpoint PATH``.

``evaluate(model, x, y, control, ...)`` is collective over the control communicator: each
rank evaluates its contiguous shard (``ssdmpi.data.evaluation_shard``) in inference mode
with whatever weights and buffers the model holds, and one allreduce sums the loss, the
correct count and the sample count, so every rank returns the same ``(loss, accuracy)``
over the whole split. With one rank (or ``control=None``) it is plain serial evaluation.

``ssdmpi eval --checkpoint PATH`` rebuilds the checkpoint's model from its stored config,
loads the global model ``W`` and rank 0's BatchNorm statistics (``/model`` in the file),
and evaluates it on the test split of the checkpoint's dataset (or ``--dataset``). Under
``mpiexec -n N`` the ranks share the work. ``--local`` evaluates rank 0's local model
``L`` instead (delay-stage checkpoints only).
"""

from __future__ import annotations

import json
import sys

EVAL_BATCH = 1000   # samples per forward pass in evaluation (memory, not semantics)


def evaluate(model, x, y, control=None, batch_size: int = EVAL_BATCH) -> tuple[float, float, int]:
    """``(mean loss, accuracy, samples)`` of the model on ``(x, y)``; collective over ``control``.

    ``x``: (n, ...) host float array, ``y``: (n,) int labels; every rank passes the whole
    split and evaluates only its shard. Blocking.
    """
    import numpy as np

    from ssdmpi import backend
    from ssdmpi.data import evaluation_shard

    rank, size = (control.Get_rank(), control.Get_size()) if control is not None else (0, 1)
    shard = evaluation_shard(len(x), rank, size)
    loss_sum, correct = 0.0, 0
    for start in range(shard.start, shard.stop, batch_size):
        stop = min(start + batch_size, shard.stop)
        xb = backend.to_device(np.ascontiguousarray(x[start:stop], dtype=model.dtype))
        yb = backend.to_device(np.ascontiguousarray(y[start:stop]))
        batch_loss, batch_correct = model.evaluate(xb, yb)
        loss_sum += float(batch_loss)
        correct += int(batch_correct)
    totals = np.array([loss_sum, correct, shard.stop - shard.start], dtype=np.float64)
    if control is not None and size > 1:
        from mpi4py import MPI

        control.Allreduce(MPI.IN_PLACE, totals, op=MPI.SUM)
    n = int(totals[2])
    if n == 0:
        return float("nan"), float("nan"), 0
    return float(totals[0] / n), float(totals[1] / n), n


# --- ssdmpi eval ---------------------------------------------------------------------------

def add_arguments(parser) -> None:
    parser.add_argument("--checkpoint", required=True, metavar="PATH",
                        help="checkpoint file (or a run directory: its newest valid checkpoint)")
    parser.add_argument("--dataset", help="dataset to evaluate on (default: the checkpoint's)")
    parser.add_argument("--data-path", metavar="PATH", help="where that dataset's files are")
    parser.add_argument("--local", action="store_true", help="evaluate rank 0's local model L instead of W")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto", help="array backend")
    parser.add_argument("--batch-size", type=int, default=EVAL_BATCH, help="samples per forward pass")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    import numpy as np
    from mpi4py import MPI

    from ssdmpi import backend, checkpoint
    from ssdmpi.comm.agreement import on_root
    from ssdmpi.data import load_dataset
    from ssdmpi.errors import UserError
    from ssdmpi.nn import build_model

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be a positive integer, got {args.batch_size}")

    # Rank 0 reads the file; everyone gets the same answer (or the same error).
    def read():
        path = checkpoint.resolve_path(args.checkpoint)
        meta = checkpoint.read_meta(path)
        shared = checkpoint.read_shared(path, "model")
        if args.local:
            algo = checkpoint.read_rank_state(path, 0).get("algo", {})
            if algo.get("L") is None:
                raise UserError(f"{path} was written in the {meta.get('stage')} stage: there is no local model L; "
                                "drop --local")
            shared["global_weights"] = algo["L"]
        return path, meta, shared

    path, meta, shared = on_root(world, read)
    cfg = meta.get("config", {})

    backend.select(args.device)
    dataset_name = args.dataset or cfg.get("dataset")
    data_path = args.data_path if args.dataset or args.data_path else cfg.get("data_path")
    dataset = load_dataset(dataset_name, data_path)
    options = {"widths": tuple(cfg["widths"])} if cfg.get("widths") else {}
    model = build_model(cfg["model"], dataset.input_shape, dataset.num_classes, xp=backend.get_xp(),
                        dtype=np.dtype(cfg.get("dtype", "float32")), seed=0, **options)
    weights = np.asarray(shared["global_weights"])
    if weights.shape != model.params.shape:
        raise UserError(f"{path} holds {weights.size} parameters but model {cfg['model']} on {dataset_name} has "
                        f"{model.params.size}; evaluate it on the dataset it was trained on", collective=True)
    model.params[...] = backend.to_device(weights)
    if shared.get("buffers"):
        model.load_buffers({k: backend.to_device(v) for k, v in shared["buffers"].items()})
    loss, acc, n = evaluate(model, dataset.test_x, dataset.test_y, world, args.batch_size)
    if rank == 0:
        which = "local model L of rank 0" if args.local else "global model W"
        report = {"checkpoint": path, "model": cfg["model"], "dataset": dataset.name, "which": which,
                  "step": meta.get("step"), "epoch": meta.get("epoch"), "stage": meta.get("stage"),
                  "test_acc": acc, "test_loss": loss, "samples": n}
        if args.json:
            print(json.dumps(report))
        else:
            print(f"{path}: {which} at step {meta.get('step')} (epoch {meta.get('epoch'):.2f}): "
                  f"test accuracy {acc:.2%}, loss {loss:.4f} on {n} samples of {dataset.name}")
        sys.stdout.flush()
    return 0
