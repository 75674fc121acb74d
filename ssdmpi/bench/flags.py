"""Flag conventions shared by the ``ssdmpi bench`` subcommands, and their deprecated old spellings.

One spelling per concept, ``ssdmpi train``'s where it has the concept:

==================== ===========================================================
``--batch-size N``   the per-rank batch
``--delay K``        one delay / period k; ``--delays K1,K2`` a list of them
``--repeats R``      repetitions of a measurement (a second kind: ``--allreduce-repeats``)
``--json FILE``      also write the result as JSON to FILE; ``--json -`` prints the
                     JSON on stdout instead of the text report
lists                comma-separated (``--sizes 1K,4M``), read with ``ssdmpi.parsing.parse_list``
==================== ===========================================================

Old spellings (``--batch``, ``--k``, ``--reps``, ``--plan-k``, a bare ``--json``,
space-separated lists) still parse for one release: they are hidden from ``--help`` and
print one ``ssdmpi: note: ...`` line on stderr (rank 0 only, once per command even when
the command relaunches itself under MPI).
"""

from __future__ import annotations

import argparse
import os
import sys

from ssdmpi.errors import UserError

REMOVAL = "it will be removed in the next release"
_NOTED_ENV = "SSDMPI_DEPRECATION_NOTED"   # notes already printed, inherited by relaunched ranks


def note_deprecated(old: str, new: str) -> None:
    """One line on stderr: ``old`` is deprecated, use ``new`` (rank 0; each ``old`` once per process tree)."""
    from ssdmpi.comm.abort import world_rank_size

    noted = [n for n in os.environ.get(_NOTED_ENV, "").split("\x1f") if n]
    if old in noted:
        return
    os.environ[_NOTED_ENV] = "\x1f".join(noted + [old])
    if world_rank_size()[0] == 0:
        print(f"ssdmpi: note: {old} is deprecated, {REMOVAL}; use {new}", file=sys.stderr, flush=True)


class DeprecatedAlias(argparse.Action):
    """A hidden old spelling of ``target`` (another action): notes the deprecation, then acts as ``target``."""

    def __init__(self, option_strings, dest, target=None, **_ignored):
        super().__init__(option_strings, dest, nargs=target.nargs, const=target.const, type=target.type,
                         choices=target.choices, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        self.target = target

    def __call__(self, parser, namespace, values, option_string=None):
        note_deprecated(option_string, self.target.option_strings[0])
        self.target(parser, namespace, values, self.target.option_strings[0])


def deprecated_alias(parser, old: str, target: argparse.Action) -> None:
    """Accept ``old`` as a hidden, deprecated spelling of the flag ``target`` (what ``add_argument`` returned)."""
    parser.add_argument(old, dest=target.dest, action=DeprecatedAlias, target=target)


class CommaList(argparse.Action):
    """A comma-separated list, stored as given (a string; parse it with ``parse_list`` or ``parse_choices``).

    Space-separated values (``--sizes 1K 4K``, the old form) are joined with commas and noted
    as deprecated.
    """

    def __init__(self, option_strings, dest, **kwargs):
        kwargs["nargs"] = "+"
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if len(values) > 1:
            note_deprecated(f"{option_string} with space-separated values",
                            f"commas: {option_string} {','.join(values)}")
        setattr(namespace, self.dest, ",".join(values))


class JsonFile(argparse.Action):
    """``--json FILE`` (``-``: stdout). With ``legacy_switch``, a bare ``--json`` (the old switch) means ``-``."""

    def __init__(self, option_strings, dest, legacy_switch=False, **kwargs):
        kwargs.update(nargs="?" if legacy_switch else None, metavar="FILE")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            note_deprecated(f"{option_string} without FILE", f"{option_string} - (stdout) or {option_string} FILE")
            values = "-"
        setattr(namespace, self.dest, values)


def add_json(parser, what: str, legacy_switch: bool = False) -> None:
    """The ``--json FILE`` flag; ``what`` names the result (``legacy_switch``: a bare ``--json`` still parses)."""
    parser.add_argument("--json", action=JsonFile, legacy_switch=legacy_switch, default=None,
                        help=f"also write {what} as JSON to FILE; '-' prints the JSON on stdout instead of the text")


def emit_json(dest: str, text: str) -> None:
    """Print ``text`` (``dest`` ``-``) or write it to ``dest`` atomically (a temporary file, then a rename)."""
    if dest == "-":
        print(text, flush=True)
        return
    tmp = f"{dest}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, dest)
    except OSError as exc:
        raise UserError(f"--json {dest}: cannot write it ({exc.strerror or exc})") from None


def parse_choices(text: str, flag: str, choices) -> list:
    """Comma-separated names from ``choices`` -> list in the given order; a one-line ``UserError`` otherwise."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    bad = [n for n in names if n not in choices]
    if not names or bad or len(set(names)) != len(names):
        raise UserError(f"{flag} must be comma-separated names from {','.join(choices)} (each once); got {text!r}")
    return names


class Formatter(argparse.HelpFormatter):
    """``--help`` shows a comma list as one value (``--sizes S1,S2``) and ``--json FILE`` as taking FILE."""

    def _format_args(self, action, default_metavar):
        if isinstance(action, CommaList | JsonFile):
            return self._metavar_formatter(action, default_metavar)(1)[0]
        return super()._format_args(action, default_metavar)
