"""``ssdmpi ckpt``: look inside checkpoints without training.

    ssdmpi ckpt inspect PATH [--arrays] [--json]   a summary: step, epoch, stage, algorithm, ranks,
                                                   sizes, whether every checksum verifies;
                                                   --arrays: every array of every rank too
    ssdmpi ckpt verify PATH...                     check every checksum; exit 0 if all verify, 2 otherwise
    ssdmpi ckpt list RUN_DIR                       the checkpoints of a run, newest last, with their status
    ssdmpi ckpt convert FILE...                    format-1 files (ckpt-<step>.h5) rewritten as format 2
                                                   (ckpt-<step>/ beside them), which also resumes on
                                                   another number of ranks

PATH is a checkpoint (``RUN/checkpoints/ckpt-<step>``, its ``best`` or ``last`` link, one of its
files, which stands for the whole checkpoint, a format-1 ``.h5`` file) or a run directory (its
newest valid checkpoint; ``verify``: all of them). A file that is no checkpoint at all (not HDF5,
or HDF5 of something else) is reported as that, not as a corrupt checkpoint. Serial; no MPI:
under mpiexec, ranks other than 0 do nothing. The layout is documented in
``ssdmpi/checkpoint/sharded.py``.
"""

from __future__ import annotations

import json
import os


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="ckpt_command", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    p = sub.add_parser("inspect", help="print a summary of what a checkpoint holds")
    p.add_argument("path", help="checkpoint (or a file of one), or a run directory (its newest checkpoint)")
    p.add_argument("--arrays", action="store_true", help="also list every array of every rank")
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")
    p = sub.add_parser("verify", help="verify every dataset's checksum")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="checkpoints (or files of them), or run directories (all their checkpoints)")
    p = sub.add_parser("list", help="list a run's checkpoints and whether each verifies")
    p.add_argument("run_dir", help="run directory (or its checkpoints/ directory)")
    p = sub.add_parser("convert", help="rewrite format-1 checkpoint files (ckpt-<step>.h5) as format 2")
    p.add_argument("paths", nargs="+", metavar="FILE", help="format-1 checkpoint files")


def run(args) -> int:
    from ssdmpi import checkpoint
    from ssdmpi.comm.abort import launcher_rank
    from ssdmpi.errors import UserError

    if launcher_rank() != 0:   # started under mpiexec: one process reads and reports
        return 0
    if args.ckpt_command == "inspect":
        path = checkpoint.resolve_path(args.path, deep=False)
        meta = checkpoint.read_meta(path)
        if args.json:
            meta = {k: v for k, v in meta.items() if k not in ("manifest", "files")}
            print(json.dumps(dict(meta, path=path, problems=checkpoint.verify(path)), indent=2))
        else:
            print(summary(path, meta, checkpoint.verify(path), arrays=args.arrays))
        return 0
    if args.ckpt_command == "verify":
        paths = [p for arg in args.paths for p in _checkpoints_of(arg)]
        bad = 0
        for path in paths:
            status = _status(path, every=True)
            bad += status != "ok"
            print(f"{path}: {status}")
        if bad:
            raise UserError(f"{bad} of {len(paths)} checkpoints failed verification")
        return 0
    if args.ckpt_command == "convert":
        from ssdmpi.checkpoint.convert import convert

        for path in args.paths:
            if not os.path.isfile(path):
                raise UserError(f"{path} is not a format-1 checkpoint file (ckpt-<step>.h5)")
            print(f"{path} -> {convert(path)}")
        return 0
    directory = _checkpoints_dir(args.run_dir)
    found = checkpoint.list_checkpoints(directory)
    if not found:
        print(f"no checkpoints in {directory}")
    else:
        print(f"{'step':>10}  {'checkpoint':<18} {'size':>10}  status")
    for step, path in found:
        status = _status(path)
        marks = _links_to(path)
        print(f"{step:>10}  {os.path.basename(path):<18} {_mb(checkpoint.size_of(path)):>10}  {status}"
              + (f"  ({', '.join(marks)})" if marks else ""))
    return 0


def _status(path: str, every: bool = False) -> str:
    """``ok``, ``not an ssdmpi checkpoint (why)`` for a file that is none, or ``CORRUPT: problem``
    (``every``: up to three problems)."""
    from ssdmpi import checkpoint
    from ssdmpi.checkpoint.format import not_a_checkpoint

    if os.path.isfile(path) and (why := not_a_checkpoint(path)):
        return f"not an ssdmpi checkpoint ({why})"
    problems = checkpoint.verify(path)
    if not problems:
        return "ok"
    shown = problems[:3] if every else problems[:1]
    return "CORRUPT: " + "; ".join(shown) + (" ..." if every and len(problems) > 3 else "")


def _links_to(path: str) -> list:
    """Which of ``best`` and ``last`` point to the checkpoint ``path``."""
    from ssdmpi import checkpoint

    directory = os.path.dirname(os.path.abspath(path))
    return [name for name in (checkpoint.BEST, checkpoint.LAST)
            if (t := checkpoint.link_target(directory, name)) and os.path.realpath(t) == os.path.realpath(path)]


def _checkpoints_dir(path: str) -> str:
    from ssdmpi.errors import UserError

    if os.path.isdir(os.path.join(path, "checkpoints")):
        path = os.path.join(path, "checkpoints")
    if not os.path.isdir(path):
        raise UserError(f"{path} is not a directory")
    return path


