"""The JSON schemas gpudoctor ships (report, bench, watch summary), and the one reader of them."""

from __future__ import annotations

import json
from typing import Any


def report_schema() -> dict[str, Any]:
    from importlib import resources  # lazy: only the tests and tools read the schema

    text = resources.files("gpudoctor.schemas").joinpath("report.schema.json").read_text("utf-8")
    return json.loads(text)
