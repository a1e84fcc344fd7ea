"""`gpudoctor lint`'s text: one line per finding, `FILE:LINE: LEVEL CODE name: message` (the form
editors and CI logs link to a line), its hint under it, and a summary line.

Levels: FAIL (an error: the job crashes, hangs or trains wrong), WARN, INFO (a `pass` finding of
severity info), ERR (the file could not be read or parsed). File names and messages quote the
user's files: control characters are shown as "?", never sent to the terminal.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.findings import Finding, Report, Status
from gpudoctor.render.text import STYLE, Line

_LEVEL = {Status.FAIL: "FAIL", Status.WARN: "WARN", Status.PASS: "INFO", Status.ERROR: "ERR ", Status.SKIP: "SKIP"}
_INFO_STYLE = "cyan"


def finding_line(f: Finding) -> Line:
    line = Line()
    line.append(f"{f.subject}: ", style="bold")
    line.append(_LEVEL[f.status], style=_INFO_STYLE if f.status == Status.PASS else STYLE[f.status])
    line.append(f" {f.code} {f.evidence.get('rule', '')}: ", style="bold")
    line.append(f.message)
    return line


def render_lint(report: Report, console: Any, verbose: int = 0, quiet: bool = False) -> None:
    files = report.checks
    if not quiet:
        console.print(Line(f"gpudoctor {report.gpudoctor_version} lint: {_count(len(files), 'file')}", style="bold"))
    for result in files:
        if not result.findings:
            if verbose:
                console.print(Line(f"{result.name}: clean ({result.details.get('launcher', 'unknown')})", style="dim"))
            continue
        for f in result.findings:
            console.print(finding_line(f))
            if f.hint and not quiet:
                console.print(Line(f"    hint: {f.hint}", style="dim"))
    console.print(summary_line(report))


def summary_line(report: Report) -> Line:
    found = [f for f in report.findings]
    clean = sum(1 for r in report.checks if not r.findings)
    counts = [
        (sum(1 for f in found if f.status == status), label, style)
        for status, label, style in (
            (Status.FAIL, "fail", STYLE[Status.FAIL]),
            (Status.WARN, "warn", STYLE[Status.WARN]),
            (Status.PASS, "info", _INFO_STYLE),
            (Status.ERROR, "not parsed", STYLE[Status.ERROR]),
        )
    ]
    text = Line(f"{_count(len(report.checks), 'file')}, {clean} clean")
    for n, label, style in counts:
        if n:
            text.append(", ")
            text.append(f"{n} {label}", style=style)
    text.append(f"  ->  exit {report.exit_code} (--fail-on {report.fail_on.value})", style="bold")
    return text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
