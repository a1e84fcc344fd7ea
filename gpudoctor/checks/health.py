"""GD8 (GPU health): memory errors, XID errors in the kernel log, clocks throttled now."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpudoctor import clock_reasons
from gpudoctor.checks.targets import gpu_list, target_gpus
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.registry import CheckContext, Code, check
from gpudoctor.snapshot import Gpu, known
from gpudoctor.topology import normalize_bus_id
from gpudoctor.xid import classify, contained, describe

_RMA = "If it comes back after a reset, the GPU is failing: drain the node and contact the vendor (RMA)."

ECC_VOLATILE = Code(
    "GD801",
    "ecc-uncorrectable-volatile",
    "No uncorrectable ECC errors since the driver loaded",
    what="Reads the volatile (since the last driver load or GPU reset) count of uncorrectable ECC "
    "memory errors on each GPU the run uses.",
    why="An uncorrectable ECC error corrupts data in GPU memory; CUDA kills the context ('uncorrectable "
    "ECC error encountered') and in a multi-GPU job one rank dies while the others wait in NCCL "
    "until the watchdog timeout.",
    fix="Stop the jobs on the GPU, reset it (`sudo nvidia-smi -r -i <gpu>`) or reboot, then re-run gpudoctor. " + _RMA,
)
ECC_AGGREGATE = Code(
    "GD802",
    "ecc-uncorrectable-aggregate",
    "No uncorrectable ECC errors over the GPU's lifetime",
    what="Reads the aggregate (lifetime, kept in the GPU's InfoROM) count of uncorrectable ECC errors.",
    why="A GPU that has had uncorrectable errors before is more likely to have them again; with no "
    "volatile errors now it runs, but it is the first suspect when jobs on this node crash.",
    fix="Watch the count (`nvidia-smi -q -d ECC`). If it grows, or pages/rows keep being retired or "
    "remapped, drain the node and contact the vendor.",
)
RETIRED_PENDING = Code(
    "GD803",
    "retired-pages-pending",
    "No retired memory pages waiting for a reset",
    what="Reads whether the GPU has memory pages marked for retirement that take effect only after "
    "the next GPU reset or reboot (page retirement: Volta and older datacentre GPUs).",
    why="Until the reset the bad pages stay in use and can raise more ECC errors mid-run.",
    fix="Reset the GPU (`sudo nvidia-smi -r -i <gpu>`) or reboot when no job uses it. " + _RMA,
)
REMAP_PENDING = Code(
    "GD804",
    "row-remap-pending",
    "No memory row remapping waiting for a reset",
    what="Reads the row-remapping state (nvmlDeviceGetRemappedRows, Ampere and later): whether a remap is pending.",
    why="A pending remap means a memory row failed and the spare row is used only after a GPU reset; "
    "DCGM fails the GPU until then, and jobs may hit the bad row.",
    fix="Reset the GPU (`sudo nvidia-smi -r -i <gpu>`) or reboot when no job uses it, then re-run gpudoctor.",
)
REMAP_FAILED = Code(
    "GD805",
    "row-remap-failed",
    "Memory row remapping has not failed",
    what="Reads the row-remapping state (nvmlDeviceGetRemappedRows): whether a remap failed.",
    why="A failed remap means the GPU ran out of spare rows in a bank: the memory fault cannot be "
    "repaired and the GPU will keep producing uncorrectable errors.",
    fix="Take the GPU out of service and contact the vendor (RMA); a reset does not fix it.",
)
XID_HARDWARE = Code(
    "GD810",
    "xid-hardware",
    "No hardware XID errors in the kernel log",
    what="Reads NVIDIA XID errors ('NVRM: Xid (PCI:...): N') from the kernel log, where it is "
    "readable, and names the GPU by its PCI address. Hardware XIDs (Imbue's set: 48, 56-58, 62-64, "
    "68-77, 79-86, 88-89, 92, 94-105, 110-120, 122-125), e.g. 48 double-bit ECC, 64 row remap failure, "
    "74 NVLink, 79 fallen off the bus, 95 uncontained ECC, 119/120 GSP, fail the GPU. Two warn "
    "instead: 63 (a row remap or page retirement was recorded) and 94 (a contained ECC error), "
    "faults the driver has already handled. The kernel log covers the time since boot, so an event "
    "may predate a GPU reset that cleared it.",
    why="A GPU that logged a hardware XID since boot is likely to hang or crash the next job; in a "
    "multi-GPU run that shows up as an NCCL watchdog timeout on every rank, far from the cause.",
    fix="Look at `sudo dmesg -T | grep -i xid` and NVIDIA's XID catalogue for the code. Reset the GPU "
    "or reboot; if hardware XIDs return, drain the node and contact the vendor. For 63/94, check "
    "`nvidia-smi -q -d ROW_REMAPPER`: a pending remap needs a reset (GD804), a completed one needs "
    "nothing. When the log cannot be read (dmesg_restrict, containers without CAP_SYSLOG), run "
    "gpudoctor on the host as root.",
)
XID_APPLICATION = Code(
    "GD811",
    "xid-application",
    "No application XID errors in the kernel log",
    what="Reads application XIDs (13 graphics engine exception, 31 memory page fault, 43 GPU stopped "
    "processing, 45 preemptive cleanup) from the kernel log.",
    why="These come from programs (an illegal address, a killed process) rather than the hardware; "
    "they explain earlier crashes, and a stream of them on one GPU hints at a driver or hardware "
    "problem after all.",
    fix="Match the timestamps to your job's crashes and fix the program (run it once with "
    "CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer to find the kernel). If they appear without your "
    "code at fault, treat them as hardware XIDs.",
)
XID_OTHER = Code(
    "GD812",
    "xid-other",
    "No unclassified XID errors in the kernel log",
    what="Reports XIDs in the kernel log that are neither in the hardware set nor the known "
    "application set (e.g. 61, 109).",
    why="They may be harmless driver notices or the first sign of a fault; gpudoctor cannot tell.",
    fix="Look the code up in NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors) and act on it.",
)
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
CODES = [ECC_VOLATILE, ECC_AGGREGATE, RETIRED_PENDING, REMAP_PENDING, REMAP_FAILED]
XID_CODES = [XID_HARDWARE, XID_APPLICATION, XID_OTHER]


def _gpu_memory_errors(gpu: Gpu) -> list[Finding]:
    out: list[Finding] = []
    subject = gpu_subject(gpu.index)
    volatile = gpu.ecc_uncorrected_volatile
    aggregate = gpu.ecc_uncorrected_aggregate
    if known(volatile) and volatile > 0:
        out.append(
            Finding(
                ECC_VOLATILE.code,
                Status.FAIL,
                subject,
                f"{volatile} uncorrectable ECC error(s) since the driver loaded",
                "Reset the GPU or reboot; if errors return, drain the node (RMA).",
                {"ecc_uncorrected_volatile": volatile, "expected": 0},
            )
        )
    elif known(aggregate) and aggregate > 0:
        out.append(
            Finding(
                ECC_AGGREGATE.code,
                Status.WARN,
                subject,
                f"{aggregate} uncorrectable ECC error(s) over the GPU's lifetime (none since the driver loaded)",
                "Watch `nvidia-smi -q -d ECC`; if the count grows, drain the node and contact the vendor.",
                {"ecc_uncorrected_aggregate": aggregate, "expected": 0},
            )
        )
    if gpu.retired_pages_pending is True:
        out.append(
            Finding(
                RETIRED_PENDING.code,
                Status.FAIL,
                subject,
                "retired memory pages are pending: they take effect at the next GPU reset",
                f"Reset the GPU (sudo nvidia-smi -r -i {gpu.index}) or reboot when it is idle.",
                {"retired_pages_pending": True, "expected": False},
            )
        )
    rows = gpu.remapped_rows
    if known(rows):
        evidence = {
            "correctable": rows.correctable,
            "uncorrectable": rows.uncorrectable,
            "pending": rows.pending,
            "failed": rows.failed,
        }
        if rows.failed:
            out.append(
                Finding(
                    REMAP_FAILED.code,
                    Status.FAIL,
                    subject,
                    "memory row remapping failed: no spare rows left, the fault cannot be repaired",
                    "Take the GPU out of service and contact the vendor (RMA).",
                    {**evidence, "expected": "failed: false"},
                )
            )
        elif rows.pending:
            out.append(
                Finding(
                    REMAP_PENDING.code,
                    Status.FAIL,
                    subject,
                    "a memory row remap is pending: the GPU needs a reset",
                    f"Reset the GPU (sudo nvidia-smi -r -i {gpu.index}) or reboot when it is idle.",
                    {**evidence, "expected": "pending: false"},
                )
            )
    return out


@check("memory_errors", "GPU memory errors (ECC, retired pages, row remapping)", codes=CODES, needs="visible")
def memory_errors(ctx: CheckContext) -> list[Finding]:
    gpus = target_gpus(ctx)
    findings = [f for g in gpus for f in _gpu_memory_errors(g)]
    if findings:
        return findings
    readable = [g.index for g in gpus if known(g.ecc_uncorrected_volatile) or known(g.remapped_rows)]
    if not readable:
        return []
    return [
        Finding(
            ECC_VOLATILE.code,
            Status.PASS,
            "host",
            f"no memory errors on GPU {gpu_list(readable)}",
            "",
            {"gpus": readable},
        )
    ]


def _status_for(xid_class: str) -> tuple[Code, Status]:
    if xid_class == "hardware":
        return XID_HARDWARE, Status.FAIL
    if xid_class == "application":
        return XID_APPLICATION, Status.WARN
    return XID_OTHER, Status.WARN


_SINCE_BOOT = "the kernel log covers the time since boot: an event before the last GPU reset may already be cleared"
_HINTS = {
    "hardware": "Reset the GPU or reboot; if hardware XIDs return, drain the node and contact the vendor.",
    "contained": "The driver handled it (row remapped or page retired; a contained ECC error stops only the "
    "context that hit it): check `nvidia-smi -q -d ROW_REMAPPER`, reset the GPU if a remap is pending (GD804); "
    "if these keep coming, the memory is wearing: plan an RMA.",
    "application": "Match the times to crashed jobs and fix the program; "
    "if no program is at fault, treat it as hardware.",
    "other": "Look the XID up in NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors).",
}


@check("xid", "XID errors in the kernel log", codes=XID_CODES, needs="gpus")
def xid_errors(ctx: CheckContext) -> list[Finding]:
    events = ctx.snapshot.host.xid_events
    if not known(events):
        if events.reason == "not_collected":
            return []
        why = {
            "no_permission": "the kernel log is not readable (dmesg_restrict, or a container without CAP_SYSLOG)",
            "unsupported": "this system has no readable kernel log",
        }.get(events.reason, f"the kernel log could not be read ({events.detail or events.reason})")
        return [
            Finding(
                XID_HARDWARE.code,
                Status.SKIP,
                "host",
                f"XIDs not checked: {why}",
                "Run gpudoctor as root on the host (or `sudo sysctl kernel.dmesg_restrict=0`) to read XIDs.",
                {"reason": events.reason},
            )
        ]
    by_bus = {normalize_bus_id(g.pci_bus_id): g for g in ctx.snapshot.gpus}
    targets = {g.index for g in target_gpus(ctx)}
    # (subject, class) -> events, so each GPU gets one finding per kind of XID.
    grouped: dict[tuple[str, str], list[Any]] = defaultdict(list)
    gpu_of: dict[str, Gpu | None] = {}
    for event in events:
        gpu = by_bus.get(normalize_bus_id(event.pci_bus_id))
        subject = gpu_subject(gpu.index) if gpu else f"pci:{event.pci_bus_id}"
        gpu_of[subject] = gpu
        xid_class = classify(event.xid)
        # Contained hardware XIDs (63, 94) get a finding of their own: they warn, the rest fail.
        kind = "contained" if xid_class == "hardware" and contained(event.xid) else xid_class
        grouped[(subject, kind)].append(event)
    findings = []
    for (subject, kind), evs in grouped.items():
        xid_class = "hardware" if kind == "contained" else kind
        code, status = _status_for(xid_class)
        if kind == "contained":
            status = Status.WARN
        gpu = gpu_of[subject]
        used = gpu is not None and gpu.index in targets
        if not used and status is Status.FAIL:
            status = Status.WARN  # a sick GPU the run does not use: worth knowing, not blocking
        xids = sorted({e.xid for e in evs})
        where = f"GPU {gpu.index} ({gpu.pci_bus_id})" if gpu else f"PCI {evs[0].pci_bus_id} (not a GPU NVML lists)"
        kinds = ", ".join(describe(x) for x in xids)
        note = "" if used or gpu is None else " (a GPU this run does not use)"
        label = "contained hardware" if kind == "contained" else xid_class
        hint = f"{_HINTS[kind]} Note: {_SINCE_BOOT}."
        evidence = {
            "xids": xids,
            "count": len(evs),
            "class": xid_class,
            "contained": kind == "contained",
            "first": evs[0].timestamp,
            "last": evs[-1].timestamp,
            "last_text": evs[-1].text[:200],
        }
        findings.append(
            Finding(
                code.code,
                status,
                subject,
                f"{label} {kinds} on {where}{note}, {len(evs)} time(s) in the kernel log since boot",
                hint,
                evidence,
            )
        )
    if not findings:
        return [Finding(XID_HARDWARE.code, Status.PASS, "host", "no XID errors in the kernel log", "", {"events": 0})]
    return findings


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


@check("clocks", "GPU clocks not throttled", codes=[THROTTLED], needs="visible")
def clocks(ctx: CheckContext) -> list[Finding]:
    gpus = target_gpus(ctx)
    findings = [f for f in (_throttle_finding(g) for g in gpus) if f is not None]
    if findings:
        return findings
    readable = [g.index for g in gpus if known(g.clock_event_reasons)]
    if not readable:
        return []
    return [
        Finding(
            THROTTLED.code, Status.PASS, "host", f"no throttling on GPU {gpu_list(readable)}", "", {"gpus": readable}
        )
    ]
