"""GD810-812 (GPU health): NVIDIA XID errors in the kernel log, matched to the GPU by PCI address and
judged by NVIDIA's XID catalog (knowledge/xid.py); Xid 154 by the recovery action it names."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge import xid
from gpudoctor.knowledge.interconnect import normalize_bus_id
from gpudoctor.knowledge.recovery_actions import recovery_hint, recovery_severity
from gpudoctor.knowledge.units import gpu_list
from gpudoctor.knowledge.xid import describe
from gpudoctor.snapshot import Gpu, known

XID_HARDWARE = Code(
    "GD810",
    "xid-hardware",
    "No XID errors that need a GPU reset, a reboot or the vendor",
    what="Reads NVIDIA XID errors ('NVRM: Xid (PCI:...): N') from the kernel log, where it is readable, "
    "names the GPU by its PCI address, and looks each up in NVIDIA's XID catalog (Ampere and later). "
    "XIDs whose immediate action is a GPU reset, a power cycle, a reboot, an NVLink or ECC workflow or "
    "a report to NVIDIA fail the GPU: e.g. 48 double-bit ECC, 62/119/120 micro-controller and GSP "
    "faults, 64 row-remap failure, 74 NVLink, 79 fallen off the bus, 95 uncontained ECC, 109 context "
    "switch timeout. Two memory faults the driver already handled warn instead: 63 (a row remap "
    "recorded) and 94 (a contained ECC error). Xid 154 (the GPU recovery action changed) is judged by "
    "the action it names. The kernel log covers the time since boot, so an event may predate a GPU "
    "reset that cleared it.",
    why="A GPU that logged such an XID since boot is likely to hang or crash the next job; in a "
    "multi-GPU run that shows up as an NCCL watchdog timeout on every rank, far from the cause.",
    fix="Do what the finding says (the catalog's immediate action for the XID). Look at "
    "`sudo dmesg -T | grep -i xid`. If the XID returns after the reset or reboot, drain the node and "
    "contact the vendor. For 63/94, check `nvidia-smi -q -d ROW_REMAPPER`: a pending remap needs a "
    "reset (GD804). When the log cannot be read (dmesg_restrict, containers without CAP_SYSLOG), run "
    "gpudoctor on the host as root.",
)
XID_APPLICATION = Code(
    "GD811",
    "xid-application",
    "No application XID errors in the kernel log",
    what="Reports XIDs NVIDIA's catalog files under RESTART_APP: faults a program caused (13 graphics "
    "engine exception, 31 memory page fault, 32, 43-era copy-engine errors...).",
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
    "Other XIDs in the kernel log: informational, secondary or unknown",
    what="Reports the remaining XIDs: those NVIDIA's catalog says need no action (IGNORE, e.g. 43, 92, 121: "
    "a pass that lists them), 45 (a cleanup after another error: warns, act on the other one) and XIDs "
    "the catalog does not list (warn).",
    why="They give context to other errors; an XID gpudoctor does not know may be a harmless driver notice "
    "or the first sign of a fault.",
    fix="Look the code up in NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors) and act on it; for 45, "
    "act on the XID logged just before it.",
)
XID_CODES = [XID_HARDWARE, XID_APPLICATION, XID_OTHER]

_SINCE_BOOT = "the kernel log covers the time since boot: an event before the last GPU reset may already be cleared"


def _code_for(kind: str) -> Code:
    if kind in ("hardware", "contained", "recovery"):
        return XID_HARDWARE
    return XID_APPLICATION if kind == "application" else XID_OTHER


_KIND_STATUS = {
    "hardware": Status.FAIL,
    "contained": Status.WARN,
    "application": Status.WARN,
    "secondary": Status.WARN,
    "informational": Status.PASS,
    "other": Status.WARN,
}
_LABEL = {
    "hardware": "hardware",
    "contained": "contained memory fault",
    "application": "application",
    "secondary": "secondary",
    "informational": "informational",
    "other": "unknown",
    "recovery": "recovery-action",
}
_CONTAINED_HINT = (
    "The driver handled it (row remapped, or only the context that hit the ECC error was stopped): check "
    "`nvidia-smi -q -d ROW_REMAPPER`, reset the GPU if a remap is pending (GD804); if these keep coming, "
    "the memory is wearing: plan an RMA."
)


def _recovery_event(evs: list[Any], gpu: Gpu | None) -> tuple[Status, str, str]:
    """Xid 154: the last change the log shows decides, unless NVML says the action is done."""
    target = xid.recovery_target(evs[-1].text)
    action = xid.recovery_name(target) if target is not None else "unknown"
    status = Status(recovery_severity(action)) if target is not None else Status.WARN
    index = gpu.index if gpu else "<gpu>"
    hint = recovery_hint(action, index) if target is not None else "Read the XID 154 line: it names the action."
    if gpu is not None and gpu.recovery_action == "none" and status is not Status.PASS:
        return Status.PASS, f"{action.replace('_', ' ')}, since done (NVML reports none now)", ""
    return status, action.replace("_", " "), hint[:1].upper() + hint[1:] + "."


def _xid_hint(kind: str, xids: list[int], gpu: Gpu | None) -> str:
    """The catalog's immediate action per XID, the heaviest first (a power cycle before a reset)."""
    if kind == "contained":
        return _CONTAINED_HINT
    by_action: dict[str, list[int]] = {}
    for x in sorted(xids, key=xid.severity_rank):
        by_action.setdefault(xid.action(x), []).append(x)
    index = str(gpu.index) if gpu else "<gpu>"
    parts = [f"XID {', '.join(map(str, xs))}: {act.replace('<gpu>', index)}" for act, xs in by_action.items()]
    return "NVIDIA's XID catalog: " + "; ".join(parts) + "."


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
    by_bus = {normalize_bus_id(g.pci_bus_id): g for g in ctx.snapshot.gpus if g.pci_bus_id}
    # A lost GPU the run would have used (CUDA no longer enumerates it) is still the run's GPU here.
    lost = set(ctx.visible.lost_wanted)
    targets = {g.index for g in target_gpus(ctx)} | lost
    # A GPU the run uses whose PCI address NVML could not give may be the one an unmatched XID names.
    unplaced = sorted(g.index for g in target_gpus(ctx) if not g.pci_bus_id)
    # (subject, kind) -> events, so each GPU gets one finding per kind of XID.
    grouped: dict[tuple[str, str], list[Any]] = defaultdict(list)
    gpu_of: dict[str, Gpu | None] = {}
    for event in events:
        gpu = by_bus.get(normalize_bus_id(event.pci_bus_id))
        subject = gpu_subject(gpu.index) if gpu else f"pci:{event.pci_bus_id}"
        gpu_of[subject] = gpu
        grouped[(subject, xid.kind(event.xid))].append(event)
    findings = []
    for (subject, kind), evs in grouped.items():
        gpu = gpu_of[subject]
        xids = sorted({e.xid for e in evs})
        if kind == "recovery":
            status, what, hint = _recovery_event(evs, gpu)
            kinds = f"XID 154 (GPU recovery action changed to {what})"
        else:
            status, hint = _KIND_STATUS[kind], _xid_hint(kind, xids, gpu)
            kinds = ", ".join(describe(x) for x in xids)
        used = gpu.index in targets if gpu is not None else bool(unplaced)
        if not used and status is Status.FAIL:
            status = Status.WARN  # a sick GPU the run does not use: worth knowing, not blocking
        if gpu is not None:
            where = f"GPU {gpu.index} ({gpu.pci_bus_id})"
        elif unplaced:
            where = f"PCI {evs[0].pci_bus_id} (maybe GPU {gpu_list(unplaced)}, whose PCI address NVML could not give)"
        else:
            where = f"PCI {evs[0].pci_bus_id} (not a GPU NVML lists)"
        note = (
            ""
            if gpu is None
            else " (lost: see GD827)"
            if gpu.index in lost
            else ""
            if used
            else " (a GPU this run does not use)"
        )
        if hint:
            hint = f"{hint} Note: {_SINCE_BOOT}."
        evidence = {
            "xids": xids,
            "count": len(evs),
            "class": xid.classify(xids[0]),
            "kind": kind,
            "catalog": {str(x): xid.bucket(x) for x in xids},
            "contained": kind == "contained",
            "first": evs[0].timestamp,
            "last": evs[-1].timestamp,
            "last_text": evs[-1].text[:200],
        }
        findings.append(
            Finding(
                _code_for(kind).code,
                status,
                subject,
                f"{_LABEL[kind]} {kinds} on {where}{note}, {len(evs)} time(s) in the kernel log since boot",
                hint,
                evidence,
            )
        )
    if not findings:
        return [Finding(XID_HARDWARE.code, Status.PASS, "host", "no XID errors in the kernel log", "", {"events": 0})]
    return findings
