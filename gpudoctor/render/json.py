"""JSON output: one document per run, validated against the shipped schema in tests."""

from __future__ import annotations

import json
from typing import Any

from gpudoctor.findings import Report


def report_document(report: Report) -> dict[str, Any]:
    return report.to_json()


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, default=str) + "\n"
