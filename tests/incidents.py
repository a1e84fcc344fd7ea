"""The incident corpus (tests/reference/incidents/): real failure reports, and what gpudoctor says of them.

Each incident folder holds the thread's quoted readings and cause (source.md), a snapshot holding only what
the thread shows (snapshot.json) and the verdict the cause calls for (expected.json: code, subject, status
and a word the hint must carry; `healthy: true` for a false-alarm probe; `check_args` for options such as
--expect-gpus; `blind_spot` where the snapshot cannot express what the thread shows). A match names the
cause at the right subject and severity with an actionable hint; a healthy probe matches when nothing
fails (warnings allowed).

    python -m tests.incidents          # the table: incident, cause, expected, got, match; then the totals
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tests.paths import REFERENCE

CORPUS = REFERENCE / "incidents"

# check_args -> run_checks keywords (only the options the corpus uses).
_ARGS = {"--expect-gpus": ("expect_gpus", int), "--allow-mig": ("allow_mig", None)}


@dataclass(frozen=True)
class Incident:
    id: str
    folder: Path
    expected: dict[str, Any]

    @property
    def healthy(self) -> bool:
        return bool(self.expected.get("healthy"))

    @property
    def cause(self) -> str:
        for line in (self.folder / "source.md").read_text(encoding="utf-8").splitlines():
            if line.startswith("- **Cause class:**"):
                return line.split(":**", 1)[1].strip()
        return "healthy" if self.healthy else "?"

    def kwargs(self) -> dict[str, Any]:
        args = list(self.expected.get("check_args", []))
        out: dict[str, Any] = {}
        while args:
            flag = args.pop(0)
            name, kind = _ARGS[flag]
            out[name] = kind(args.pop(0)) if kind else True
        return out


def incidents() -> list[Incident]:
    return [
        Incident(d.name, d, json.loads((d / "expected.json").read_text(encoding="utf-8")))
        for d in sorted(CORPUS.iterdir())
        if d.is_dir() and (d / "expected.json").exists()
    ]


@cache
def findings(incident_id: str) -> tuple[tuple[str, str, str, str, str], ...]:
    """The warn/fail/error findings gpudoctor's static checks give the incident's snapshot:
    (code, subject, status, message, hint)."""
    from gpudoctor.api import run_checks

    incident = next(i for i in incidents() if i.id == incident_id)
    report = run_checks(snapshot=incident.folder / "snapshot.json", use_config=False, **incident.kwargs())
    return tuple(
        (f.code, f.subject, f.status.value, f.message, f.hint)
        for f in report.findings
        if f.status.value in ("warn", "fail", "error")
    )


def judge(incident: Incident) -> str:
    """ "yes" (the cause named at the right subject and severity, the hint carrying the expected word),
    "partial" (the code at another subject or severity, or without that hint), or "no"."""
    got = findings(incident.id)
    if incident.healthy:
        return "yes" if not any(status in ("fail", "error") for _, _, status, _, _ in got) else "no"
    e = incident.expected
    same = [f for f in got if f[0] == e["code"]]
    if not same:
        return "no"
    word = e.get("hint_contains", "").lower()
    for _code, subject, status, message, hint in same:
        if subject == e["subject"] and status == e["status"] and hint and word in f"{message} {hint}".lower():
            return "yes"
    return "partial"


def table() -> list[str]:
    rows = [f"{'incident':<58} {'cause':<42} {'expected':<24} {'match':<8} got"]
    counts: dict[str, int] = {}
    for incident in incidents():
        e = incident.expected
        want = "healthy" if incident.healthy else f"{e['code']} {e['subject']} {e['status']}"
        match = judge(incident)
        kind = "probe" if incident.healthy else "incident"
        counts[f"{kind} {match}"] = counts.get(f"{kind} {match}", 0) + 1
        if incident.expected.get("blind_spot"):
            match += " (blind spot)"
        got = ", ".join(f"{c} {s} {st}" for c, s, st, _, _ in findings(incident.id) if c != "GD002") or "nothing"
        rows.append(f"{incident.id:<58} {incident.cause[:42]:<42} {want:<24} {match:<8} {got[:160]}")
    causes = {i.cause for i in incidents() if not i.healthy}
    rows.append("")
    rows.append(
        f"{sum(1 for i in incidents() if not i.healthy)} incidents in {len(causes)} cause classes; "
        + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    )
    return rows


if __name__ == "__main__":
    print("\n".join(table()))
