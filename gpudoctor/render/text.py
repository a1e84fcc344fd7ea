"""Human output: grouped by check, coloured by status, with a summary line.

How much is shown is a `TextOptions`. Three levels of detail (`-v` counts):
  0  compact, the default (like `flutter doctor`): one line per check with a mark; the findings,
     hints and tables only of checks that are not a pass. A healthy 8-GPU machine fits a screen.
  1  every check with its non-pass findings, a one-line summary of its passes, and its tables
     (the topology matrix).
  2  every finding, passes included.
and `quiet` (-q): only what warned, failed or crashed, and the summary line (no title, no passing
or skipped check, no table). A new layout is one more renderer over the same Report, chosen in `render_report`.

How it looks is the console's (`make_console`): the renderers print `Line`s (styled spans) and
`TableSpec`s. On a terminal (or with --color always) a rich Console draws them, styled and fitted
to the width; otherwise (a pipe, a file, NO_COLOR, --color never) `PlainConsole` writes them as
plain text, one line each, tables in aligned columns, without importing rich at all (start-up
time: `check --quick` in CI prints to a pipe). Control characters from a snapshot (an escape
sequence in a host name) are shown as "?" either way, never sent to the terminal.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import IO, Any

from gpudoctor.findings import CheckResult, Finding, Report, Status
from gpudoctor.safety.safe_text import CONTROL, printable

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
# C0 controls but tab and newline, DEL and C1 controls: ESC would reach the terminal as a command.


@dataclass(frozen=True)
class TextOptions:
    verbose: int = 0  # 0 compact, 1 every check and its tables, 2 passing findings too
    quiet: bool = False  # only what warned, failed or crashed, and the summary line


class Line:
    """One line of text in styled spans; rich draws it through `__rich__`, PlainConsole as text."""

    def __init__(self, text: str = "", style: str = "") -> None:
        self.spans: list[tuple[str, str]] = []
        if text:
            self.append(text, style)

    def append(self, text: str, style: str = "") -> Line:
        self.spans.append((printable(text), style))
        return self

    def append_text(self, other: Line) -> Line:
        self.spans.extend(other.spans)
        return self

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.spans)

    def __str__(self) -> str:
        return self.plain

    def __rich__(self) -> Any:
        from rich.text import Text

        out = Text()
        for text, style in self.spans:
            out.append(text, style=style or None)
        return out


class TableSpec:
    """A details table: {"title": str, "columns": [str], "rows": [[str]]}, drawn by either console."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def lines(self) -> list[str]:
        """Plain columns: every column as wide as its widest cell, two spaces apart, never wrapped."""
        columns = [printable(c) for c in self.spec.get("columns", [])]
        rows = [[printable(v) for v in row] for row in self.spec.get("rows", [])]
        widths = [max([len(c), *(len(r[i]) for r in rows if i < len(r))]) for i, c in enumerate(columns)]
        out = [printable(self.spec["title"])] if self.spec.get("title") else []
        for cells in [columns, *rows]:
            out.append("  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=False)).rstrip())
        return out

    def __rich__(self) -> Any:
        return render_table(self.spec)


class PlainConsole:
    """The console of unstyled output: what rich would print without styles, one line per line."""

    def __init__(self, file: IO[str] | None = None) -> None:
        self._file = file

    @property
    def file(self) -> Any:
        return self._file if self._file is not None else sys.stdout  # the one in place at print time

    @property
    def encoding(self) -> str:
        return getattr(self.file, "encoding", None) or "utf-8"

    def print(self, obj: Any = "") -> None:
        lines = obj.lines() if isinstance(obj, TableSpec) else [CONTROL.sub("?", str(obj))]
        self.file.write("".join(line + "\n" for line in lines))


def no_color_requested(environ: Any = os.environ) -> bool:
    """NO_COLOR (https://no-color.org): present and not empty."""
    return bool(environ.get("NO_COLOR"))


def make_console(color: str = "auto", file: IO[str] | None = None) -> Any:
    """The console every text output uses: rich when styling, PlainConsole otherwise.

    `color`: "always" styles even into a pipe or file; "never" writes plain text (no colour, no
    bold, no escape sequence at all); "auto" styles a terminal unless NO_COLOR is set (or TERM is
    "dumb"). Text is never read as rich markup or emoji codes: messages carry `[redacted]`.
    """
    out = file if file is not None else sys.stdout
    is_tty = bool(getattr(out, "isatty", lambda: False)())
    styled = color == "always" or (
        color == "auto" and is_tty and not no_color_requested() and os.environ.get("TERM") != "dumb"
    )
    if not styled:
        return PlainConsole(file)
    from rich.console import Console  # only for styled output

    return Console(
        file=file,
        highlight=False,
        color_system="auto",
        force_terminal=True if color == "always" else None,
        soft_wrap=not is_tty,  # a log or CI artifact keeps one finding per line
        emoji=False,
        markup=False,
    )


def status_text(status: Status) -> Line:
    return Line(LABEL[status], style=STYLE[status])


def render_table(spec: dict[str, Any]) -> Any:
    """A details table: {"title": str, "columns": [str], "rows": [[str]]}."""
    from rich.table import Table  # lazy: a healthy machine's compact report has no table

    title = spec.get("title")
    table = Table(title=printable(title) if title else None, title_justify="left", box=None, pad_edge=False)
    columns = spec.get("columns", [])
    for i, col in enumerate(columns):
        # Only the last column wraps, so long CPU-affinity lists stay whole on one line.
        table.add_column(printable(col), overflow="fold", no_wrap=i < len(columns) - 1)
    for row in spec.get("rows", []):
        table.add_row(*(printable(v) for v in row))
    return table


def finding_lines(f: Finding, verbose: bool, hint: bool = True) -> list[Line]:
    """The finding's line, and its hint below it (`hint=False`: the line above gave the same one)."""
    line = Line("  ")
    line.append_text(status_text(f.status))
    line.append(f" {f.code} ", style="bold")
    line.append(f"{f.subject:<10} ", style="cyan")
    line.append(f.message)
    out = [line]
    if hint and f.hint and f.status != Status.PASS:
        out.append(Line(f"                     hint: {f.hint}", style="dim"))
    return out


def print_findings(console: Any, findings: list[Finding], verbose: bool) -> None:
    said = None  # a hint repeated line after line (10,000 unreadable files) is said once
    for f in findings:
        for line in finding_lines(f, verbose, hint=f.hint != said):
            console.print(line)
        said = f.hint if f.status != Status.PASS else None


def render_check(console: Any, result: CheckResult, verbose: bool) -> None:
    head = Line()
    head.append_text(status_text(result.status))
    head.append(f" {result.title}", style="bold")
    shared = result.details.get("shared_run_s")
    took = f"in the shared rank run, {shared:.1f} s" if shared else f"{result.duration_s * 1000:.0f} ms"
    head.append(f"  ({result.name}, {took})", style="dim")
    console.print(head)
    shown = result.findings if verbose else [f for f in result.findings if f.status != Status.PASS]
    hidden = len(result.findings) - len(shown)
    print_findings(console, shown, verbose)
    if hidden and not shown:
        # Say what passed, in one line, so a clean run still shows what was checked.
        first = next(f for f in result.findings if f.status == Status.PASS)
        more = f" (+{hidden - 1} more passed)" if hidden > 1 else ""
        console.print(Line(f"       {first.message}{more}", style="dim"))
    elif hidden:
        console.print(Line(f"       +{hidden} passed", style="dim"))
    for spec in result.details.get("tables", []):
        console.print(TableSpec(spec))


def _ids(values: Any) -> str:
    return ",".join(str(v) for v in values) if values else "-"


def summary_line(report: Report) -> Line:
    counts = report.counts()
    text = Line()
    parts = [(s, counts[s.value]) for s in (Status.FAIL, Status.ERROR, Status.WARN, Status.PASS, Status.SKIP)]
    for i, (s, n) in enumerate(p for p in parts if p[1]):
        if i:
            text.append(", ")
        text.append(f"{n} {s.value}", style=STYLE[s] if n else "")
    verdict = "NOT READY" if report.exit_code else "READY"
    text.append(f"  ->  {verdict} (exit {report.exit_code}, --fail-on {report.fail_on.value})", style="bold")
    return text


def _marks(console: Any) -> dict[Status, str]:
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


def render_compact(console: Any, result: CheckResult, marks: dict[Status, str]) -> None:
    head = Line()
    head.append(marks[result.status], style=STYLE[result.status])
    head.append(f" {result.title}", style="bold" if result.status.rank else "")
    if result.status in (Status.PASS, Status.SKIP):
        summary = pass_summary(result)
        if summary:
            head.append(f": {summary}", style="dim")
        console.print(head)
        return
    console.print(head)
    print_findings(console, [f for f in result.findings if f.status not in (Status.PASS, Status.SKIP)], False)
    for spec in result.details.get("tables", []):
        console.print(TableSpec(spec))


def render_quiet(console: Any, result: CheckResult, marks: dict[Status, str]) -> None:
    """-q: a check that warned, failed or crashed, as one line, and its warnings, failures and
    errors. Passes and skips are counted in the summary line only (a CPU run skips every GPU check)."""
    if result.status in (Status.PASS, Status.SKIP):
        return
    head = Line()
    head.append(marks[result.status], style=STYLE[result.status])
    head.append(f" {result.title}", style="bold" if result.status.rank else "")
    console.print(head)
    print_findings(console, [f for f in result.findings if f.status not in (Status.PASS, Status.SKIP)], False)


def render_report(report: Report, console: Any, verbose: int | bool = 0, *, options: TextOptions | None = None) -> None:
    """The whole report: a title, each check, the node table under a launcher, the summary line."""
    options = options or TextOptions(verbose=int(verbose))
    marks = _marks(console)
    if options.quiet:
        for result in report.checks:
            render_quiet(console, result, marks)
        console.print(summary_line(report))
        return
    head = f"gpudoctor {report.gpudoctor_version} {report.command} on {report.source}"
    if report.policy and report.policy.get("path"):
        head += f" (policy {report.policy['path']})"
    elif report.policy and report.policy.get("skipped"):  # an untrusted file was passed over: say which
        head += f" (no policy: {', '.join(s['path'] for s in report.policy['skipped'])} ignored)"
    console.print(Line(head, style="bold"))
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
            TableSpec({"title": "nodes", "columns": ["node", "host", "ranks", "gpus", "status"], "rows": rows})
        )
    console.print(summary_line(report))
