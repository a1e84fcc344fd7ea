"""The JSON document of `gpudoctor bench ... --json`, validated: the report schema for the whole,
gpudoctor/schemas/bench.schema.json for its `results`."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from tests.helpers.cli import report_validator
from tests.paths import shipped_schema

BENCH_SCHEMA = shipped_schema("bench")


def bench_doc(out: str) -> dict[str, Any]:
    doc = json.loads(out)
    report_validator().validate(doc)
    jsonschema.validate(doc["results"], BENCH_SCHEMA)
    return doc


def split_unflagged(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """`bench scaling` summary rows whose step split (input + compute + communication against the
    measured step) is off by more than 10 % with no GD726 saying so for that model. Within 10 % on an
    idle machine (benchmarks/scaling_overhead.py prints the figure); on a loaded one the other jobs'
    slices fall in the step but in none of its parts, and the report must then say the split is not
    reliable, never present it as if it were. What holds under any load is this: [] always."""
    flagged = {
        (f["message"].split(" on ", 1)[0], f["evidence"]["accounted"])
        for c in doc["checks"]
        for f in c["findings"]
        if f["code"] == "GD726"
    }
    return [
        s
        for s in doc["results"]["summary"]
        if not 0.9 <= s["accounted"] <= 1.1 and (s["model"], s["accounted"]) not in flagged
    ]
