"""Picking findings out of what a check function returned, for the check-level tests."""

from __future__ import annotations

from gpudoctor.findings import Finding, Status


def by_code(findings: list[Finding], code: str) -> list[Finding]:
    """The findings with code `code`, in order."""
    return [f for f in findings if f.code == code]


def verdicts(findings: list[Finding]) -> list[tuple[str, str, str]]:
    """(code, status, subject) of each finding, in order: what a verdict test compares."""
    return [(f.code, f.status.value, f.subject) for f in findings]


def not_ok(findings: list[Finding]) -> list[tuple[str, str, Status]]:
    """(code, subject, status) of each finding that is neither a pass nor a skip, in order."""
    return [(f.code, f.subject, f.status) for f in findings if f.status not in (Status.PASS, Status.SKIP)]


def judged(findings: list[Finding]) -> list[tuple[str, Status, str]]:
    """(code, status, subject) of each finding that is not a pass, in order."""
    return [(f.code, f.status, f.subject) for f in findings if f.status is not Status.PASS]
