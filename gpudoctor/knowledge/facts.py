"""What a report records so that two runs can be compared: machine facts and measurements.

`facts` (from the snapshot): the GPUs NVML sees with their identity, firmware and links, whether
NVML could still talk to each (`lost`, `unreachable`: a GPU that fell off the bus has no name, no
UUID and no links to compare), their settings (power limit, ECC, MIG, compute and persistence
modes) and the GPU memory already in use, the driver, and the NCCL_* / TORCH_NCCL_* environment.
`measurements` (from the active checks): the all-reduce sweep with its expectation, the DDP step
time, the P2P copy bandwidth per pair. Both are plain JSON, written into every `check` report
(report.schema.json, `facts` and `measurements`), read back by `--baseline` and `diff`
(gpudoctor/compare/) and by the Prometheus renderer.

A report written before these blocks existed (gpudoctor 0.1.0) has no `facts`; its measurements
are recovered from the check details it does hold (`measurements_from_checks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudoctor.snapshot import Gpu, Snapshot, known

if TYPE_CHECKING:
    from gpudoctor.launch import LaunchResult


def _value(v: Any) -> Any:
    return v if known(v) else None


def gpu_facts(gpu: Gpu) -> dict[str, Any]:
    links = gpu.nvlinks if known(gpu.nvlinks) else None
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "pci_bus_id": gpu.pci_bus_id,
        "memory_total_mib": _value(gpu.memory_total_mib),
        "vbios": _value(gpu.vbios),
        "inforom_image": _value(gpu.inforom_image),
        "gsp_firmware": _value(gpu.gsp_firmware),
        "nvlinks_active": None if links is None else sum(1 for link in links if link.active),
        "pcie_gen_max": _value(gpu.pcie_gen_max),
        "pcie_width_max": _value(gpu.pcie_width_max),
        "pcie_width_current": _value(gpu.pcie_width_current),
        "lost": gpu.lost,  # NVML answered GPU_IS_LOST (GD827)
        "unreachable": _value(gpu.unreachable),  # why NVML gave no handle (None: it gave one)
        # Settings a maintenance or another node may change (GD017), and memory already taken (GD018);
        # a report written before gpudoctor 0.3 lacks them and the comparison (compare/) passes them over.
        "power_limit_w": _value(gpu.power_limit_w),
        "ecc_mode": _value(gpu.ecc_mode_current),
        "ecc_mode_pending": _value(gpu.ecc_mode_pending),
        "mig_mode": _value(gpu.mig_mode_current),
        "mig_mode_pending": _value(gpu.mig_mode_pending),
        "compute_mode": _value(gpu.compute_mode),
        "persistence_mode": _value(gpu.persistence_mode),
        "memory_used_mib": _value(gpu.memory_used_mib),
    }


# Environment variables that change what NCCL does (GD019): NCCL's own and torch's ProcessGroupNCCL
# switches. The snapshot holds them already (its allow-list: tests/reference/nccl_env_variables.md).
NCCL_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")


def nccl_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(NCCL_ENV_PREFIXES)}


def facts_from_snapshot(snapshot: Snapshot) -> dict[str, Any]:
    """Every GPU NVML sees (visibility aside: the hardware), and the driver stack."""
    return {
        "hostname": snapshot.host.hostname,
        "nvml_status": snapshot.driver.nvml_status,
        "driver_version": _value(snapshot.driver.driver_version),
        "cuda_driver_version": _value(snapshot.driver.cuda_driver_version),
        "gpus": [gpu_facts(g) for g in sorted(snapshot.gpus, key=lambda g: g.index)],
        "nccl_env": nccl_env(snapshot.env),
    }


# ---------------------------------------------------------------------------------------------
# Measurements, from a report's checks (JSON), so old reports read the same way as new ones


# A saved report is read back from a file a user may have edited: these helpers skip what is not
# the shape gpudoctor writes (compare/sides.py then holds the result to the report schema).


def dicts(value: Any) -> list[dict[str, Any]]:
    """The objects of a JSON list read from a file anyone may have written; nothing else, whatever its shape."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _check(checks: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((c for c in dicts(checks) if c.get("name") == name), None)