def _checkpoints_of(path: str) -> list:
    """``[path]`` for a checkpoint; every checkpoint of a run or checkpoints directory."""
    from ssdmpi import checkpoint
    from ssdmpi.errors import UserError

    if not os.path.exists(path):
        raise UserError(f"{path} does not exist")
    path = checkpoint.store.containing_checkpoint(path)
    if os.path.isfile(path) or os.path.exists(os.path.join(path, "manifest.json")) \
            or checkpoint.store.NAME_RE.match(os.path.basename(os.path.normpath(path))):
        return [path]
    found = checkpoint.list_checkpoints(_checkpoints_dir(path))
    if not found:
        raise UserError(f"no checkpoints in {path}")
    return [p for _, p in found]


def _mb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _pct(x) -> str:
    return "-" if x is None else f"{float(x):.2%}"


def summary(path: str, meta: dict, problems: list, arrays: bool = False) -> str:
    """The human summary of one checkpoint (``ssdmpi ckpt inspect``)."""
    from ssdmpi import checkpoint
    from ssdmpi.algos import registry

    cfg = meta.get("config", {})
    marks = _links_to(path)
    n = int(meta.get("world_size", 0))
    algo = meta.get("algo") or cfg.get("algo")
    spec = registry.find(algo)
    details = spec.inspect(cfg) if spec is not None else ""
    epoch = meta.get("epoch")
    lines = [f"checkpoint {path}" + (f"  ({', '.join(marks)})" if marks else ""),
             f"  written {meta.get('created', '?')} ({meta.get('reason', '?')}), format {meta.get('format_version')}, "
             f"ssdmpi {meta.get('ssdmpi_version', '?')}",
             f"  step {meta.get('step')}, epoch {epoch:.2f}, stage {meta.get('stage')}" if epoch is not None
             else f"  step {meta.get('step')}, stage {meta.get('stage')}",
             f"  algorithm {algo}" + (f" ({details})" if details else "") + f", {n} rank{'s' * (n != 1)}, batch "
             f"{cfg.get('batch_size')} per rank" + (f" (global {meta['global_batch']})" if meta.get("global_batch")
                                                   else ""),
             f"  model {meta.get('model')} ({int(meta.get('num_params') or 0):,} parameters, {cfg.get('dtype', '?')}), "
             f"dataset {meta.get('dataset')}"]
    evaluated = meta.get("eval") or {}
    if evaluated:
        text = f"  test accuracy of its global model W: {_pct(evaluated.get('test_acc'))}"
        if evaluated.get("test_loss") is not None:
            text += f" (loss {float(evaluated['test_loss']):.4f})"
        if evaluated.get("test_acc_local") is not None:
            text += f"; rank 0's local model L: {_pct(evaluated['test_acc_local'])}"
        lines.append(text)
    elif meta.get("test_acc") is not None:
        lines.append(f"  last test accuracy before it: {_pct(meta['test_acc'])}")
    write = meta.get("write") or {}
    per_rank = write.get("bytes_per_rank") or []
    size = checkpoint.size_of(path)
    text = f"  size {_mb(size)}"
    if per_rank:
        low, high = _mb(min(per_rank)), _mb(max(per_rank))
        text += f", per rank {low}" + (f" to {high}" if high != low else "")
    if write:
        text += (f"; written in {float(write['write_s']):.3f} s ({'background' if write.get('background') else 'sync'}"
                 f"), training stalled {float(write['stall_s']):.3f} s")
    lines.append(text)
    for resize in _resizes(path):
        lines.append(f"  resumed at step {resize['step']} on another number of ranks ({resize['from_ranks']} -> "
                     f"{resize['to_ranks']}): {resize['merged']}")
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    lines.append("  checksums: ok" if not problems else f"  checksums: CORRUPT: {problems[0]}{more}")
    if arrays:
        lines += _arrays(path, meta)
    return "\n".join(lines)


def _resizes(path: str) -> list:
    """The run's resumes on another number of ranks (rank 0's trainer state), format 2 only."""
    from ssdmpi.checkpoint import sharded

    if not os.path.isdir(path):
        return []
    try:
        return sharded.read_value(path, 0, "trainer/resizes") or []
    except (KeyError, OSError):
        return []


def _arrays(path: str, meta: dict) -> list:
    """``--arrays``: every array (shared ones once, then each rank's), name, dtype and shape."""
    import h5py

    lines = []
    if os.path.isdir(path):
        from ssdmpi.checkpoint import sharded

        lines.append("  shared arrays (split across ranks):")
        for name, info in sorted(meta.get("shared", {}).items()):
            lines.append(f"    {name}  {info['dtype']} ({info['size']},)")
        for alias, target in sorted(meta.get("aliases", {}).items()):
            lines.append(f"    {alias}  = {target}")
        for rank in range(int(meta["world_size"])):
            lines.append(f"  rank {rank} ({sharded.rank_file(rank)}):")
            with h5py.File(os.path.join(path, sharded.rank_file(rank)), "r") as f:
                lines += _datasets(f["state"]) or ["    (no arrays of its own)"]
    else:
        with h5py.File(path, "r") as f:
            lines += _datasets(f)
    return lines


def _datasets(group) -> list:
    import h5py

    out = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and not name.endswith("_values") and name != "meta":
            out.append(f"    {name}  {obj.dtype} {tuple(obj.shape)}")
    group.visititems(visit)
    return out
