"""Is a JSON value the shape a schema describes? Enough of JSON Schema to check a saved report.

`--baseline` and `diff` read reports that users keep, edit and generate: before their `facts` and
`measurements` are compared, they are held to the same shipped schema (gpudoctor/schemas/
report.schema.json) the tests validate every report against, so the comparison only ever sees
the types it was written for. jsonschema is a test dependency, not a runtime one; this reads the
keywords that schema uses for those blocks (type, required, properties, additionalProperties,
items, minimum, oneOf, $ref) and refuses any other, so a schema edit cannot slip past it. The
tests hold it to jsonschema's verdicts.

A reader is lenient where the schema is closed: `"additionalProperties": false` is not enforced,
because a newer gpudoctor may add a field without bumping `schema_version` (CHANGELOG.md), and an
older one must still compare what it knows of that report. Keys it knows are held to their shape.

One rule beyond JSON Schema: a number must fit a double. JSON allows 1e400 or a 400-digit
integer; Python reads them (as inf, or as an int no float holds), and arithmetic on them then
fails or yields inf and NaN.
"""

from __future__ import annotations

import math
from typing import Any

from gpudoctor.errors import shown

_KEYWORDS = {
    "type",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "minimum",
    "oneOf",
    "$ref",
    "description",
}
_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def _fits_a_double(value: int | float) -> bool:
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def problem(value: Any, schema: dict[str, Any], root: dict[str, Any], where: str = "") -> str | None:
    """The first way `value` departs from `schema` ('at x.y: ...'), or None when it fits."""
    unknown = set(schema) - _KEYWORDS
    if unknown:
        raise ValueError(f"json_shape does not read the keyword(s) {sorted(unknown)} (at {where or 'top'})")
    at = where or "the top level"
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"json_shape reads only local $defs references, not {ref}")
        return problem(value, root["$defs"][ref.removeprefix("#/$defs/")], root, where)
    if "oneOf" in schema:
        fits = [s for s in schema["oneOf"] if problem(value, s, root, where) is None]
        if len(fits) != 1:
            first = problem(value, schema["oneOf"][-1], root, where)
            return first or f"{at}: {shown(value)} fits more than one of the allowed shapes"
        return None
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, k) for k in kinds):
            return f"{at}: expected {' or '.join(kinds)}, got {shown(value)}"
    if _is(value, "number"):
        if not _fits_a_double(value):
            return f"{at}: {shown(value)} is out of range"
        if "minimum" in schema and value < schema["minimum"]:
            return f"{at}: {shown(value)} is below {schema['minimum']}"
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                return f"{at}: '{key}' is missing"
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            inner = f"{where}.{key}" if where else str(key)
            if key in properties:
                found = problem(item, properties[key], root, inner)
            elif isinstance(extra, dict):
                found = problem(item, extra, root, inner)
            else:
                found = None
            if found:
                return found
    if isinstance(value, list) and "items" in schema:
        for n, item in enumerate(value):
            found = problem(item, schema["items"], root, f"{where}[{n}]")
            if found:
                return found
    return None