def _findings(checks: list[dict[str, Any]], code: str) -> list[dict[str, Any]]:
    return [f for c in dicts(checks) for f in dicts(c.get("findings")) if f.get("code") == code]


def _number(v: Any) -> float | None:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    try:
        return float(v)
    except OverflowError:  # an integer no float holds
        return None


def allreduce_measurement(checks: list[dict[str, Any]]) -> dict[str, Any] | None:
    check = _check(checks, "allreduce")
    sweep = _dict(_dict((check or {}).get("details")).get("sweep"))
    sizes = [
        {"bytes": int(r["bytes"]), "busbw_gbps": float(r["busbw_gbps"]), "algbw_gbps": float(r["algbw_gbps"])}
        for r in dicts(sweep.get("rows"))
        if all(_number(r.get(k)) is not None for k in ("bytes", "busbw_gbps", "algbw_gbps"))
    ]
    if not sizes:
        return None
    out: dict[str, Any] = {
        "device": sweep.get("device"),
        "backend": sweep.get("backend"),
        "ranks": sweep.get("world_size"),
        "dtype": sweep.get("dtype"),
        "sizes": sizes,
        "best_busbw_gbps": max(s["busbw_gbps"] for s in sizes),
    }
    verdict = next((f for f in _findings(checks, "GD601") if f.get("status") != "skip"), None)
    evidence = _dict((verdict or {}).get("evidence"))
    if _number(evidence.get("expected_busbw_gbps")) is not None:
        out["expected_busbw_gbps"] = float(evidence["expected_busbw_gbps"])
    if isinstance(evidence.get("nodes"), int):
        out["nodes"] = evidence["nodes"]
    return out


def ddp_measurement(checks: list[dict[str, Any]], run: LaunchResult | None = None) -> dict[str, Any] | None:
    """The DDP sanity run's mean step time per rank; the slowest rank is the run's step time."""
    per_rank: dict[int, float] = {}
    backend = None
    if run is not None:
        backend = run.backend
        for r in run.ranks:
            ddp = r.result("ddp")
            step = ddp.get("step_s_mean") if ddp else None
            if _number(step) is not None:
                per_rank[r.rank] = float(step)
    else:  # a report without `measurements`: the rank table it printed ("step ms" column)
        details = _dict((_check(checks, "ddp") or {}).get("details"))
        backend = _dict(details.get("launch")).get("backend")
        for table in dicts(details.get("tables")):
            columns = table.get("columns")
            if not isinstance(columns, list) or "rank" not in columns or "step ms" not in columns:
                continue
            at_rank, at_step = columns.index("rank"), columns.index("step ms")
            rows = table.get("rows")
            for row in rows if isinstance(rows, list) else []:
                try:
                    per_rank[int(row[at_rank])] = float(row[at_step]) / 1000
                except (ValueError, TypeError, IndexError, KeyError, OverflowError):
                    continue
    if not per_rank:
        return None
    return {
        "backend": backend,
        "ranks": len(per_rank),
        "step_s": max(per_rank.values()),
        "step_s_per_rank": {str(k): round(v, 6) for k, v in sorted(per_rank.items())},
    }


def p2p_measurement(checks: list[dict[str, Any]]) -> dict[str, Any] | None:
    out = {}
    for f in _findings(checks, "GD421"):
        evidence = _dict(f.get("evidence"))
        subject = str(f.get("subject", ""))
        if subject.startswith("pair:") and _number(evidence.get("p2p_gbps")) is not None:
            out[subject.removeprefix("pair:")] = {
                "p2p_gbps": float(evidence["p2p_gbps"]),
                "staged_gbps": _number(evidence.get("staged_gbps")),
                "path": evidence.get("path"),
            }
    return out or None


def measurements_from_checks(checks: list[dict[str, Any]], run: LaunchResult | None = None) -> dict[str, Any]:
    """The measurements in a report's checks (as JSON); `run` gives the DDP step times directly."""
    out = {}
    for name, value in (
        ("allreduce", allreduce_measurement(checks)),
        ("ddp", ddp_measurement(checks, run)),
        ("p2p", p2p_measurement(checks)),
    ):
        if value is not None:
            out[name] = value
    return out
