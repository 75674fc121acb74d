"""Parsers of command-line values: sizes (``4M``) and comma-separated lists (``256,128``).

Every list-valued option of ``ssdmpi`` goes through ``parse_list``; byte sizes with
K/M/G suffixes through ``parse_size`` (also as ``parse_list(..., kind="size")``). Errors
are one-line ``UserError``s naming the option.
"""

from __future__ import annotations

from ssdmpi.errors import UserError

# Byte-size suffixes (powers of 1024); a trailing B is allowed: 16M = 16MB = 16 * 2**20.
SIZE_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
KINDS = {int: "integers", float: "numbers", "size": "sizes"}


def parse_size(text) -> int:
    """``"4M"`` -> 4194304 bytes (K, M, G are powers of 1024; a plain number is bytes)."""
    t = str(text).strip().upper().removesuffix("B")
    scale = SIZE_SUFFIXES.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in SIZE_SUFFIXES else t
    try:
        value = int(float(digits) * scale)
    except ValueError:
        raise UserError(f"cannot read size {text!r}; write e.g. 64K, 4M or a number of bytes") from None
    if value < 0:
        raise UserError(f"size {text!r} is negative; write e.g. 64K, 4M or a number of bytes")
    return value


def parse_list(text, flag: str, kind=int, minimum=None, strict: bool = False, example: str | None = None) -> list:
    """Comma-separated values -> list; ``UserError`` naming ``flag`` on anything else.

    ``text``: a string (``"1, 4,16"``; blanks and empty items are ignored) or a sequence
    of strings (``nargs="+"``). ``kind``: ``int``, ``float`` or ``"size"`` (``parse_size``,
    bytes). ``minimum``: every value must be >= it (> it with ``strict``). An empty list is
    an error. ``example`` is quoted in the message.
    """
    items = [text] if isinstance(text, str) else list(text)
    parts = [p.strip() for item in items for p in str(item).split(",") if p.strip()]
    bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
    hint = f" like {example}" if example else ""
    what = f"{flag} must be comma-separated {KINDS[kind]}{bound}{hint}; got {', '.join(map(str, items))!r}"
    convert = parse_size if kind == "size" else kind
    try:
        values = [convert(p) for p in parts]
    except (ValueError, UserError):
        raise UserError(what) from None
    if not values or (minimum is not None and any(v < minimum or (strict and v == minimum) for v in values)):
        raise UserError(what)
    return values
