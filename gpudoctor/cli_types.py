"""Click parameter types shared by the commands.

`NonEmpty` is a string that must hold something: click passes `--junit ''` through as an empty
string, which then becomes "write to the current directory" or "select nothing" further on.
With `items=True` it is a comma-separated list that must name at least one item (`--select ,`).
Use it for every option that takes a file name or a list (`--junit`, `-o`, `--snapshot`,
`--select`, `--ignore`, `--record`, `--replay`).

`FiniteFloat` is `click.FloatRange` that also refuses NaN and infinities: Python's `float()`
accepts "nan", "inf" and "infinity", and NaN compares false with every bound, so a plain
`FloatRange(min=0.1)` lets `--interval nan` through (a busy loop) and `--duration inf`
(a run that never ends). A refused value is an ordinary click usage error (exit 2).
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.FloatRange):
    """A finite float, optionally bounded like `click.FloatRange` (min, max, min_open, max_open, clamp)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)

    def __repr__(self) -> str:
        return f"FiniteFloat({self._describe_range()})" if (self.min, self.max) != (None, None) else "FiniteFloat"


class NonEmpty(click.ParamType):
    """A string option value that is not empty (nor only commas, with `items=True`)."""

    name = "text"

    def __init__(self, what: str = "a value", items: bool = False) -> None:
        self.what = what  # what the option wants, for the message: "a file name", "codes or check names"
        self.items = items

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        empty = not text.strip(" ,\t") if self.items else not text.strip()
        if empty:
            self.fail(f"needs {self.what}, got {value!r}.", param, ctx)
        return text

    def __repr__(self) -> str:
        return f"NonEmpty({self.what!r})"
