"""Checks of single settings, shared by every layer that validates user input.

Each helper raises ``UserError`` with one line naming the option (``--flag``) and what
it must be, or returns nothing. ``TrainConfig.validate`` and ``AlgoConfig.validate`` use
these same helpers, so one setting is checked (and worded) the same way everywhere.
"""

from __future__ import annotations

import difflib
import math

from ssdmpi.errors import UserError


def flag_name(name: str) -> str:
    """``"batch_size"`` -> ``"batch-size"`` (a field name as its command-line flag)."""
    return name.replace("_", "-")


def is_int(value) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def did_you_mean(word: str, known) -> str:
    """``" (did you mean --epochs?)"`` when ``word`` is close to one of ``known``, else ``""``."""
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def choice(flag: str, value, choices) -> None:
    """``value`` must be one of ``choices``."""
    if value not in choices:
        raise UserError(f"--{flag} {value!r} is not one of {', '.join(choices)}")


def positive_int(flag: str, value) -> None:
    """``value`` must be an integer >= 1."""
    if not is_int(value) or value < 1:
        raise UserError(f"--{flag} must be a positive integer, got {value!r}")


def nonnegative_int(flag: str, value) -> None:
    """``value`` must be an integer >= 0."""
    if not is_int(value) or value < 0:
        raise UserError(f"--{flag} must be an integer >= 0, got {value!r}")


def number(flag: str, value, low=None, high=None, strict: bool = False, high_open: bool = False) -> None:
    """``value`` must be a finite number in ``[low, high]``.

    ``strict``: ``low`` itself is excluded; ``high_open``: ``high`` itself is excluded.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"--{flag} must be a finite number, got {value!r}")
    if low is not None and (value < low or (strict and value == low)):
        raise UserError(f"--{flag} must be {'>' if strict else '>='} {low}, got {value!r}")
    if high is not None and (value > high or (high_open and value == high)):
        raise UserError(f"--{flag} must be {'<' if high_open else '<='} {high}, got {value!r}")
