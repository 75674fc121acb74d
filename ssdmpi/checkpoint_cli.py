"""``ssdmpi ckpt``: look inside checkpoints without training.

    ssdmpi ckpt inspect PATH [--json]    what is inside: step, stage, world size, config, datasets
    ssdmpi ckpt verify PATH...           check every checksum; exit 0 if all verify, 2 otherwise
    ssdmpi ckpt list RUN_DIR             the checkpoints of a run, newest last, with their status

PATH may be a checkpoint file or a run directory (its newest valid checkpoint). Serial;
no MPI (only ``ssdmpi/checkpoint/format.py`` and ``store.py``). The file layout is documented in
``ssdmpi/checkpoint/format.py``.
"""

from __future__ import annotations

import json
import os


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="ckpt_command", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    p = sub.add_parser("inspect", help="print what a checkpoint holds")
    p.add_argument("path", help="checkpoint file or run directory")
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")
    p = sub.add_parser("verify", help="verify every dataset's checksum")
    p.add_argument("paths", nargs="+", metavar="PATH", help="checkpoint files")
    p = sub.add_parser("list", help="list a run's checkpoints and whether each verifies")
    p.add_argument("run_dir", help="run directory (or its checkpoints/ directory)")


def run(args) -> int:
    from ssdmpi import checkpoint
    from ssdmpi.errors import UserError

    if args.ckpt_command == "inspect":
        path = checkpoint.resolve_path(args.path)
        if args.json:
            meta = checkpoint.read_meta(path)
            meta.pop("manifest", None)
            print(json.dumps(dict(meta, path=path), indent=2))
        else:
            print(checkpoint.describe(path))
        return 0
    if args.ckpt_command == "verify":
        bad = 0
        for path in args.paths:
            if not os.path.isfile(path):
                raise UserError(f"{path} is not a file")
            problems = checkpoint.verify(path)
            if problems:
                bad += 1
                print(f"{path}: CORRUPT: " + "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else ""))
            else:
                print(f"{path}: ok")
        if bad:
            raise UserError(f"{bad} of {len(args.paths)} checkpoints failed verification")
        return 0
    directory = args.run_dir
    if os.path.isdir(os.path.join(directory, "checkpoints")):
        directory = os.path.join(directory, "checkpoints")
    if not os.path.isdir(directory):
        raise UserError(f"{args.run_dir} is not a directory")
    found = checkpoint.list_checkpoints(directory)
    if not found:
        print(f"no checkpoints in {directory}")
    for step, path in found:
        problems = checkpoint.verify(path)
        print(f"{step:>10}  {path}  {'ok' if not problems else 'CORRUPT: ' + problems[0]}")
    return 0
