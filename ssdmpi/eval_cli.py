"""``ssdmpi eval --checkpoint PATH``: rebuilds the checkpoint's model from its stored config,
loads the global model ``W`` with the BatchNorm statistics of every rank that trained,
averaged (``checkpoint.read_model``), and evaluates it on the test split of the checkpoint's
dataset (or ``--dataset``) with ``ssdmpi.run.evaluation.evaluate``: a classifier's test accuracy
and loss, a language model's (a text dataset's) validation loss in nats per token, its
perplexity and next-token accuracy on the validation windows. Under ``mpiexec -n N`` the
ranks share the work. ``--local`` evaluates rank 0's local model ``L`` with rank 0's own
statistics instead (delay-stage checkpoints only). Each rank's threads and GPU are chosen as
for ``ssdmpi train`` (``ssdmpi/comm/node.py``; ``--threads``, ``--gpu-id``).

Imported when the CLI parser is built: what ``run`` needs is imported when it runs.
"""

from __future__ import annotations

import json
import sys

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
    parser.add_argument("--batch-size", type=int, metavar="N",
                        help="samples (a language model's windows) per forward pass (memory only: the results do not "
                             "depend on it; default: as ssdmpi train evaluates)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    """``ssdmpi eval``: rank 0 reads the checkpoint, every rank evaluates its shard."""
    from ssdmpi.comm import node, world
    from ssdmpi.comm.communicator import Communicator
    from ssdmpi.run.evaluation import evaluate
    from ssdmpi.validate import nonnegative_int, positive_int

    if args.batch_size is not None:
        positive_int("batch-size", args.batch_size)
    if args.threads is not None:
        positive_int("threads", args.threads)
    if args.gpu_id is not None:
        nonnegative_int("gpu-id", args.gpu_id)
    path, meta, shared = world.on_root(lambda: _read_checkpoint(args))   # everyone: the same answer or error
    placement = world.agree(lambda: node.place(node.discover(), args.device, args.threads, args.gpu_id))
    model, dataset, split = world.agree(lambda: _restore_model(args, path, meta, shared))
    with Communicator(progress="blocking", stall_timeout=None) as comm:
        loss, acc, n = evaluate(model, *split, comm, args.batch_size)
        if comm.rank == 0:
            _report(args, path, meta, dataset, (loss, acc, n, len(split[0])), placement.describe())
    return 0


def _read_checkpoint(args):
    """Rank 0: ``(path, meta, shared)`` with ``shared["global_weights"]`` the model to evaluate and
    ``shared["buffers"]`` its statistics (``checkpoint.read_model``: for ``W`` the training
    ranks' averaged, for ``L`` rank 0's own)."""
    from ssdmpi import checkpoint

    path = checkpoint.resolve_path(args.checkpoint, deep=False)
    meta, weights, buffers = checkpoint.read_model(path, local=args.local)
    return path, meta, {"global_weights": weights, "buffers": buffers}


def _restore_model(args, path: str, meta: dict, shared: dict):
    """The checkpoint's model (or ``--model``) with the weights and buffers to evaluate, the dataset and
    the split ``(x, y)`` to evaluate on (a text dataset's validation windows of the model's context)."""
    from ssdmpi import backend, restore
    from ssdmpi.run.setup import check_kinds, eval_split, model_inputs

    cfg = meta.get("config", {})
    dataset = restore.eval_dataset(path, cfg, args.dataset, args.data_path)
    context = restore.context_of(meta)
    shape, classes = model_inputs(dataset, context)
    model = restore.build(path, cfg, shape, classes, args.model, xp=backend.get_xp(),
                          instead="pass an importable --model package.module:factory (docs/API.md)")
    check_kinds(model, dataset, args.model or cfg.get("model"))
    model = restore.load_weights(model, shared, path, instead="evaluate it on the dataset it was trained on "
                                                              "(--dataset), with its model (--model)")
    return model, dataset, eval_split(dataset, context)


def _report(args, path: str, meta: dict, dataset, result, placement: str) -> None:
    from ssdmpi.run.evaluation import perplexity

    loss, acc, n, samples = result
    which = "local model L of rank 0" if args.local else "global model W"
    language = dataset.kind == "text"
    report = {"checkpoint": path, "model": meta.get("config", {})["model"], "dataset": dataset.name, "which": which,
              "step": meta.get("step"), "epoch": meta.get("epoch"), "stage": meta.get("stage"),
              **({"val_loss": loss, "val_ppl": perplexity(loss), "val_acc": acc, "tokens": n, "windows": samples}
                 if language else {"test_acc": acc, "test_loss": loss, "samples": n}),
              "placement": f"rank 0: {placement}"}
    at = f"{path}: {which} at step {meta.get('step')} (epoch {meta.get('epoch'):.2f}): "
    if args.json:
        print(json.dumps(report))
    elif language:
        print(at + f"validation loss {loss:.4f} nats/token, perplexity {perplexity(loss):.2f}, next-token accuracy "
              f"{acc:.2%} on {n:,} tokens ({samples} windows) of {dataset.name}")
    else:
        print(at + f"test accuracy {acc:.2%}, loss {loss:.4f} on {n} samples of {dataset.name}")
    sys.stdout.flush()
