"""Human output: grouped by check, coloured by status, with a summary line.

How much is shown is a `TextOptions`. Three levels of detail (`-v` counts):
  0  compact, the default (like `flutter doctor`): one line per check with a mark; the findings,
     hints and tables only of checks that are not a pass. A healthy 8-GPU machine fits a screen.
  1  every check with its non-pass findings, a one-line summary of its passes, and its tables
     (the topology matrix).
  2  every finding, passes included.
and `quiet` (-q): only what is not a pass, and the summary line (no title, no passing check, no
table). How it looks is the console's (`make_console`: --color, NO_COLOR). A new layout is one
more renderer over the same Report, chosen in `render_report`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpudoctor.findings import CheckResult, Finding, Report, Status

STYLE = {
    Status.PASS: "green",
    Status.SKIP: "dim",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
}
LABEL = {Status.PASS: "PASS", Status.SKIP: "SKIP", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.ERROR: "ERR "}
# The compact view's marks; the ASCII set where the output cannot encode the others.
MARK = {Status.PASS: "[✓]", Status.SKIP: "[-]", Status.WARN: "[!]", Status.FAIL: "[✗]", Status.ERROR: "[?]"}
ASCII_MARK = {Status.PASS: "[+]", Status.SKIP: "[-]", Status.WARN: "[!]", Status.FAIL: "[x]", Status.ERROR: "[?]"}
COLOR_CHOICES = ("auto", "always", "never")


@dataclass(frozen=True)
class TextOptions:
    verbose: int = 0  # 0 compact, 1 every check and its tables, 2 passing findings too
    quiet: bool = False  # only what is not a pass, and the summary line


def no_color_requested(environ: Any = os.environ) -> bool:
    """NO_COLOR (https://no-color.org): present and not empty."""
    return bool(environ.get("NO_COLOR"))


def make_console(color: str = "auto", file: IO[str] | None = None) -> Console:
    """The console every text output uses.

    `color`: "always" styles even into a pipe or file; "never" writes plain text (no colour, no
    bold, no escape sequence at all); "auto" styles a terminal unless NO_COLOR is set. Piped
    output is not wrapped at 80 columns: a log or CI artifact keeps one finding per line. Text
    is never read as rich markup or emoji codes: messages carry `[redacted]` and GPU names.
    """
    out = file if file is not None else sys.stdout
    plain = color == "never" or (color == "auto" and no_color_requested())
    is_tty = bool(getattr(out, "isatty", lambda: False)())
    return Console(
        file=file,
        highlight=False,
        color_system=None if plain else "auto",
        force_terminal=True if color == "always" else None,
        soft_wrap=not is_tty,
        emoji=False,
        markup=False,
    )


def status_text(status: Status) -> Text:
    return Text(LABEL[status], style=STYLE[status])


def render_table(spec: dict[str, Any]) -> Table:
    """A details table: {"title": str, "columns": [str], "rows": [[str]]}."""
    table = Table(title=spec.get("title"), title_justify="left", box=None, pad_edge=False)
    columns = spec.get("columns", [])
    for i, col in enumerate(columns):
        # Only the last column wraps, so long CPU-affinity lists stay whole on one line.
        table.add_column(str(col), overflow="fold", no_wrap=i < len(columns) - 1)
    for row in spec.get("rows", []):
        table.add_row(*(str(v) for v in row))
    return table


def finding_lines(f: Finding, verbose: bool) -> list[Text]:
    line = Text("  ")
    line.append_text(status_text(f.status))
    line.append(f" {f.code} ", style="bold")
    line.append(f"{f.subject:<10} ", style="cyan")
    line.append(f.message)
    out = [line]
    if f.hint and f.status != Status.PASS:
        out.append(Text(f"                     hint: {f.hint}", style="dim"))
    return out


def render_check(console: Console, result: CheckResult, verbose: bool) -> None:
    head = Text()
    head.append_text(status_text(result.status))
    head.append(f" {result.title}", style="bold")
    shared = result.details.get("shared_run_s")
    took = f"in the shared rank run, {shared:.1f} s" if shared else f"{result.duration_s * 1000:.0f} ms"
    head.append(f"  ({result.name}, {took})", style="dim")
    console.print(head)
    shown = result.findings if verbose else [f for f in result.findings if f.status != Status.PASS]
    hidden = len(result.findings) - len(shown)
    for f in shown:
        for line in finding_lines(f, verbose):
            console.print(line)
    if hidden and not shown:
        # Say what passed, in one line, so a clean run still shows what was checked.
        first = next(f for f in result.findings if f.status == Status.PASS)
        more = f" (+{hidden - 1} more passed)" if hidden > 1 else ""
        console.print(Text(f"       {first.message}{more}", style="dim"))
    elif hidden:
        console.print(Text(f"       +{hidden} passed", style="dim"))
    for spec in result.details.get("tables", []):
        console.print(render_table(spec))


def _ids(values: Any) -> str:
    return ",".join(str(v) for v in values) if values else "-"


def summary_line(report: Report) -> Text:
    counts = report.counts()
    text = Text()
    parts = [(s, counts[s.value]) for s in (Status.FAIL, Status.ERROR, Status.WARN, Status.PASS, Status.SKIP)]
    for i, (s, n) in enumerate(p for p in parts if p[1]):
        if i:
            text.append(", ")
        text.append(f"{n} {s.value}", style=STYLE[s] if n else "")
    verdict = "NOT READY" if report.exit_code else "READY"
    text.append(f"  ->  {verdict} (exit {report.exit_code}, --fail-on {report.fail_on.value})", style="bold")
    return text


def _marks(console: Console) -> dict[Status, str]:
    try:
        "".join(MARK.values()).encode(console.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return ASCII_MARK
    return MARK


def pass_summary(result: CheckResult) -> str:
    """A check's passes (or skips) in one line: the first message and how many more."""
    shown = [f for f in result.findings if f.status == result.status] or result.findings
    if not shown:
        return ""
    more = f" (+{len(shown) - 1} more)" if len(shown) > 1 else ""
    return f"{shown[0].message}{more}"


def render_compact(console: Console, result: CheckResult, marks: dict[Status, str]) -> None:
    head = Text()
    head.append(marks[result.status], style=STYLE[result.status])
    head.append(f" {result.title}", style="bold" if result.status.rank else "")
    if result.status in (Status.PASS, Status.SKIP):
        summary = pass_summary(result)
        if summary:
            head.append(f": {summary}", style="dim")
        console.print(head)
        return
    console.print(head)
    for f in result.findings:
        if f.status not in (Status.PASS, Status.SKIP):
            for line in finding_lines(f, False):
                console.print(line)
    for spec in result.details.get("tables", []):
        console.print(render_table(spec))


def render_quiet(console: Console, result: CheckResult, marks: dict[Status, str]) -> None:
    """-q: a check that is not a pass, as one line, and its warnings, failures and errors."""
    if result.status == Status.PASS:
        return
    head = Text()
    head.append(marks[result.status], style=STYLE[result.status])
    head.append(f" {result.title}", style="bold" if result.status.rank else "")
    if result.status == Status.SKIP:
        summary = pass_summary(result)
        if summary:
            head.append(f": {summary}", style="dim")
    console.print(head)
    for f in result.findings:
        if f.status not in (Status.PASS, Status.SKIP):
            for line in finding_lines(f, False):
                console.print(line)


def render_report(
    report: Report, console: Console, verbose: int | bool = 0, *, options: TextOptions | None = None
) -> None:
    """The whole report: a title, each check, the node table under a launcher, the summary line."""
    options = options or TextOptions(verbose=int(verbose))
    marks = _marks(console)
    if options.quiet:
        for result in report.checks:
            render_quiet(console, result, marks)
        console.print(summary_line(report))
        return
    head = f"gpudoctor {report.gpudoctor_version} {report.command} on {report.source}"
    if report.policy:
        head += f" (policy {report.policy['path']})"
    console.print(Text(head, style="bold"))
    level = options.verbose
    for result in report.checks:
        if level == 0:
            render_compact(console, result, marks)
        else:
            render_check(console, result, level >= 2)
    if report.nodes:
        rows = [
            [
                n.get("node_rank", "?"),
                n.get("hostname", "?"),
                _ids(n.get("ranks")),
                _ids(n.get("gpus")),
                n.get("status", "?"),
            ]
            for n in report.nodes
        ]
        console.print(
            render_table({"title": "nodes", "columns": ["node", "host", "ranks", "gpus", "status"], "rows": rows})
        )
    console.print(summary_line(report))
