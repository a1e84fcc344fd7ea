"""Findings, check results and the report: what checks produce and renderers read."""

from __future__ import annotations

from dataclasses import field
from enum import Enum
from typing import Any

from gpudoctor.records import MutableRecord, Record, mutable_record, record

# Bumped by a change that breaks a reader of the report JSON (CHANGELOG.md lists each version);
# fields added for new readers (facts, measurements, policy in 0.2) keep it.
REPORT_SCHEMA_VERSION = 1


class Status(str, Enum):
    PASS = "pass"
    SKIP = "skip"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"  # the check itself could not run; gates like a failure

    @property
    def rank(self) -> int:
        return _RANK[self]


# Gating rank (--fail-on): an error gates like a failure, since nothing was proven.
_RANK = {Status.PASS: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 2}
# Display severity: which status a check shows when its findings differ.
_SEVERITY = {Status.PASS: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 3}


@record
class Finding(Record):
    code: str  # "GD401"
    status: Status
    subject: str  # "host", "gpu:3", "pair:0-4", "rank:2", "node:host-a"
    message: str  # one line, says what is wrong or right
    hint: str = ""  # how to fix it; empty on a pass
    evidence: dict[str, Any] = field(default_factory=dict)  # readings + expected values

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "status": self.status.value,
            "subject": self.subject,
            "message": self.message,
            "hint": self.hint,
            "evidence": self.evidence,
        }


def gpu_subject(index: int) -> str:
    return f"gpu:{index}"


def pair_subject(a: int, b: int) -> str:
    return f"pair:{min(a, b)}-{max(a, b)}"


@mutable_record
class CheckResult(MutableRecord):
    name: str  # the check's name, e.g. "topology"
    title: str
    findings: list[Finding]
    duration_s: float
    details: dict[str, Any] = field(default_factory=dict)  # tables to show, e.g. the topo matrix

    @property
    def status(self) -> Status:
        """The worst finding; a check whose findings are all skips is skipped."""
        counted = [f.status for f in self.findings if f.status != Status.SKIP]
        if not counted:
            return Status.SKIP if self.findings else Status.PASS
        return max(counted, key=_SEVERITY.__getitem__)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status.value,
            "duration_s": round(self.duration_s, 4),
            "findings": [f.to_json() for f in self.findings],
            "details": self.details,
        }


@mutable_record
class Report(MutableRecord):
    command: str  # "check"
    source: str  # "live" or the snapshot path
    created: str
    gpudoctor_version: str
    hostname: str
    checks: list[CheckResult]
    fail_on: Status = Status.FAIL
    nodes: list[dict[str, Any]] = field(default_factory=list)  # one row per node (multi-node)
    # What a later comparison needs (facts.py): the machine's facts and the run's measurements.
    facts: dict[str, Any] | None = None
    measurements: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] | None = None  # the policy file used and what it set (policy.py)

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.checks for f in c.findings]

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Status}
        for f in self.findings:
            out[f.status.value] += 1
        return out

    @property
    def exit_code(self) -> int:
        threshold = self.fail_on.rank
        return 1 if any(f.status.rank >= threshold for f in self.findings) else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "command": self.command,
            "source": self.source,
            "created": self.created,
            "gpudoctor_version": self.gpudoctor_version,
            "hostname": self.hostname,
            "fail_on": self.fail_on.value,
            "exit_code": self.exit_code,
            "summary": self.counts(),
            "checks": [c.to_json() for c in self.checks],
            "nodes": self.nodes,
            "policy": self.policy,
            "facts": self.facts,
            "measurements": self.measurements,
        }
