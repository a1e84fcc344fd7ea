"""GD834 (GPU health, heuristic): an idle GPU much hotter than its idle peers of the same model, the
sign of a cooling fault."""

from __future__ import annotations

from gpudoctor.checks.lost_gpus import readable
from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge import clock_reasons
from gpudoctor.snapshot import Gpu, known

HOT_IDLE = Code(
    "GD834",
    "idle-gpu-hot",
    "Idle GPUs are not much hotter than their idle peers (heuristic)",
    what="Compares the temperature of each idle GPU (clock event reason 'GPU idle' set) with the median of "
    "the other idle GPUs of the same model. A GPU at least 25 C hotter than that median and at 60 C or "
    "more warns. These thresholds are gpudoctor's heuristic, not an NVIDIA figure: GPUs of one chassis idle "
    "within a few degrees of each other (28-37 C in the recorded H100, A100 and RTX 40 readings), so a "
    "gap of 25 C at idle is far outside airflow differences between slots.",
    why="A GPU that is hot while doing nothing has a cooling fault: a failed fan, blocked airflow, a heat "
    "sink or thermal interface that came loose. Under load it reaches its slowdown temperature first and "
    "throttles (GD815), and every step of a data-parallel job waits for it.",
    fix="Check the GPU's cooling: fans (`nvidia-smi -q -d TEMPERATURE,FAN`), the chassis airflow and inlet "
    "temperature, blanking panels, the heat sink and its thermal material (DCGM: 'Verify that the cooling "
    "on this machine is functional'). Run `gpudoctor watch` under load to see whether it throttles.",
)


# Heuristic thresholds (no NVIDIA figure exists for idle temperature spread): GPUs of one chassis idle
# within a few degrees (28-37 C across the recorded fixtures; tests/reference/
# ecc_mode_and_idle_temperature.md), so 25 C above the idle peers' median,
# and warm in absolute terms, is a cooling fault rather than a slot's airflow.
HOT_IDLE_GAP_C = 25
HOT_IDLE_MIN_C = 60


def _idle(gpu: Gpu) -> bool:
    reasons = gpu.clock_event_reasons
    return known(reasons) and bool(reasons & clock_reasons.GPU_IDLE) and known(gpu.temperature_c)


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@check("idle_temperature", "Idle GPUs not much hotter than their peers (heuristic)", codes=[HOT_IDLE], needs="visible")
def idle_temperature(ctx: CheckContext) -> list[Finding]:
    models: dict[str, list[Gpu]] = {}
    for g in readable(target_gpus(ctx)):
        if _idle(g):
            models.setdefault(g.name, []).append(g)
    out, judged = [], []
    for group in models.values():
        if len(group) < 2:
            continue
        judged += group
        for g in group:
            peers = [int(p.temperature_c) for p in group if p is not g]
            reference = _median(peers)
            temp = int(g.temperature_c)
            if temp - reference < HOT_IDLE_GAP_C or temp < HOT_IDLE_MIN_C:
                continue
            evidence = {
                "temperature_c": temp,
                "peers_median_c": reference,
                "peers": {str(p.index): p.temperature_c for p in group if p is not g},
                "threshold": f"{HOT_IDLE_GAP_C} C above the idle peers' median and at least {HOT_IDLE_MIN_C} C",
                "heuristic": True,
            }
            out.append(
                Finding(
                    HOT_IDLE.code,
                    Status.WARN,
                    gpu_subject(g.index),
                    f"GPU {g.index} is at {temp} C while idle, its idle peers at {reference:g} C (median): a "
                    "cooling fault (fan, airflow, heat sink) that will throttle it under load (heuristic)",
                    "Check the GPU's fans and airflow (nvidia-smi -q -d TEMPERATURE,FAN), then its heat sink.",
                    evidence,
                )
            )
    if out or not judged:
        return out
    temps = [int(g.temperature_c) for g in judged]
    message = f"{len(judged)} idle GPUs at {min(temps)}-{max(temps)} C: none much hotter than its peers"
    return [Finding(HOT_IDLE.code, Status.PASS, "host", message, "", {"gpus": sorted(g.index for g in judged)})]
