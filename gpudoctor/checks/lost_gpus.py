"""GD827: GPUs NVML cannot talk to, because they fell off the bus or never gave a handle.

Such a GPU has no name, no memory size, no links, and CUDA does not enumerate it: visibility
(gpudoctor/knowledge/visible_gpus.py) leaves it out of the GPUs the run sees, so every other check counts
and compares only the GPUs that answer, and this is the one place that reports it. It fails when
the run would use the GPU had it answered (CUDA_VISIBLE_DEVICES selects it, or is unset) and warns
otherwise, and cites XID 79 ("GPU has fallen off the bus") where the kernel log has one for the
same PCI address.

A GPU that gives a handle but no reading at all (every NVML query after it answers an error, no
permission or not supported: `unread.silent`) does not answer the driver either: nothing about it
can be checked, so GD827 fails it too (warns for a GPU the run does not use) instead of leaving the
run READY on a pile of "unreadable" warnings. Such a GPU stays in the run's view (CUDA may still
enumerate it), so the per-field warnings of the other checks say what each could not read.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpudoctor.checks.unread import REASON_TEXT, reason_hint, silent
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge.interconnect import normalize_bus_id
from gpudoctor.knowledge.units import gpu_list
from gpudoctor.knowledge.visible_gpus import unreadable
from gpudoctor.snapshot import Gpu, Snapshot, known

GPU_LOST = Code(
    "GD827",
    "gpu-lost",
    "Every GPU answers the driver",
    what="Looks for GPUs NVML reports as lost (GPU_IS_LOST: fallen off the bus, before or during the "
    "probe) or gives no handle for at all, and GPUs that give a handle but answer no query after it "
    "(every reading an error or refused), and names each by index, PCI address and UUID as far as "
    "they are known, with the XID 79 events the kernel logged for the same address.",
    why="A GPU that fell off the bus cannot run anything: CUDA fails on it (and often on every GPU of the "
    "node until a reboot), NCCL hangs, and the rank that owns it dies. Its facts are unreadable, so "
    "without this check the node could look ready with one GPU quietly missing from every comparison.",
    fix="Power-cycle the node (NVIDIA's XID catalog files XID 79 under RESTART_BM: a warm reboot may not "
    "bring the GPU back); then check its seating, power cables and riser. If it falls off again, drain the "
    "node and contact the vendor. A GPU without a handle for another reason: read the NVML error in the "
    "finding (permissions on /dev/nvidia*, 'GPU requires reset': `sudo nvidia-smi -r -i <gpu>`).",
)
CODES = [GPU_LOST]


def _where(gpu: Gpu) -> str:
    parts = [p for p in (gpu.pci_bus_id, gpu.uuid) if p]
    return f"GPU {gpu.index}" + (f" ({', '.join(parts)})" if parts else "")


def _xid79(snapshot: Snapshot, gpu: Gpu) -> list[Any]:
    events = snapshot.host.xid_events
    if not gpu.pci_bus_id or not isinstance(events, list):
        return []
    key = normalize_bus_id(gpu.pci_bus_id)
    return [e for e in events if e.xid == 79 and normalize_bus_id(e.pci_bus_id) == key]


def _finding(snapshot: Snapshot, gpu: Gpu, used: bool) -> Finding:
    xid79 = _xid79(snapshot, gpu)
    evidence: dict[str, Any] = {
        "index": gpu.index,
        "pci_bus_id": gpu.pci_bus_id or None,
        "uuid": gpu.uuid or None,
        "lost": gpu.lost,
        "used_by_run": used,
    }
    if known(gpu.unreachable):
        evidence["nvml_error"] = gpu.unreachable
    if xid79:
        evidence["xid_79"] = [e.timestamp or e.text[:120] for e in xid79]
    note = "" if used else " (a GPU this run does not use)"
    if gpu.lost:
        seen = f"; XID 79 in the kernel log ({xid79[-1].timestamp})" if xid79 and xid79[-1].timestamp else ""
        message = f"{_where(gpu)} is lost: NVML answers GPU_IS_LOST (fallen off the bus){seen}{note}"
        hint = (
            "Power-cycle the node (XID 79 is NVIDIA's RESTART_BM: a warm reboot may not bring it back), then "
            "check seating, power and riser; if it falls off again, drain the node and RMA the GPU."
        )
    else:
        message = f"NVML gives no handle for {_where(gpu)}: {gpu.unreachable}{note}"
        hint = (
            "Make /dev/nvidia* readable to this user (or run in a container with the devices passed through)."
            if "no_permission" in str(gpu.unreachable) or "Permission" in str(gpu.unreachable)
            else f"Read the NVML error; reset the GPU (sudo nvidia-smi -r -i {gpu.index}) or reboot, then re-run."
        )
    return Finding(GPU_LOST.code, Status.FAIL if used else Status.WARN, gpu_subject(gpu.index), message, hint, evidence)


def _silent_findings(quiet: list[tuple[Gpu, Counter[str]]], visible: set[int]) -> list[Finding]:
    """One finding per group of silent GPUs that failed for the same reasons and are (not) used."""
    groups: dict[tuple[tuple[str, ...], bool], list[tuple[Gpu, Counter[str]]]] = {}
    for gpu, reasons in quiet:
        groups.setdefault((tuple(sorted(reasons)), gpu.index in visible), []).append((gpu, reasons))
    out = []
    for (reasons, used), members in groups.items():
        indices = [g.index for g, _ in members]
        who = _where(members[0][0]) if len(members) == 1 else f"GPU {gpu_list(indices)}"
        why = ", ".join(REASON_TEXT.get(r, r) for r in reasons)
        note = "" if used else f" ({'a GPU' if len(members) == 1 else 'GPUs'} this run does not use)"
        verb = "answers" if len(members) == 1 else "answer"
        message = f"{who} {verb} no NVML query: every reading failed ({why}){note}"
        evidence = {
            "gpus": indices,
            "pci_bus_ids": [g.pci_bus_id or None for g, _ in members],
            "uuids": [g.uuid or None for g, _ in members],
            "failed_readings": {str(g.index): dict(r) for g, r in members},
            "used_by_run": used,
        }
        subject = gpu_subject(indices[0]) if len(indices) == 1 else "host"
        hint = reason_hint(set(reasons), indices[0], len(indices) > 1)
        out.append(Finding(GPU_LOST.code, Status.FAIL if used else Status.WARN, subject, message, hint, evidence))
    return out


@check("lost_gpus", "Every GPU answers the driver", codes=CODES, needs="gpus")
def lost_gpus(ctx: CheckContext) -> list[Finding]:
    snapshot = ctx.snapshot
    used = set(ctx.visible.lost_wanted)  # CUDA never sees them: would the run have used them?
    bad = [_finding(snapshot, g, g.index in used) for g in snapshot.gpus if unreadable(g)]
    visible = set(ctx.visible.nvml_indices)
    quiet = [(g, r) for g in snapshot.gpus if not unreadable(g) and (r := silent(g)) is not None]
    bad += _silent_findings(quiet, visible)
    if bad:
        return bad
    indices = [g.index for g in snapshot.gpus]
    message = f"all {len(indices)} GPU(s) answer NVML (GPU {gpu_list(indices)})"
    return [Finding(GPU_LOST.code, Status.PASS, "host", message, "", {"gpus": indices})]


def readable(gpus: list[Gpu] | tuple[Gpu, ...]) -> list[Gpu]:
    """The GPUs whose facts can be compared (GD827 reports the others). The visible GPUs are all
    readable already (visibility leaves lost ones out); this is for lists of every GPU."""
    return [g for g in gpus if not unreadable(g)]
