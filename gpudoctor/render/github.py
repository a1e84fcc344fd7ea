"""GitHub Actions: a Markdown job summary and `::error` / `::warning` annotations.

On when `GITHUB_ACTIONS=true` (the runner sets it) or with `--github`. Sources in
tests/reference/github-actions.md:

- Annotations are workflow commands, `::error title=T::message`. Their data escapes `%`, CR and
  LF as %25, %0D, %0A; property values (the title) also escape `:` and `,` (%3A, %2C), which
  covers `::`. That is what @actions/toolkit's command.ts does and the runner undoes.
- They go to stderr: the runner parses workflow commands on stdout and stderr alike
  (actions/runner ScriptHandler.cs), and stdout must stay one JSON document under --json.
- GitHub shows 10 error and 10 warning annotations per step; past that, the 10th says how many
  more there are and points at the summary.
- The summary is appended to the file `$GITHUB_STEP_SUMMARY` names (1 MiB per step at most). The
  runner creates that file; gpudoctor appends to it under the safe-output rules
  (safety/safe_io.open_append): a regular file only, never created, never through a link, never
  waited on (a FIFO planted there is refused, not blocked on).
- Text from elsewhere (another user's command line in a finding, a snapshot's host name) may hold
  escape sequences, which GitHub's log viewer renders: annotations and the summary show every
  control and bidi character as `?` (safety/safe_text.CONTROL), as the text report does.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import IO

from gpudoctor.findings import Finding, Report, Status
from gpudoctor.safety.safe_io import UNENCODABLE, open_append
from gpudoctor.safety.safe_text import CONTROL

ANNOTATIONS_PER_KIND = 10
SUMMARY_LIMIT = 1 << 20  # bytes GitHub accepts per step summary
ICON = {Status.PASS: "✅", Status.SKIP: "⏭️", Status.WARN: "⚠️", Status.FAIL: "❌", Status.ERROR: "💥"}


def enabled(flag: bool | None, environ: Mapping[str, str]) -> bool:
    """--github / --no-github, else the runner's GITHUB_ACTIONS=true."""
    return flag if flag is not None else environ.get("GITHUB_ACTIONS", "").lower() == "true"


def escape_data(text: str) -> str:
    """A workflow command's data: `%`, CR and LF escaped as the runner undoes them, any other
    control (an escape sequence) or bidi character shown as `?`."""
    return CONTROL.sub("?", text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotation(kind: str, title: str, message: str) -> str:
    return f"::{kind} title={escape_property(title)}::{escape_data(message)}"


def _skipped_policies(report: Report) -> list[str]:
    """Policy files discovery did not trust (policy.py): a planted file is worth a line in the summary."""
    skipped = (report.policy or {}).get("skipped") or []
    return [f"> ⚠️ policy file {md(s['path'])} ignored: {md(s['reason'])}" for s in skipped] + ([""] if skipped else [])


def annotations(report: Report) -> list[str]:
    """One workflow command per fail/error (`::error`) and warn (`::warning`) finding, capped per kind."""
    out = []
    for kind, statuses in (("error", (Status.ERROR, Status.FAIL)), ("warning", (Status.WARN,))):
        found = [(c, f) for c in report.checks for f in c.findings if f.status in statuses]
        shown = found if len(found) <= ANNOTATIONS_PER_KIND else found[: ANNOTATIONS_PER_KIND - 1]
        for check, f in shown:
            body = f"{f.message}\nhint: {f.hint}" if f.hint else f.message
            out.append(_annotation(kind, f"gpudoctor {f.code} {f.subject} ({check.title})", body))
        if len(shown) < len(found):
            rest = len(found) - len(shown)
            out.append(
                _annotation(
                    kind,
                    f"gpudoctor: {rest} more {kind} finding(s)",
                    f"GitHub shows {ANNOTATIONS_PER_KIND} {kind} annotations per step: "
                    "the job summary and the report list all of them.",
                )
            )
    return out


def md(text: str) -> str:
    """Text inside a Markdown table cell: no HTML, no table breaks, no accidental formatting."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\`*_[]|":
        text = text.replace(ch, "\\" + ch)
    return CONTROL.sub("?", " ".join(text.split()))


def _finding_row(f: Finding) -> str:
    hint = md(f.hint) if f.hint and f.status != Status.PASS else ""
    code = "".join(c if c.isalnum() or c in "_.-" else "?" for c in f.code)  # (a peer's code is input too)
    return f"| {ICON[f.status]} {f.status.value} | `{code}` | {md(f.subject)} | {md(f.message)} | {hint} |"


def summary_markdown(report: Report) -> str:
    verdict = "NOT READY" if report.exit_code else "READY"
    counts = ", ".join(f"{n} {s}" for s, n in report.counts().items() if n)
    lines = [
        f"## {'❌' if report.exit_code else '✅'} gpudoctor {md(report.command)}: {verdict}",
        "",
        f"{md(report.source)} on {md(report.hostname or 'unknown host')}: {counts}; exit {report.exit_code} "
        f"(--fail-on {report.fail_on.value}), gpudoctor {md(report.gpudoctor_version)}"
        + (f", policy {md(report.policy['path'])}" if (report.policy or {}).get("path") else ""),
        "",
        *_skipped_policies(report),
        "| | check | result |",
        "|---|---|---|",
    ]
    for c in report.checks:
        problems = [f for f in c.findings if f.status.rank]
        if problems:
            detail = ", ".join(
                f"{n} {s.value}"
                for s in (Status.ERROR, Status.FAIL, Status.WARN)
                if (n := sum(1 for f in problems if f.status is s))
            )
        else:
            detail = md(next((f.message for f in c.findings), ""))
        lines.append(f"| {ICON[c.status]} | {md(c.title)} | {detail} |")
    problems = [f for f in report.findings if f.status.rank]
    if problems:
        lines += [
            "",
            "### Findings to act on",
            "",
            "| status | code | subject | finding | how to fix |",
            "|---|---|---|---|---|",
        ]
        lines += [_finding_row(f) for f in sorted(problems, key=lambda f: -f.status.rank)]
    text = "\n".join(lines) + "\n\n"
    if len(text.encode("utf-8", UNENCODABLE)) > SUMMARY_LIMIT:
        cut = text.encode("utf-8", UNENCODABLE)[: SUMMARY_LIMIT - 200].decode("utf-8", "ignore")
        text = cut.rsplit("\n", 1)[0] + "\n\n(cut at GitHub's 1 MiB summary limit: the report has the rest)\n\n"
    return text


def append_summary(text: str, path: str) -> None:
    """Append to the runner's summary file under the safe-output rules (OSError otherwise)."""
    with open_append(path) as out:
        out.write(text)


def publish(report: Report, environ: Mapping[str, str], err: IO[str]) -> str | None:
    """Annotations on `err`, the summary appended; a one-line problem (None: all written)."""
    for line in annotations(report):
        err.write(line + "\n")
    err.flush()
    path = environ.get("GITHUB_STEP_SUMMARY", "")
    if not path:
        return None  # outside a runner (--github by hand): annotations only
    try:
        append_summary(summary_markdown(report), path)
    except OSError as exc:
        return summary_problem(path, exc)
    return None


def summary_problem(path: str, exc: OSError) -> str:
    reason = "is a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
    return f"cannot append the GitHub step summary to {path}: {reason}"
