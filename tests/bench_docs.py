"""The JSON document of `gpudoctor bench ... --json`, validated: the report schema for the whole,
gpudoctor/schemas/bench.schema.json for its `results`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from gpudoctor.render.json import report_schema

BENCH_SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "gpudoctor/schemas/bench.schema.json").read_text())


def bench_doc(out: str) -> dict[str, Any]:
    doc = json.loads(out)
    jsonschema.validate(doc, report_schema())
    jsonschema.validate(doc["results"], BENCH_SCHEMA)
    return doc
