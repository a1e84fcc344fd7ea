"""`--prometheus FILE`: the report as metrics in node_exporter's textfile-collector format.

Point FILE into the directory node_exporter reads (`--collector.textfile.directory`, files named
`*.prom`); the fleet's existing Prometheus and alert rules then see gpudoctor without a new
service. The file is replaced whole (safe_io: a temporary file beside it, renamed), as the
collector's documentation asks, and the temporary name does not end in `.prom`, so a half-written
file is never read. Names follow Prometheus' conventions: a `gpudoctor_` prefix, base units
(seconds, bytes, bytes per second: gpudoctor's GB/s are 1e9 bytes/s, as nccl-tests counts them),
`_info` series of value 1 carrying labels, no sample timestamps (the textfile collector refuses
them; `gpudoctor_last_run_timestamp_seconds` says when instead). tests/reference/prometheus.md
has the sources.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpudoctor.findings import Report, Status
from gpudoctor.safety.safe_io import write_text

GB = 1e9  # nccl-tests' GB/s: algbw = bytes / 1e9 / seconds


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


class Metrics:
    """Families in the order added; each family's samples kept together, as the format requires."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, list[str]]] = {}

    def add(self, metric: str, help_text: str, value: float, /, **labels: Any) -> None:
        # Positional-only: a label may be called "name" (the GPU's model).
        name = f"gpudoctor_{metric}"
        if name not in self.families:
            self.families[name] = (help_text, [])
        rendered = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        self.families[name][1].append(
            f"{name}{{{rendered}}} {_number(value)}" if rendered else f"{name} {_number(value)}"
        )

    def text(self) -> str:
        out = []
        for name, (help_text, samples) in self.families.items():
            out.append(f"# HELP {name} {_help(help_text)}")
            out.append(f"# TYPE {name} gauge")
            out.extend(samples)
        return "\n".join(out) + "\n"


def report_metrics(report: Report, now: float | None = None) -> str:
    m = Metrics()
    m.add(
        "last_run_timestamp_seconds",
        "When gpudoctor wrote this report (Unix time).",
        time.time() if now is None else now,
    )
    m.add("ready", "1 when no finding is at or above --fail-on (exit code 0).", 0 if report.exit_code else 1)
    m.add("exit_code", "The exit code of the run: 0 ready, 1 a finding at or above --fail-on.", report.exit_code)
    m.add(
        "info",
        "gpudoctor's version, the command, its --fail-on and the policy file used.",
        1,
        version=report.gpudoctor_version,
        command=report.command,
        fail_on=report.fail_on.value,
        policy=(report.policy or {}).get("path") or "",
    )
    m.add("run_duration_seconds", "Time the checks took, summed.", round(sum(c.duration_s for c in report.checks), 6))
    counts = report.counts()
    for status in Status:
        m.add("findings", "Findings of the run, by status.", counts[status.value], status=status.value)
    for check in report.checks:
        for status in Status:
            m.add(
                "check_status",
                "Each check's status: 1 on the series of its current status, 0 on the others.",
                1 if check.status is status else 0,
                check=check.name,
                status=status.value,
            )
    worst: dict[tuple[str, str], int] = {}
    for f in report.findings:
        if f.status.rank:
            worst[(f.code, f.status.value)] = worst.get((f.code, f.status.value), 0) + 1
    for (code, status), n in sorted(worst.items()):
        m.add(
            "problem_findings", "Warn, fail and error findings by code (alert on these).", n, code=code, status=status
        )
    _facts(m, report.facts)
    _measurements(m, report.measurements)
    return m.text()


def _facts(m: Metrics, facts: dict[str, Any] | None) -> None:
    if not facts:
        return
    m.add(
        "driver_info",
        "The NVIDIA driver and the CUDA version it supports.",
        1,
        driver_version=facts.get("driver_version") or "",
        cuda_driver_version=facts.get("cuda_driver_version") or "",
    )
    gpus = facts.get("gpus", [])
    m.add("gpus", "GPUs NVML sees on this machine.", len(gpus))
    for g in gpus:
        ids = {"gpu": g["index"], "uuid": g["uuid"]}
        m.add(
            "gpu_info",
            "One series per GPU: its model, PCI bus id and VBIOS.",
            1,
            **ids,
            name=g["name"],
            pci_bus_id=g["pci_bus_id"],
            vbios=g.get("vbios") or "",
        )
        for key, name, help_text, scale in (
            ("memory_total_mib", "gpu_memory_total_bytes", "GPU memory size in bytes.", 1 << 20),
            ("nvlinks_active", "gpu_nvlinks_active", "Active NVLinks of the GPU.", 1),
            ("pcie_gen_max", "gpu_pcie_link_gen_max", "Highest PCIe generation of GPU and slot.", 1),
            ("pcie_width_max", "gpu_pcie_link_width_max", "Widest PCIe link of GPU and slot, in lanes.", 1),
            ("pcie_width_current", "gpu_pcie_link_width", "PCIe link width read at idle, in lanes.", 1),
        ):
            if g.get(key) is not None:
                m.add(name, help_text, g[key] * scale, **ids)


def _measurements(m: Metrics, measured: dict[str, Any]) -> None:
    ar = measured.get("allreduce")
    if ar:
        labels = {"backend": ar.get("backend") or "", "ranks": ar.get("ranks") or 0}
        for s in ar["sizes"]:
            m.add(
                "allreduce_busbw_bytes_per_second",
                "All-reduce bus bandwidth per message size (nccl-tests' busbw).",
                s["busbw_gbps"] * GB,
                size_bytes=s["bytes"],
                **labels,
            )
        m.add(
            "allreduce_best_busbw_bytes_per_second",
            "The best all-reduce bus bandwidth of the sweep.",
            ar["best_busbw_gbps"] * GB,
            **labels,
        )
        if ar.get("expected_busbw_gbps") is not None:
            m.add(
                "allreduce_expected_busbw_bytes_per_second",
                "The bus bandwidth this machine's links should reach (the GD601 expectation).",
                ar["expected_busbw_gbps"] * GB,
                **labels,
            )
    ddp = measured.get("ddp")
    if ddp:
        m.add("ddp_step_seconds", "DDP sanity run: the slowest rank's mean step time.", ddp["step_s"])
    for pair, p in sorted((measured.get("p2p") or {}).items()):
        m.add(
            "p2p_copy_bytes_per_second",
            "Timed peer-to-peer copy bandwidth per GPU pair.",
            p["p2p_gbps"] * GB,
            pair=pair,
        )


def write_prometheus(report: Report, path: str | Path) -> None:
    write_text(path, report_metrics(report))
