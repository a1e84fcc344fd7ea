"""GD404-406 (part of the topology check, checks/topology.py): each GPU's PCIe link against what the
card can do, and P2P between the visible GPUs, including P2P that NVML offers but the PCIe path
redirects (ACS/IOMMU).

A link is judged against the card's own maximum where the snapshot has it (NVML's own-maximum
generation, or the GPU's Link Capabilities in sysfs: knowledge/pci_paths.py), so a card that its slot
holds back is named, with the slot as the cause. Severity follows what the link still carries: at a
quarter of its bandwidth or less (Gen2 of Gen5 under load, x4 of x16) the GPU's host traffic and every
PCIe collective through it crawl, which is a failure (local-inference-lab/rtx6kpro#88: a card held at
Gen2 of Gen5 for hours); above that a warning. The quarter is a heuristic line, not an NVIDIA figure.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from gpudoctor.checks.unread import unread, unreadable_finding
from gpudoctor.engine import Code
from gpudoctor.findings import Finding, Status, gpu_subject, pair_subject
from gpudoctor.knowledge import interconnect as topo
from gpudoctor.knowledge.pci_paths import acs_off_by_kernel, card_max, p2p_redirect, slot_max
from gpudoctor.knowledge.pcie_model import PCIE_GBPS_PER_LANE, p2p_cutoff, uses_p2p
from gpudoctor.snapshot import Gpu, Missing, Snapshot

PCIE_WIDTH = Code(
    "GD404",
    "pcie-width-degraded",
    "Every GPU's PCIe link runs at full width",
    what="Compares each GPU's current PCIe link width with what the card itself can do (its Link "
    "Capabilities in sysfs, else NVML's maximum for GPU and slot), and names the slot when the slot is "
    "what holds the card back. A link at a quarter of the card's width or less fails, a narrower one "
    "warns; a GPU whose widths NVML could not give is named as unreadable (warn).",
    why="A link trained narrower (x8 or x4 instead of x16), or a x16 card in a slot wired x4, halves or "
    "quarters host bandwidth: slower data loading, checkpointing and PCIe collectives for that rank, "
    "which the others then wait for.",
    fix="Reseat the card, check the riser cable and the slot's bifurcation setting in the BIOS, and look "
    "for PCIe errors in `dmesg`; `sudo lspci -vv` shows LnkCap vs LnkSta for the GPU. When the slot is "
    "the limit, move the card to a slot wired for its full width.",
)
PCIE_GEN = Code(
    "GD405",
    "pcie-gen-below-max",
    "Every GPU's PCIe link runs at its maximum generation",
    what="Compares each GPU's current PCIe generation with its maximum, and the slot's maximum with the "
    "card's own (NVML's nvmlDeviceGetGpuMaxPcieLinkGeneration where recorded, else sysfs). Idle GPUs lower "
    "the generation to save power, so at idle a lower generation is informational; a busy GPU below its "
    "maximum, or a slot of an older generation than the card, warns, and fails at a quarter of the "
    "bandwidth or less (Gen3 of Gen5, Gen2 of Gen4). A generation NVML could not give is named as "
    "unreadable (warn).",
    why="A link stuck at a lower generation under load moves data at half the rate per generation step "
    "(Gen4 x16 ~31 GB/s, Gen3 ~16 GB/s, Gen2 ~8 GB/s).",
    fix="Read it again under load (e.g. during `gpudoctor check` active checks or training). If it stays "
    "low, check the BIOS PCIe speed setting (and Link Control 2's hardware autonomous speed disable), risers "
    "and retimers, and `dmesg` for 'downgraded' links; move a card from an older-generation slot.",
)
P2P = Code(
    "GD406",
    "p2p-unsupported",
    "GPU pairs support peer-to-peer access, and their PCIe path does not redirect it",
    what="Reads P2P read/write support for each visible GPU pair (nvmlDeviceGetP2PStatus, the data of "
    "`nvidia-smi topo -p2p rw`), and for the pairs NCCL would run P2P on over PCIe, whether the path "
    "sends it through the CPU root complex: ACS redirection (ReqRedir/CmpltRedir) on a bridge between "
    "them, read from PCI configuration space (as root), or an IOMMU that translates the GPUs' DMA "
    "(IOMMU domain DMA), with which Linux turns ACS redirection on at boot.",
    why="Without P2P, NCCL stages every transfer through host memory (its SHM transport): less bandwidth "
    "and more CPU load. GeForce cards have P2P disabled by the driver, which is normal but slow; "
    "missing P2P between NVLink-joined GPUs means NCCL cannot use the NVLink at all. P2P that NVML "
    "reports OK but ACS or the IOMMU redirects makes NCCL hang or crawl (NVIDIA/nccl#2079, #257, #667; "
    "NCCL's troubleshooting guide, 'PCI Access Control Services').",
    fix="On GeForce cards nothing can be done but expect PCIe-through-host speeds. On data-centre GPUs, "
    "check that IOMMU/ACS is not blocking P2P (`iommu=pt`, ACS disabled on the PCIe switches), that "
    "P2P is not disabled by a registry key, and for NVLink pairs that all links are up and the fabric "
    "manager is running.",
)
CODES = [PCIE_WIDTH, PCIE_GEN, P2P]

# A link at about a quarter of its bandwidth or less fails: the line the active link probe GD420 draws
# under load (checks/active/link_probes.py PCIE_FAIL_RATIO): x4 of x16, Gen3 of Gen5, Gen2 of Gen4.
FAIL_SHARE = 0.26


def _share(gen: int, width: int, full_gen: int, full_width: int) -> float:
    rate = PCIE_GBPS_PER_LANE.get(gen, 0.0) * width
    return rate / (PCIE_GBPS_PER_LANE.get(full_gen, 1.0) * full_width)


def _status(share: float) -> Status:
    return Status.FAIL if share <= FAIL_SHARE else Status.WARN


def _unread_pair(a: object, b: object) -> Missing | None:
    first = unread(a, always_there=True)
    return first if first is not None else unread(b, always_there=True)


def _platform(status: Status, better: str) -> Status:
    """A limit every slot of the machine shares is the platform's (a Gen4 server for Gen5 cards): no
    slot to move to, so one step milder; a slot that holds back a card the machine could serve better
    keeps its severity."""
    if better:
        return status
    return Status.WARN if status is Status.FAIL else Status.PASS


def _better_slots(gpus: list[Gpu], gen_above: int | None, width_above: int | None) -> str:
    """The GPUs of the run whose slots reach further than this one's: where a better slot is."""
    fits = [
        g.index
        for g in gpus
        if (gen_above is not None and isinstance(g.pcie_gen_max, int) and g.pcie_gen_max > gen_above)
        or (width_above is not None and isinstance(g.pcie_width_max, int) and g.pcie_width_max > width_above)
    ]
    if not fits:
        return ""
    which = ", ".join(map(str, fits[:4]))
    if len(fits) > 1:
        return f" (the slots of GPU {which} reach further)"
    return f" (the slot of GPU {which} reaches further)"


