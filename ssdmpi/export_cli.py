"""``ssdmpi export RUN_OR_CHECKPOINT --out FILE.safetensors [--force] [--model M]``: the global
model ``W`` of a run's newest valid checkpoint (or of the checkpoint given) as one safetensors
file, under PyTorch ``state_dict`` names for the built-in models, with the model, its input
shape, classes and the data's normalisation in its metadata (``ssdmpi/export.py``; loading it
into PyTorch: docs/API.md). An existing ``--out`` is refused unless ``--force``. Needs the
``safetensors`` package (``pip install 'ssdmpi[export]'``). No MPI: run it as one process (under
mpiexec, ranks other than 0 do nothing).

Imported when the CLI parser is built: what ``run`` needs is imported when it runs.
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("path", metavar="RUN_OR_CHECKPOINT",
                        help="run directory (its newest checkpoint that verifies), checkpoint "
                             "(RUN/checkpoints/ckpt-<step>, best, last) or a file of one")
    parser.add_argument("--out", required=True, metavar="FILE.safetensors", help="the file to write")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument("--model", metavar="NAME|package.module:factory",
                        help="the model to load the weights into (default: the checkpoint's; give it when the "
                             "factory the run was trained with cannot be imported here)")


def run(args) -> int:
    from ssdmpi.comm.abort import launcher_rank

    if launcher_rank() != 0:   # started under mpiexec by mistake: one writer, one report
        return 0
    from ssdmpi.export import export

    done = export(args.path, args.out, force=args.force, model=args.model)
    print(f"wrote {args.out}: {done['model']} at step {done['metadata']['step']} ({done['parameters']:,} "
          f"parameters, {done['tensors']} tensors, {done['names']} names) from {done['checkpoint']}")
    return 0
