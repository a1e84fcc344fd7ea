"""Human output: grouped by check, coloured by status, with a summary line.

Three levels of detail (`-v` counts):
  0  compact, the default (like `flutter doctor`): one line per check with a mark; the findings,
     hints and tables only of checks that are not a pass. A healthy 8-GPU machine fits a screen.
  1  every check with its non-pass findings, a one-line summary of its passes, and its tables
     (the topology matrix).
  2  every finding, passes included.
"""

from __future__ import annotations

from typing import Any

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


def render_report(report: Report, console: Console, verbose: int | bool = 0) -> None:
    head = f"gpudoctor {report.gpudoctor_version} {report.command} on {report.source}"
    if report.policy:
        head += f" (policy {report.policy['path']})"
    console.print(Text(head, style="bold"))
    level = int(verbose)
    marks = _marks(console)
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