def _width(g: Gpu, snap: Snapshot, gpus: list[Gpu]) -> Finding | None:
    cw, mw = g.pcie_width_current, g.pcie_width_max
    if not isinstance(cw, int) or not isinstance(mw, int):
        return None
    card = card_max(snap, g)[1]
    full = max(mw, card or 0)
    if cw >= full:
        return None
    share = cw / full
    slot = slot_max(snap, g)[1]
    evidence: dict[str, Any] = {"width": cw, "expected": full}
    if card and card > mw or (slot and card and slot < card and cw >= slot):
        limit = min(mw, slot or mw)
        evidence.update({"card_max_width": card, "slot_max_width": limit})
        msg = (
            f"GPU {g.index} PCIe link runs at x{cw}: its slot is wired x{limit}, the card can x{card} "
            f"({share:.0%} of its host bandwidth)"
        )
        better = _better_slots(gpus, None, limit)
        hint = f"Move GPU {g.index} to a slot wired x{card}{better}, or check the slot's bifurcation in the BIOS."
        status = _platform(_status(share), better)
        said = "" if status is Status.PASS else hint
        return Finding(PCIE_WIDTH.code, status, gpu_subject(g.index), msg, said, evidence)
    msg = f"GPU {g.index} PCIe link runs at x{cw} of x{full}: {share:.0%} of its host bandwidth"
    return Finding(PCIE_WIDTH.code, _status(share), gpu_subject(g.index), msg, PCIE_WIDTH.fix, evidence)


