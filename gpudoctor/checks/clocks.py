"""GD815 (GPU health): GPU clocks held down now by heat, power or hardware slowdown, read from NVML's
clock event (throttle) reasons (knowledge/clock_reasons.py)."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from gpudoctor.checks.targets import target_gpus
from gpudoctor.checks.unread import Reading, coverage, not_supported_finding, unreadable_findings
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge import clock_reasons
from gpudoctor.snapshot import Gpu, known

THROTTLED = Code(
    "GD815",
    "clocks-throttled",
    "Clocks are not held down by heat, power or hardware slowdown",
    what="Reads the clock event (throttle) reasons NVML reports now (nvmlDeviceGetCurrentClocksEventReasons), "
    "ignoring 'GPU idle', application clock settings, sync boost and display clocks. Hardware "
    "slowdown, hardware thermal slowdown and power-brake fail; software thermal slowdown and the "
    "software power cap warn.",
    why="A throttled GPU runs slower than its peers, and in a data-parallel job every step waits for "
    "the slowest GPU. Hardware slowdown (often a power supply or cooling fault) halves clocks or worse.",
    fix="Check cooling (`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`), airflow and fan speed; for power "
    "brake or hardware slowdown check the PSUs and power cabling; for the software power cap check "
    "`nvidia-smi -q -d POWER` for a lowered power limit (`sudo nvidia-smi -pl <watts>`).",
)


def _throttle_finding(gpu: Gpu) -> Finding | None:
    mask = gpu.clock_event_reasons
    if not known(mask):
        return None
    active = clock_reasons.slowdowns(mask)
    if not active:
        return None
    status = Status.FAIL if any(r.severe for r in active) else Status.WARN
    names = [r.label for r in active]
    kinds = {r.kind for r in active}
    evidence: dict[str, Any] = {"clock_event_reasons": f"0x{mask:x}", "active": names, "expected": "none"}
    if known(gpu.temperature_c):
        evidence["temperature_c"] = gpu.temperature_c
    if known(gpu.power_draw_w):
        evidence["power_draw_w"] = gpu.power_draw_w
    if known(gpu.power_limit_w):
        evidence["power_limit_w"] = gpu.power_limit_w
    if clock_reasons.THERMAL in kinds:
        hint = "Check cooling: fans, airflow, inlet temperature (`nvidia-smi -q -d TEMPERATURE`)."
    elif clock_reasons.HARDWARE in kinds or any(r.severe for r in active):
        hint = "Check the power supplies and cabling and `nvidia-smi -q -d PERFORMANCE`; reboot; then the vendor."
    else:
        hint = "Check the power limit (`nvidia-smi -q -d POWER`); raise it with `sudo nvidia-smi -pl <watts>`."
    return Finding(
        THROTTLED.code, status, gpu_subject(gpu.index), f"clocks throttled now: {', '.join(names)}", hint, evidence
    )


# Clock event reasons: nvml.h documents them for every fully supported GPU. NOT_SUPPORTED from both
# the new and the old call name (probe/gpus.py tries both) is read as this GPU/driver not reporting
# them: a skip, not a warning.
CLOCK_READING = Reading(THROTTLED.code, "clock event reasons", attrgetter("clock_event_reasons"))


@check("clocks", "GPU clocks not throttled", codes=[THROTTLED], needs="visible")
def clocks(ctx: CheckContext) -> list[Finding]:
    gpus = target_gpus(ctx)
    unknown = unreadable_findings(gpus, [CLOCK_READING])
    findings = [f for f in (_throttle_finding(g) for g in gpus) if f is not None]
    if findings:
        return unknown + findings
    cov = coverage(gpus, [CLOCK_READING])
    if cov.read:
        message = cov.passed("no throttling") + cov.not_supported_note()
        return [*unknown, Finding(THROTTLED.code, Status.PASS, "host", message, "", {"gpus": cov.read})]
    if cov.not_supported:
        return [*unknown, not_supported_finding(THROTTLED.code, "clock event reasons", cov.not_supported)]
    return unknown
