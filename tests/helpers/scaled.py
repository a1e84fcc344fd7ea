"""A recorded node grown to N GPUs, for tests and benchmarks of cost in the input's size."""

from __future__ import annotations

import copy
from typing import Any


def scaled_node(base: dict[str, Any], n: int) -> dict[str, Any]:
    """`base` (a snapshot's JSON) with `n` GPUs: GPU i copies GPU i % len(base's GPUs) with its own
    index, uuid, bus id and NUMA half, and every pair listed (as the probe records them: N(N-1)/2
    pairs, each with the first recorded pair's levels)."""
    doc = copy.deepcopy(base)
    gpus = []
    for i in range(n):
        g = copy.deepcopy(base["gpus"][i % len(base["gpus"])])
        g["index"] = i
        g["uuid"] = f"GPU-{i:08x}-0001-1eef-9919-00009e3779b1"
        g["pci_bus_id"] = f"{i // 256:08X}:{i % 256:02X}:00.0"
        g["numa_node"] = 0 if i < n // 2 else 1
        gpus.append(g)
    doc["gpus"] = gpus
    level = base["pairs"][0]
    doc["pairs"] = [{**level, "a": a, "b": b} for a in range(n) for b in range(a + 1, n)]
    return doc