def _slot_gen(g: Gpu, snap: Snapshot, gpus: list[Gpu]) -> Finding | None:
    """A slot (or the system) of an older generation than the card: the card can never run faster."""
    mg = g.pcie_gen_max
    card = card_max(snap, g)[0]
    if not isinstance(mg, int) or card is None or card <= mg:
        return None
    share = _share(mg, 1, card, 1)
    msg = (
        f"GPU {g.index}'s slot limits its PCIe link to Gen{mg}; the card can Gen{card} "
        f"({share:.0%} of its host bandwidth at any load)"
    )
    better = _better_slots(gpus, mg, None)
    hint = (
        f"Move GPU {g.index} to a Gen{card} slot{better}, or set the slot's PCIe speed to Auto/Gen{card} in the "
        "BIOS (a riser or retimer may also hold it back)."
    )
    evidence = {"gen_max": mg, "card_max_gen": card}
    status = _platform(_status(share), better)
    return Finding(PCIE_GEN.code, status, gpu_subject(g.index), msg, "" if status is Status.PASS else hint, evidence)


def pcie_findings(snap: Snapshot, gpus: list[Gpu]) -> list[Finding]:
    """GD404 and GD405 for the visible GPUs."""
    out: list[Finding] = []
    idle_low: list[Gpu] = []
    measured = 0
    notes: list[Finding] = []
    width_unread = {g.index: m for g in gpus if (m := _unread_pair(g.pcie_width_current, g.pcie_width_max)) is not None}
    gen_unread = {g.index: m for g in gpus if (m := _unread_pair(g.pcie_gen_current, g.pcie_gen_max)) is not None}
    if width_unread:
        notes.append(unreadable_finding(PCIE_WIDTH.code, "PCIe link width", width_unread))
    if gen_unread:
        notes.append(unreadable_finding(PCIE_GEN.code, "PCIe link generation", gen_unread))
    for g in gpus:
        width = _width(g, snap, gpus)
        if width is not None:
            out.append(width)
        slot = _slot_gen(g, snap, gpus)
        if slot is not None:
            out.append(slot)
        cg, mg = g.pcie_gen_current, g.pcie_gen_max
        if isinstance(cg, int) and isinstance(mg, int):
            measured += 1
            if cg >= mg:
                continue
            reasons = g.clock_event_reasons
            if not isinstance(reasons, int) or reasons & 0x1:  # idle (or unknown): a normal downshift
                idle_low.append(g)
                continue
            share = _share(cg, 1, mg, 1)
            msg = f"GPU {g.index} PCIe link runs at Gen{cg} of Gen{mg} while busy: {share:.0%} of its host bandwidth"
            evidence = {"gen": cg, "expected": mg, "clock_event_reasons": hex(reasons)}
            out.append(Finding(PCIE_GEN.code, _status(share), gpu_subject(g.index), msg, PCIE_GEN.fix, evidence))
    if not any(f.code == PCIE_WIDTH.code for f in out) and gpus:
        widths = sorted({f"x{g.pcie_width_current}" for g in gpus if isinstance(g.pcie_width_current, int)})
        if widths:
            msg = f"PCIe links at full width ({', '.join(widths)})"
            out.append(Finding(PCIE_WIDTH.code, Status.PASS, "host", msg, "", {"widths": widths}))
    if idle_low:
        which = ", ".join(f"GPU {g.index} Gen{g.pcie_gen_current}/{g.pcie_gen_max}" for g in idle_low)
        msg = f"idle GPUs run their PCIe link below the maximum generation ({which}): normal power saving"
        evidence: dict[str, Any] = {str(g.index): {"gen": g.pcie_gen_current, "max": g.pcie_gen_max} for g in idle_low}
        evidence["note"] = "idle GPUs lower the link generation; read again under load"
        out.append(Finding(PCIE_GEN.code, Status.PASS, "host", msg, "", evidence))
    elif measured and not any(f.code == PCIE_GEN.code for f in out):
        gens = sorted({f"Gen{g.pcie_gen_current}" for g in gpus if isinstance(g.pcie_gen_current, int)})
        msg = f"PCIe links at their maximum generation ({', '.join(gens)})"
        out.append(Finding(PCIE_GEN.code, Status.PASS, "host", msg, "", {}))
    return notes + out


