"""NVSwitch fabric registration of a Hopper+ GPU (nvmlDeviceGetGpuFabricInfo(V))."""

from __future__ import annotations

from gpudoctor.probe.device import LOST, DeviceReader
from gpudoctor.probe.nvml import return_name
from gpudoctor.snapshot import FabricInfo, Missing

STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
HEALTH_SUMMARY = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}

# healthMask fields (2 bits each unless noted): value 1 means TRUE, 2 FALSE, 0 not supported.
_DEGRADED_BW_SHIFT = 0
_ROUTE_UNHEALTHY_SHIFT = 4
_TRUE = 1


def _mask_field(mask: int, shift: int) -> int:
    return (mask >> shift) & 0x3


def health_from_mask(mask: int) -> str | Missing:
    """The v2 struct has no summary: derive one the way the v3 summary reads."""
    if mask == 0:
        return Missing("unsupported", "the fabric reports no health fields")
    if _mask_field(mask, _ROUTE_UNHEALTHY_SHIFT) == _TRUE:
        return "unhealthy"
    if _mask_field(mask, _DEGRADED_BW_SHIFT) == _TRUE:
        return "limited_capacity"
    return "healthy"


def fabric(reader: DeviceReader) -> FabricInfo | Missing:
    if reader.lost:
        return LOST
    raw = reader.nvml.fabric_info(reader.handle)
    if isinstance(raw, Missing):
        if raw.reason == "gpu_lost":
            reader.lost = True
        return raw
    state = STATES.get(raw.get("state", -1), "unknown")
    status = return_name(raw.get("status", 0))
    health: str | Missing
    if "healthSummary" in raw and raw["healthSummary"] in HEALTH_SUMMARY:
        health = HEALTH_SUMMARY[raw["healthSummary"]]
    elif "healthMask" in raw:
        health = health_from_mask(raw["healthMask"])
    else:
        health = Missing("unsupported", "this driver reports no fabric health")
    return FabricInfo(state=state, status=status, health=health)
