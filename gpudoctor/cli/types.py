"""Click parameter types shared by the commands.

`NonEmpty` is a string that must hold something: click passes `--junit ''` through as an empty
string, which then becomes "write to the current directory" or "select nothing" further on.
With `items=True` it is a comma-separated list that must name at least one item (`--select ,`).
Use it for every option that takes a file name or a list (`--junit`, `-o`, `--snapshot`,
`--select`, `--ignore`, `--record`, `--replay`).

`OnceCommand` refuses a single-value option given twice (`--expect-model H100 --expect-model A100`):
click keeps the last silently, so the first is dropped without a word. Options with `multiple=True`,
flags and counters (`-v -v`) may repeat.

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


class OnceCommand(click.Command):
    """A command whose single-value options may be given once: a repeat is a usage error (exit 2)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
            if not any(p.is_eager for p in order):  # --help / --version answer whatever else is given
                seen: set[str | None] = set()
                for param in order:
                    if not isinstance(param, click.Option) or param.multiple or param.is_flag or param.count:
                        continue
                    if param.name in seen:
                        names = "/".join(param.opts)
                        raise click.UsageError(f"{names} given more than once: it takes one value", ctx)
                    seen.add(param.name)
        return super().parse_args(ctx, args)


class OnceGroup(click.Group):
    """A group whose subcommands refuse a repeated single-value option (`bench scaling --steps 5 --steps 9`)."""

    command_class = OnceCommand