# --- P2P ------------------------------------------------------------------------------------------

# P2P between GPUs under different CPU sockets goes over the CPU interconnect (QPI/UPI, xGMI),
# which many platforms do not let carry peer-to-peer traffic: NVML reports such pairs as not
# supported (often IOH_TOPOLOGY_NOT_SUPPORTED, nvidia-smi topo -p2p "TNS"), and NCCL itself does
# not use P2P past PXB by default (nccl src/graph/paths.cc, ncclTopoCheckP2p).
CROSS_SOCKET_HINT = (
    "Not a GPU or driver fault: the CPU interconnect between the sockets does not carry "
    "peer-to-peer traffic on this platform (nvidia-smi topo -p2p shows the same). Keep a job's GPUs "
    "on one socket (CUDA_VISIBLE_DEVICES with the GPUs of one NUMA node, see the topology table's "
    "NUMA affinity), or budget for host-memory speed between the sockets."
)
REDIRECT_HINT = (
    "Disable ACS on the bridges between the GPUs (BIOS: ACS / 'PCIe ACS control' off, or VT-d/IOMMU off; "
    "from the OS after each boot: `sudo setpci -s <bridge> ECAP_ACS+0x6.w=0000`), or boot with `pci=noacs` "
    "and `iommu=pt`. Until then set NCCL_P2P_DISABLE=1 (NCCL copies through host memory: slower, but it "
    "does not hang). The active checks GD421/GD422 measure P2P on these pairs."
)
GROUPED_PAIRS = 4  # more redirected pairs than this are one host finding, not one per pair


def _cross_socket_only(snap: Snapshot, indices: list[int], missing: dict[tuple[int, int], str]) -> bool:
    """Whether P2P is missing on exactly the pairs that cross the CPU sockets (SYS)."""
    sys_pairs = {
        (a, b)
        for a, b in combinations(indices, 2)
        if topo.pcie_level(snap, a, b) == "SYS" and not topo.nvlink_count(snap, a, b)
    }
    return bool(missing) and set(missing) == sys_pairs


def _redirected(snap: Snapshot, ok_pairs: list[tuple[int, int]], cutoff: str) -> list[Finding]:
    """P2P that NVML offers over PCIe, that NCCL would use, but that the path sends to the root complex."""
    found = {}
    for a, b in ok_pairs:
        if topo.nvlink_count(snap, a, b) or not uses_p2p(snap, a, b, cutoff):
            continue
        why = p2p_redirect(snap, snap.gpu(a), snap.gpu(b))
        if why is not None:
            found[(a, b)] = why
    if not found:
        return []
    out = []
    if len(found) > GROUPED_PAIRS:
        listed = ", ".join(f"{a}-{b}" for a, b in found)
        first = next(iter(found.values()))
        msg = (
            f"{len(found)} GPU pairs ({listed}) report P2P OK, but {first.reason()}: NCCL hangs or crawls on "
            "them (NVML cannot see this)"
        )
        evidence = {"pairs": [f"{a}-{b}" for a, b in found], "certain": first.certain, "bridges": first.bridges}
        return [Finding(P2P.code, Status.WARN, "host", msg, REDIRECT_HINT, evidence)]
    for (a, b), why in found.items():
        msg = (
            f"GPUs {a} and {b}: NVML reports P2P OK, but {why.reason()}: NCCL hangs or crawls on this pair "
            "(NVML cannot see this)"
        )
        evidence = {
            "p2p": "ok",
            "level": topo.pcie_level(snap, a, b),
            "acs_redirect": {k: hex(v) for k, v in why.bridges.items()},
            "iommu_translates": why.translated,
            "certain": why.certain,
        }
        out.append(Finding(P2P.code, Status.WARN, pair_subject(a, b), msg, REDIRECT_HINT, evidence))
    return out


