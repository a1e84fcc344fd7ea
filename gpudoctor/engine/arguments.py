"""The Python API's arguments, checked as the command line's click types check its options.

`gpudoctor check --expect-gpus 0` is refused by click's `IntRange(min=1)`; `run_checks(expect_gpus=0)`
must be refused the same way, not run with a value no option could give (`expect_gpus="8"`
compared with a count, `ranks=0` quietly becoming 2, `select="GD4"` read as the codes "G", "D"
and "4"). The bounds are the option table's (engine/options.py), which the command line's click
types are made from too; a wrong type raises ArgumentTypeError (a TypeError),
a wrong value ArgumentError (a ValueError). Both are gpudoctor.UserError too, so code written
against the documented UserError keeps working, and the message names the keyword.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Iterable
from typing import Any

from gpudoctor.engine.options import BUSBW, CHOICE, COLLECTIVES, FLAG, INT, NAMES, PATH, REAL, SHARE, TEXT, Option
from gpudoctor.errors import EXIT_USAGE, UserError, shown


class ArgumentError(UserError, ValueError):
    """A keyword of run_checks/preflight/diff_report with a value it does not take."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE, "usage")


class ArgumentTypeError(UserError, TypeError):
    """A keyword of run_checks/preflight/diff_report given a value of the wrong type."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE, "usage")


def _got(value: Any) -> str:
    return f"{shown(value)} ({type(value).__name__})"


def integer(name: str, value: Any, low: int, high: int | None = None) -> int | None:
    """None, or an integer (int, numpy's) within [low, high]; a bool or a float is a type error."""
    if value is None:
        return None
    span = f"from {low} to {high}" if high is not None else f"of at least {low}"
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an integer {span}, got {_got(value)}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be an integer {span}, got {_got(value)}") from None
    if number < low or (high is not None and number > high):
        raise ArgumentError(f"{name} must be an integer {span}, got {number}")
    return number


def real(name: str, value: Any, low: float, high: float | None = None) -> float | None:
    """None, or a finite real number within [low, high]."""
    if value is None:
        return None
    span = f"from {low:g} to {high:g}" if high is not None else f"of at least {low:g}"
    if isinstance(value, bool) or not (isinstance(value, int | float) or hasattr(value, "__float__")):
        raise ArgumentTypeError(f"{name} must be a number {span}, got {_got(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ArgumentError(f"{name} must be a finite number {span}, got {_got(value)}") from None
    if not math.isfinite(number) or number < low or (high is not None and number > high):
        raise ArgumentError(f"{name} must be a finite number {span}, got {_got(value)}")
    return number


def flag(name: str, value: Any, optional: bool = True) -> bool | None:
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False, got {_got(value)}")
    return value


def text(name: str, value: Any, choices: tuple[str, ...] = ()) -> str | None:
    """None, or a non-empty string (one of `choices` when given)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a string, got {_got(value)}")
    if choices and value not in choices:
        raise ArgumentError(f"{name} must be {' or '.join(repr(c) for c in choices)}, got {shown(value)}")
    if not value.strip():
        raise ArgumentError(f"{name} must not be empty (it would match everything)")
    return value


def path(name: str, value: Any, required: bool = False) -> Any:
    """None (unless `required`), or a file name (str or os.PathLike) that is not empty."""
    if value is None and not required:
        return None
    if not isinstance(value, str | os.PathLike):
        raise ArgumentTypeError(f"{name} must be a file name (str or pathlib.Path), got {_got(value)}")
    if not str(os.fspath(value)).strip():
        raise ArgumentError(f"{name} must name a file, got {shown(value)}")
    return value


def names(name: str, value: Any) -> tuple[str, ...] | None:
    """None, or a list of non-empty strings: a bare string is refused, it would be read letter by letter."""
    if value is None:
        return None
    if isinstance(value, str | bytes):
        raise ArgumentTypeError(f"{name} takes a list of strings, e.g. {name}=[{shown(value)}], not a string")
    if not isinstance(value, Iterable):
        raise ArgumentTypeError(f"{name} takes a list of strings, got {_got(value)}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ArgumentTypeError(f"{name} takes a list of non-empty strings, got the item {_got(item)}")
    return items


def callable_or_none(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise ArgumentTypeError(f"{name} must be a function taking one string, got {_got(value)}")
    return value


def share(name: str, value: Any) -> Any:
    """None, or a share: '10%', '0.1' or 0.1 (policy.parse_share's forms), refused before any work."""
    from gpudoctor.engine.values import parse_share

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ArgumentTypeError(f"{name} must be a share such as '10%' or 0.1, got {value!r}")
    try:
        parse_share(value, name)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    return value


def collectives(name: str, value: Any) -> tuple[str, ...] | None:
    """None, or a list of collective names as `--collectives` reads them (aliases such as fsdp)."""
    from gpudoctor.knowledge.busbw import parse_ops

    items = names(name, value)
    if items is None:
        return None
    try:
        return parse_ops(",".join(items))
    except ValueError as exc:
        raise ArgumentError(f"{name}: {exc}") from None


def validate(opt: Option, value: Any) -> Any:
    """One keyword of the option table checked as the command line checks its option."""
    kind, name = opt.kind, opt.name
    if kind == INT:
        return integer(name, value, int(opt.low or 0), None if opt.high is None else int(opt.high))
    if kind == REAL:
        high = None if opt.bound_after_merge else opt.high
        return real(name, value, opt.low or 0.0, high)
    if kind == FLAG:
        return flag(name, value, optional=opt.default is None)
    if kind == CHOICE:
        return text(name, value, opt.choices)
    if kind == TEXT:
        return text(name, value)
    if kind == NAMES:
        return names(name, value)
    if kind == COLLECTIVES:
        return collectives(name, value)
    if kind == PATH:
        return path(name, value)
    if kind == SHARE:
        return share(name, value)
    if kind == BUSBW:  # a number of GB/s here; a string ('80%') is read with the policy's rules later
        if value is not None and not isinstance(value, str):
            real(name, value, 0)
        return value
    raise ValueError(f"option {name}: unknown kind {kind!r}")
