"""Click options made from the option table (gpudoctor/engine/options.py), and the output options
the report commands share. A command lists the table's names it takes; the flag, type, bounds,
metavar and help come from the table, so the command line cannot drift from the API or the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from gpudoctor.cli.types import FiniteFloat, NonEmpty
from gpudoctor.engine import options as table

EXIT_CODES_HELP = """\b
Exit codes:
  0  nothing at or above --fail-on
  1  a finding at or above --fail-on (an `error` finding counts as fail)
  2  usage error: bad option, unknown code, unusable input file
  3  gpudoctor could not run at all (e.g. cannot write its output)
  129  hung up (SIGHUP: the terminal or SSH session closed)
  130  interrupted (Ctrl-C, SIGTERM)"""

FILE_NAME = NonEmpty("a file name")
CODE_LIST = NonEmpty("codes, prefixes or check names", items=True)

# Where the command's parameter name differs from the table's (the API's) keyword.
_DEST = {"snapshot": "snapshot_path", "config": "config_path"}

COLOR = click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Style the text output: auto = on a terminal unless NO_COLOR is set.",
)
QUIET = click.option(
    "-q", "--quiet", is_flag=True, help="Show only what warned, failed or crashed, and the summary line."
)
JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema: gpudoctor/schemas).")
JUNIT = click.option(
    "--junit", "junit_path", type=FILE_NAME, metavar="FILE", help="Also write the findings as JUnit XML."
)
NO_CONFIG = click.option("--no-config", is_flag=True, help="Use no policy file.")


def _collectives(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    """--collectives: the names, checked; None when not given (then the policy's list applies)."""
    if value is None:
        return None
    if not value.strip(" ,\t"):  # like --select '': an empty list would silently run nothing more
        raise click.BadParameter(f"needs collective names, got {value!r}.", ctx, param)
    from gpudoctor.knowledge.busbw import parse_ops

    try:
        return parse_ops(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _type(opt: table.Option) -> Any:
    if opt.kind == table.INT:
        return click.IntRange(None if opt.low is None else int(opt.low), None if opt.high is None else int(opt.high))
    if opt.kind == table.REAL:
        return FiniteFloat(min=opt.low, max=opt.high, min_open=opt.above)
    if opt.kind == table.CHOICE:
        return click.Choice(list(opt.choices))
    if opt.kind == table.TEXT:
        return NonEmpty(opt.wants or "a value")
    if opt.kind == table.PATH:
        return FILE_NAME
    if opt.kind == table.NAMES:
        return CODE_LIST
    return None  # BUSBW, SHARE, COLLECTIVES: strings, read by the table's parsers


def table_option(name: str, help: str | None = None) -> Callable[[Any], Any]:
    """The click option of the table's `name` (its help overridden by `help`, e.g. for `diff`)."""
    opt = table.option(name)
    kwargs: dict[str, Any] = {"help": help or opt.help}
    if opt.metavar:
        kwargs["metavar"] = opt.metavar
    if opt.kind == table.FLAG:
        kwargs["is_flag"] = True
        kwargs["default"] = opt.default  # None: unset, so the policy's value applies
    else:
        kind = _type(opt)
        if kind is not None:
            kwargs["type"] = kind
        if opt.default is not None:
            kwargs["default"] = opt.default
            kwargs["show_default"] = opt.show_default
    if opt.kind == table.NAMES:
        kwargs["multiple"] = True
    if opt.kind == table.COLLECTIVES:
        kwargs["callback"] = _collectives
    return click.option(opt.flag, _DEST.get(name, name), **kwargs)


def table_options(*names: str) -> Callable[[Any], Any]:
    """Decorate a command with the table's options `names`, in that order in its --help."""

    def decorate(func: Any) -> Any:
        for name in reversed(names):
            func = table_option(name)(func)
        return func

    return decorate


def split(values: tuple[str, ...]) -> tuple[str, ...]:
    """`--select GD4,GD5 --select topology` -> the names, one each."""
    return tuple(t.strip() for v in values for t in v.split(",") if t.strip())