def p2p_findings(snap: Snapshot, indices: list[int], cutoff: str | None = None) -> list[Finding]:
    """GD406 for the visible GPUs; `cutoff` is NCCL's P2P level for them (None: work it out)."""
    bad: dict[tuple[int, int], str] = {}
    ok: list[tuple[int, int]] = []
    for a, b in combinations(indices, 2):
        pair = snap.pair(a, b)
        if pair is None:
            continue
        statuses = [s for s in (pair.p2p_read, pair.p2p_write) if isinstance(s, str)]
        if not statuses:
            continue
        failing = [s for s in statuses if s != "ok"]
        if failing:
            bad[(min(a, b), max(a, b))] = failing[0]
        else:
            ok.append((min(a, b), max(a, b)))
    known = len(bad) + len(ok)
    if not known:
        return []
    level = cutoff or p2p_cutoff(snap, len(indices)).level
    redirected = _redirected(snap, ok, level)
    if not bad:
        if redirected:
            return redirected
        msg = f"P2P read/write supported between all {known} GPU pairs"
        if acs_off_by_kernel(snap):
            msg += " (the kernel runs with ACS off)"
        return [Finding(P2P.code, Status.PASS, "host", msg, "", {})]
    out: list[Finding] = list(redirected)
    pcie_only = {}
    for (a, b), status in bad.items():
        nv = topo.nvlink_count(snap, a, b)
        if nv:
            msg = f"GPUs {a} and {b} are joined by NV{nv} but P2P reports {status}: NCCL cannot use the NVLink"
            evidence: dict[str, Any] = {"p2p": status, "expected": "ok", "link": f"NV{nv}"}
            out.append(Finding(P2P.code, Status.FAIL, pair_subject(a, b), msg, P2P.fix, evidence))
        else:
            pcie_only[(a, b)] = status
    if not pcie_only:
        return out
    geforce = all("GeForce" in snap.gpu(i).name for i in indices)
    cost = "NCCL stages every transfer through host memory (SHM), a fraction of the PCIe bandwidth"
    hint = P2P.fix
    if geforce:
        cost += "; normal for GeForce cards, whose driver disables P2P"
        hint = "Expected on GeForce cards: nothing to fix. Budget for slower collectives, or use GPUs with P2P/NVLink."
    statuses = sorted(set(pcie_only.values()))
    evidence = {"pairs": {f"{a}-{b}": s for (a, b), s in pcie_only.items()}, "expected": "ok"}
    if _cross_socket_only(snap, indices, pcie_only) and not geforce:
        listed = ", ".join(f"{a}-{b}" for a, b in pcie_only)
        msg = (
            f"P2P is unsupported exactly on the {len(pcie_only)} GPU pair(s) that cross the CPU sockets (SYS): "
            f"{listed} ({', '.join(statuses)}); the pairs within a socket have it. NCCL stages the "
            "cross-socket transfers through host memory"
        )
        evidence["cause"] = "cpu interconnect"
        out.append(Finding(P2P.code, Status.WARN, "host", msg, CROSS_SOCKET_HINT, evidence))
        return out
    if len(pcie_only) == known:
        msg = f"no GPU pair supports P2P ({', '.join(statuses)}): {cost}"
        out.append(Finding(P2P.code, Status.WARN, "host", msg, hint, evidence))
    else:
        for (a, b), status in pcie_only.items():
            msg = f"GPUs {a} and {b} do not support P2P ({status}): {cost}"
            out.append(
                Finding(P2P.code, Status.WARN, pair_subject(a, b), msg, P2P.fix, {"p2p": status, "expected": "ok"})
            )
    return out
