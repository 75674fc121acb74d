"""The text corpora: read the built-in Devil's Dictionary, the King James Bible, or text files, as bytes.

Where each is looked for is ``ssdmpi/data/datasets.py``'s job; this module reads what it found.

* ``devils-dictionary`` (built in): ``devil.dict.dz`` beside this module, Ambrose Bierce's
  "The Devil's Dictionary" (public domain; notice in ``devil.LICENSE.txt``), byte for byte the
  file of Debian's package dict-devil: 383,656 bytes of ASCII text, used as they are.
* ``kjv``: the King James Version of the Bible (1611; public domain), 31,102 verses. Read from a
  UTF-8 text file (any edition: ``kjv.txt``, used as it is), or from Debian's compressed
  ``/usr/lib/bible.data`` (package bible-kjv-text) through Debian's ``bible`` program (package
  bible-kjv), which prints every verse on a line after its reference (``Ge1:1 In the
  beginning ...``); the reference is dropped: one verse per line, 4,137,850 bytes.
* text files (``ssdmpi data convert text FILE...``): UTF-8, not empty, no NUL bytes; joined with
  a separator (default a newline) between consecutive files.

The built-in corpora's val split is their last ``VAL_FRACTION`` of bytes (``split``).
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess

import numpy as np

from ssdmpi.errors import UserError

HERE = os.path.dirname(os.path.abspath(__file__))
DEVIL_FILE = os.path.join(HERE, "devil.dict.dz")
DEVIL_BYTES = 383_656
DEVIL_LICENCE = "public domain (Ambrose Bierce, 1911; copyright expired); see ssdmpi/data/devil.LICENSE.txt"
DEVIL_DESCRIPTION = "The Devil's Dictionary by Ambrose Bierce, as Debian's dict-devil ships it"
KJV_LICENCE = "public domain (the King James Version of 1611)"
KJV_DESCRIPTION = "the King James Version of the Bible, one verse per line"
KJV_VERSES = 31_102
KJV_RANGE = "gen1:1-rev22:21"        # every verse, for the bible program
BIBLE_MAGIC = b"EC02"                # the first bytes of Debian's bible.data
VAL_FRACTION = 0.1
_REFERENCE = re.compile(rb"^\S+ ", re.M)   # "Ge1:1 " at the start of each line the bible program prints


def read_devil(path: str = DEVIL_FILE) -> bytes:
    """The Devil's Dictionary's text (ASCII bytes); UserError if the shipped file is missing or broken."""
    if not os.path.isfile(path):
        raise UserError(f"the built-in text file is missing ({path}); reinstall ssdmpi")
    try:
        with gzip.open(path) as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise UserError(f"cannot read the built-in text file {path} ({exc}); reinstall ssdmpi") from None
    return data


def is_bible_data(path: str) -> bool:
    """True if ``path`` starts like Debian's compressed ``bible.data``."""
    with open(path, "rb") as f:
        return f.read(len(BIBLE_MAGIC)) == BIBLE_MAGIC


def bible_program() -> str | None:
    """Debian's ``bible`` program (package bible-kjv), or None."""
    return shutil.which("bible") or next((p for p in ("/usr/bin/bible", "/usr/games/bible")
                                          if os.access(p, os.X_OK)), None)


def read_kjv(path: str) -> bytes:
    """The KJV's text from ``path``: Debian's ``bible.data`` (through the ``bible`` program) or a text file."""
    if not is_bible_data(path):
        return read_text_file(path)
    program = bible_program()
    if program is None:
        raise UserError(f"{path} is Debian's compressed Bible, which its bible program reads, and that is not "
                        "installed: apt-get install bible-kjv")
    directory, name = os.path.split(os.path.abspath(path))
    try:
        result = subprocess.run([program, "-f", "-p", directory, "-d", name, KJV_RANGE], stdin=subprocess.DEVNULL,
                                capture_output=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"cannot run {program} to read {path} ({exc})") from None
    verses = result.stdout.count(b"\n")
    if result.returncode != 0 or verses != KJV_VERSES:
        said = (result.stderr or result.stdout).decode(errors="replace").strip().splitlines()
        raise UserError(f"{program} printed {verses} verses of {path} (exit {result.returncode}), not the "
                        f"{KJV_VERSES:,} of the whole Bible{': ' + said[0] if said else ''}; reinstall bible-kjv-text")
    return _REFERENCE.sub(b"", result.stdout)


def read_text_file(path: str) -> bytes:
    """A file's bytes, checked to be non-empty UTF-8 text without NUL bytes; UserError otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not data:
        raise UserError(f"{path} is empty; give files that hold text")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start:,}); convert it first, "
                        f"e.g. iconv -t UTF-8 {path}") from None
    if b"\0" in data:
        raise UserError(f"{path} holds NUL bytes (first at byte {data.index(0):,}): it is not a text file")
    return data


def read_text_files(paths, separator: bytes = b"\n") -> bytes:
    """The files' texts joined with ``separator`` between consecutive files (each checked as above)."""
    if not paths:
        raise UserError("no text files given: ssdmpi data convert text FILE... --out corpus.h5")
    return separator.join(read_text_file(p) for p in paths)


_ESCAPES = re.compile(r"\\(x[0-9a-fA-F]{2}|.)", re.S)


def parse_separator(text: str) -> bytes:
    r"""``--separator``'s value as UTF-8 bytes, with the escapes ``\n``, ``\t``, ``\r``, ``\\``, ``\xHH``."""
    def escape(match):
        code = match.group(1)
        if code[0] == "x":
            return chr(int(code[1:], 16))
        if code not in "ntr\\":
            raise UserError(rf"--separator: unknown escape \{code} (known: \n \t \r \\ \xHH)")
        return {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[code]
    return _ESCAPES.sub(escape, text).encode("utf-8")


def split(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)``: val is the last ``round(len * val_fraction)`` tokens, the cut moved forward past
    any UTF-8 continuation bytes so that no character of byte tokens is split between the two."""
    cut = len(tokens) - int(round(len(tokens) * float(val_fraction)))
    if tokens.dtype == np.uint8:
        while cut < len(tokens) and (int(tokens[cut]) & 0xC0) == 0x80:
            cut += 1
    return tokens[:cut], tokens[cut:]
