"""The JSON document of `gpudoctor bench ... --json`, validated: the report schema for the whole,
gpudoctor/schemas/bench.schema.json for its `results`."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from gpudoctor.schemas import report_schema
from tests.paths import shipped_schema

BENCH_SCHEMA = shipped_schema("bench")


def bench_doc(out: str) -> dict[str, Any]:
    doc = json.loads(out)
    jsonschema.validate(doc, report_schema())
    jsonschema.validate(doc["results"], BENCH_SCHEMA)
    return doc
