"""The shared parsers of command-line values and the shared checks of single settings."""

import pytest

from ssdmpi.errors import UserError
from ssdmpi.parsing import parse_list, parse_size
from ssdmpi.validate import choice, nonnegative_int, number, positive_int


def test_parse_size():
    assert parse_size("4M") == 4 << 20 and parse_size("64k") == 64 << 10 and parse_size("1000") == 1000
    assert parse_size("0") == 0 and parse_size("1.5K") == 1536 and parse_size("16MB") == 16 << 20
    assert parse_size("2G") == 2 << 30
    with pytest.raises(UserError, match="cannot read size"):
        parse_size("lots")
    with pytest.raises(UserError, match="negative"):
        parse_size("-1K")


def test_parse_list_kinds():
    assert parse_list("256, 128,", "--widths") == [256, 128]
    assert parse_list("1,4.5", "--x", float) == [1.0, 4.5]
    assert parse_list(["1K", "4M"], "--sizes", "size") == [1024, 4 << 20]
    assert parse_list(["1K,2K", "4K"], "--sizes", "size") == [1024, 2048, 4096]


@pytest.mark.parametrize("text, kwargs, needle", [
    ("", {}, "comma-separated integers"),
    ("1,x", {}, "'1,x'"),
    ("1.5", {}, "integers"),
    ("0,2", {"minimum": 1}, ">= 1"),
    ("0", {"kind": float, "minimum": 0, "strict": True}, "> 0"),
    ("2", {"kind": "size", "minimum": 4}, "sizes >= 4"),
    ("lots", {"kind": "size"}, "sizes"),
])
def test_parse_list_errors_name_the_flag(text, kwargs, needle):
    with pytest.raises(UserError, match="--opt") as info:
        parse_list(text, "--opt", **kwargs)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_single_setting_checks():
    choice("algo", "ssd", ("ssd", "ssgd"))
    with pytest.raises(UserError, match="--algo 'x' is not one of ssd, ssgd"):
        choice("algo", "x", ("ssd", "ssgd"))
    positive_int("steps", 1)
    for bad in (0, True, 1.0):
        with pytest.raises(UserError, match="--steps must be a positive integer"):
            positive_int("steps", bad)
    nonnegative_int("seed", 0)
    with pytest.raises(UserError, match=">= 0"):
        nonnegative_int("seed", -1)
    number("momentum", 0.0, low=0.0, high=1.0, high_open=True)
    with pytest.raises(UserError, match="--momentum must be < 1.0"):
        number("momentum", 1.0, low=0.0, high=1.0, high_open=True)
    number("p", 1.0, high=1.0)
    with pytest.raises(UserError, match="must be > 0"):
        number("lr", 0.0, low=0.0, strict=True)
    with pytest.raises(UserError, match="finite"):
        number("lr", float("nan"))
