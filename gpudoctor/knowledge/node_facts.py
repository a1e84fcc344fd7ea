"""One node's facts as rank 0 receives them in a multi-node run, judged and bounded like any input.

Each node's parent builds its facts from its own snapshot (knowledge/node_record.py, in
checks/active/node_task.py) and a rank of that node sends them to rank 0 (workloads/nodes.py).
`gpudoctor fleet` reads the same facts from saved files. The other node may run another gpudoctor
version, or be broken or hostile, so what arrives is held to the shape gpudoctor sends: a wrong
type used to crash the nodes check (GD001), a 200 MB blob was accepted, and a code this
gpudoctor does not know was forwarded as a finding. Now:

- a payload over MAX_PAYLOAD_BYTES is dropped by every rank alike before it is received
  (workloads/rank.py `all_gather_json`): it arrives as `{DROPPED: why}`;
- `clean_facts` keeps a node's facts only when every field has the shape and bounds below
  (texts of at most MAX_TEXT characters, lists of at most MAX_ITEMS, finite numbers, counts that
  are whole and not negative) and raises `Malformed` naming the first field that does not;
- forwarded findings must carry a code the caller knows and a status that is not a pass; the
  others are left out and said once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

MAX_PAYLOAD_BYTES = 1 << 20  # one rank's JSON in a gather (a node's facts are kilobytes: a heuristic bound)
DROPPED = "gpudoctor_dropped"  # the key of what a gather puts in place of a payload it refused
MAX_TEXT = 300
MAX_ITEMS = 256
MAX_FORWARDED = 40  # static findings a node sends to rank 0
FORWARDED_STATUSES = ("warn", "fail", "error")


class Malformed(ValueError):
    """A node's facts that do not have the shape gpudoctor sends: one line naming the field."""


Check = Callable[[Any, str], Any]


def text(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise Malformed(f"{where} is not a text of at most {MAX_TEXT} characters")
    return value


def number(value: Any, where: str) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Malformed(f"{where} is not a finite number")
    return value


def count(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise Malformed(f"{where} is not a whole number from 0 to 2^64")
    return value


def items(check: Check, limit: int = MAX_ITEMS) -> Check:
    def judged(value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > limit:
            raise Malformed(f"{where} is not a list of at most {limit} items")
        return [check(v, f"{where}[{i}]") for i, v in enumerate(value)]

    return judged


def mapping(check: Check, limit: int = MAX_ITEMS) -> Check:
    def judged(value: Any, where: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict) or len(value) > limit:
            raise Malformed(f"{where} is not an object of at most {limit} entries")
        return {text(k, f"{where} key"): check(v, f"{where}[{k!r}]") for k, v in value.items()}

    return judged


def record(fields: dict[str, Check]) -> Check:
    """An object with these fields (absent ones as None or empty; others left out)."""

    def judged(value: Any, where: str) -> dict[str, Any] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise Malformed(f"{where} is not an object")
        return {name: check(value.get(name), f"{where}.{name}" if where else name) for name, check in fields.items()}

    return judged


COUNTERS = mapping(mapping(count, 64))  # port key ("mlx5_0:1") -> counter -> value
PORT = record({"port": count, "state": text, "rate_gbps": number, "link_layer": text})
NIC = record({"name": text, "hca_type": text, "fw_ver": text, "ports": items(PORT, 64)})
CAPACITY = record(
    {
        "line_gbps": number,
        "ports": count,
        "port_rate_gbps": number,
        "link_layer": text,
        "expected_gbps": number,
        "basis": text,
    }
)
FINDING = record({"code": text, "status": text, "subject": text, "message": text})
FACTS = record(
    {
        "host": text,
        "driver": text,
        "cuda": text,
        "nccl": text,
        "torch": text,
        "gpus": items(text),
        "vbios": items(text),
        "nvlinks": items(count),
        "nics": items(NIC, 64),
        "mtu": mapping(count),
        "ethernet": items(text),
        "gpudirect": text,
        "capacity": CAPACITY,
        "counters": COUNTERS,
        "findings": items(FINDING, MAX_FORWARDED),
    }
)


def clean_facts(raw: Any, known_codes: Collection[str]) -> tuple[dict[str, Any], list[str]]:
    """A node's facts held to the shape gpudoctor sends (Malformed otherwise), and notes on the
    forwarded findings left out (a code this gpudoctor does not know, a pass or skip)."""
    if isinstance(raw, dict) and DROPPED in raw:
        raise Malformed(str(raw[DROPPED])[:MAX_TEXT])
    facts = FACTS(raw, "")
    if facts is None:
        raise Malformed("no facts object")
    capacity = facts["capacity"]
    if capacity is not None and not (capacity["expected_gbps"] or 0) > 0:
        raise Malformed("capacity.expected_gbps is not a positive number")
    kept = [
        {**f, "subject": f["subject"] or "host", "message": f["message"] or ""}
        for f in facts["findings"]
        if f is not None and f["code"] in known_codes and f["status"] in FORWARDED_STATUSES
    ]
    left = sorted({str(f["code"]) for f in facts["findings"] if f is None or f["code"] not in known_codes})
    facts["findings"] = kept
    return facts, [
        f"forwarded findings with codes this gpudoctor does not know left out: {', '.join(left)}"
    ] if left else []
