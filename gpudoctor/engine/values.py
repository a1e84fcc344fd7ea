"""How a value of each kind in the option table (engine/options.py) is read from text or TOML:
the forms a share ('10%', 0.1) and a bus bandwidth (GB/s or '80%') take, and the readers a policy
file's keys use. Each reader returns the value or raises ValueError with a one-line reason."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gpudoctor.engine.options import (
    BUSBW,
    CHOICE,
    COLLECTIVES,
    FLAG,
    INT,
    NAMES,
    REAL,
    SHARE,
    TEXT,
    Option,
)
from gpudoctor.errors import shown

SEVERITIES = ("warn", "fail")  # what a policy's [severity] table may set a code to


def finite(value: Any) -> bool:
    """A number a float holds: not a bool, NaN or infinity, nor an integer of 400 digits."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def parse_share(value: Any, what: str = "a share") -> float:
    """'10%', 0.1 or '0.1' -> 0.1. A bare number of 1 or more is refused: 10 could mean 10% or 1000%."""
    usage = f"{what} is a fraction (0.1) or a percentage ('10%'), got {shown(value)}"
    percent = isinstance(value, str) and value.strip().endswith("%")
    if isinstance(value, str):  # "10%", or "0.05" as the command line gives a fraction
        try:
            number = float(value.strip().removesuffix("%")) / (100 if percent else 1)
        except ValueError:
            raise ValueError(usage) from None
    elif finite(value):
        number = float(value)
    else:
        raise ValueError(usage)
    if not math.isfinite(number):
        raise ValueError(usage)
    if not percent and number >= 1:
        raise ValueError(f"{what} {shown(value)} is ambiguous: write a fraction (0.1) or a percentage ('10%')")
    if not 0 < number < 1:
        raise ValueError(f"{what} must be above 0% and below 100%, got {shown(value)}")
    return number


def parse_busbw(value: Any) -> tuple[float | None, float | None]:
    """min-busbw: a number of GB/s, or 'NN%' of the expected busbw -> (absolute, share)."""
    usage = f"expected GB/s (a number) or a share of the expectation ('80%'), got {shown(value)}"
    if isinstance(value, str) and value.strip().endswith("%"):
        text = value.strip()[:-1]
        try:
            share = float(text) / 100
        except ValueError:
            raise ValueError(usage) from None
        if not (0 < share <= 1) or not math.isfinite(share):
            raise ValueError(f"a share of the expected busbw must be above 0% and at most 100%, got {shown(value)}")
        return None, share
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(usage) from None
    if not finite(value) or value < 0:
        raise ValueError(f"expected GB/s (a finite number, at least 0) or a share ('80%'), got {shown(value)}")
    return float(value), None


def _number(
    minimum: float, *, integer: bool = False, above: bool = False, high: float | None = None
) -> Callable[[Any], float]:
    def read(value: Any) -> float:
        kind = "an integer" if integer else "a number"
        if integer and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"expected {kind}, got {shown(value)}")
        if not finite(value):
            raise ValueError(f"expected a finite number, got {shown(value)}")
        if value < minimum or (above and value == minimum):
            raise ValueError(f"expected {kind} {'above' if above else 'at least'} {minimum:g}, got {shown(value)}")
        if high is not None and value > high:
            raise ValueError(f"expected {kind} at most {high:g}, got {shown(value)}")
        return int(value) if integer else float(value)

    return read


def _choice(*choices: str) -> Callable[[Any], str]:
    def read(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(repr(c) for c in choices)}, got {shown(value)}")
        return value

    return read


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {shown(value)}")
    return value.strip()


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {shown(value)}")
    return value


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"expected a list of strings, got {shown(value)}")
    return tuple(v.strip() for v in value)


def collective_list(value: Any) -> tuple[str, ...]:
    """A policy's `collectives`: the names `--collectives` takes (gpudoctor.knowledge.busbw.parse_ops)."""
    from gpudoctor.knowledge.busbw import parse_ops

    return parse_ops(",".join(_strings(value)))


def reader(opt: Option) -> Callable[[Any], Any]:
    """The policy file's reader for an option of the table."""
    kind = opt.kind
    if kind == INT:
        return _number(opt.low or 0, integer=True, high=opt.high)
    if kind == REAL:
        return _number(opt.low or 0, above=opt.above, high=None if opt.bound_after_merge else opt.high)
    if kind == CHOICE:
        return _choice(*opt.choices)
    if kind == TEXT:
        return _text
    if kind == FLAG:
        return _flag
    if kind == NAMES:
        return _strings
    if kind == COLLECTIVES:
        return collective_list
    if kind == SHARE:
        return lambda v: parse_share(v, opt.policy)
    if kind == BUSBW:
        return parse_busbw
    raise ValueError(f"option {opt.name}: a policy cannot set a {kind} value")
