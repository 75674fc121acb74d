"""The ``ssdmpi`` command line: one subcommand per module, loaded on demand.

Each subcommand lives in its own module, which provides ``add_arguments(parser)``
and ``run(args) -> int`` (or names a second module whose ``run`` runs it). Building
the parser imports each module's ``add_arguments``, so those modules keep their
top-level imports light (``ssdmpi --help`` starts fast and never initialises MPI);
a command's ``run`` module is imported only when it is used.

Exit codes: 0 success; 2 bad input (flags, data, checkpoints; one line, no
traceback); 3 training diverged (the last good checkpoint is kept); 85
checkpointed on SIGUSR1/SIGTERM, requeue me; 130 checkpointed after Ctrl-C;
1 anything else (the whole MPI job is aborted, naming the failing rank).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys

from ssdmpi import __version__
from ssdmpi.comm.abort import abort_job, install_abort_hook, world_rank_size
from ssdmpi.errors import BROKEN_PIPE_EXIT, USAGE_EXIT, UserError
from ssdmpi.validate import did_you_mean

# name -> (module, one-line help[, module that runs it]). The order is the order of ``--help``. A
# command whose ``run`` needs heavy imports at its top names a second module for it, loaded on use.
# A help that is a function is given the module (``bench``'s lists the module's own kinds).
COMMANDS = {
    "train": ("ssdmpi.run.command", "train a model data-parallel with SSD-SGD, SSGD, OD-SGD, local SGD or ASGD",
              "ssdmpi.run.trainer"),
    "eval": ("ssdmpi.eval_cli", "evaluate a checkpoint on a dataset's test split (a language model's validation text)"),
    "generate": ("ssdmpi.generate", "sample text from a language model run (gpt on a text dataset)"),
    "bench": ("ssdmpi.bench", lambda bench: "benchmarks: " + ", ".join(k for k in bench.KINDS if k != "report")
              + "; report renders BENCHMARKS.md"),
    "plot": ("ssdmpi.plot", "figures from run directories' metrics.jsonl"),
    "info": ("ssdmpi.info", "versions, MPI library and thread level, array backend, CUDA-awareness"),
    "ckpt": ("ssdmpi.checkpoint_cli", "inspect and verify checkpoints"),
    "data": ("ssdmpi.data.cli", "list datasets and convert them to the HDF5 layout"),
    "export": ("ssdmpi.export_cli", "write a run's global model as a .safetensors file (PyTorch names)"),
}


class Parser(argparse.ArgumentParser):
    """argparse for every ``ssdmpi`` command and subcommand.

    - bad input is one line, ``ssdmpi train: error: WHAT; see ssdmpi train --help``, exit 2
      (no usage block), from the subcommand that got it; an unknown flag close to a known one
      adds ``did you mean --epochs?``;
    - no abbreviations: ``--epoch 5`` is an unknown flag, not ``--epochs 5``;
    - a ``UserError`` raised by a type function (``--bucket-size 4X``) is reported like
      argparse's own errors (argparse itself only catches ``ArgumentTypeError``/``ValueError``);
    - in a multi-rank job only rank 0 prints (every rank exits 2).
    """

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """As argparse's, but strict: an unknown argument is an error of the (sub)command that
        got it, so the message names that command and its ``--help``."""
        try:
            namespace, extras = super().parse_known_args(args, namespace)
        except UserError as exc:
            self.error(str(exc))
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message):
        if message.startswith("unrecognized arguments: "):
            known = [o for action in self._actions for o in action.option_strings]
            message += "".join(did_you_mean(word.partition("=")[0], known)
                               for word in message.split()[2:] if word.startswith("--"))
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    def _print_message(self, message, file=None):
        if world_rank_size()[0] == 0:
            super()._print_message(message, file)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser, with every subcommand's arguments, or (``only``: a command's name) with that one's
    arguments only: a command does not pay for building the others' (``bench``'s help texts resolve
    every variant against the registry)."""
    parser = Parser(prog="ssdmpi", description="Data-parallel neural-network training with SSD-SGD over MPI.")
    parser.add_argument("--version", action="version", version=f"ssdmpi {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name, (module_name, help_text, *runner) in COMMANDS.items():
        module = importlib.import_module(module_name)
        help_text = help_text(module) if callable(help_text) else help_text
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or name == only:
            module.add_arguments(p)
        p.set_defaults(run=functools.partial(_run, runner[0]) if runner else module.run)
    return parser


def _run(module_name: str, args) -> int:
    """``run(args)`` of ``module_name``, imported now."""
    return importlib.import_module(module_name).run(args)


def report_user_error(exc: UserError) -> int:
    """Print a ``UserError`` as one line and return the exit code (aborting peers if needed).

    A collective error (every rank raised the same one) is printed by rank 0 and every
    rank exits 2. An error raised on one rank only aborts the whole job with code 2, so
    the others do not wait for it forever.
    """
    rank, size = world_rank_size()
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if size > 1 and not getattr(exc, "collective", False):
        abort_job(f"error: {message}", USAGE_EXIT)
    if rank == 0:
        print(f"ssdmpi: error: {message}", file=sys.stderr, flush=True)
    return USAGE_EXIT


def main(argv=None) -> int:
    """Entry point of the ``ssdmpi`` console script."""
    install_abort_hook()
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except UserError as exc:
        return report_user_error(exc)
    except BrokenPipeError:
        # `ssdmpi data list | head`: the reader has gone. One process ends quietly, as a shell
        # command killed by SIGPIPE would (141); one rank of many must not stop alone (the
        # others would wait for it), so there the abort hook ends the whole job.
        if world_rank_size()[1] > 1:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit's flush
        return BROKEN_PIPE_EXIT
