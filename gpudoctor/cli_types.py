"""Click parameter types shared by the commands.

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
