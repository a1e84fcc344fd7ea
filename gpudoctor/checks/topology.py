"""GD4 (topology and links): NVLink and PCIe between the visible GPUs, and P2P support.

The `nvidia-smi topo -m` matrix of the visible GPUs goes into the result's details (a table
for the text output, the matrix for JSON). Findings name GPUs and pairs by NVML index.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import combinations
from typing import Any

from gpudoctor.checks.pcie_links import P2P, PCIE_GEN, PCIE_WIDTH, p2p_findings, pcie_findings
from gpudoctor.checks.unread import unread, unreadable_finding
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge import expectations
from gpudoctor.knowledge import interconnect as topo
from gpudoctor.knowledge.gpu_products import bridge_links
from gpudoctor.knowledge.visible_gpus import unreadable
from gpudoctor.snapshot import Gpu, Missing, Snapshot

MATRIX = Code(
    "GD401",
    "topology-matrix",
    "How the visible GPUs are connected",
    what="Builds the `nvidia-smi topo -m` matrix of the visible GPUs from NVML: NV# for pairs joined by "
    "# NVLinks (directly or through NVSwitch), else the PCIe path (PIX, PXB, PHB, NODE, SYS), with "
    "each GPU's CPU and NUMA affinity. A pair shows `?` when it is not known: an end whose NVLink "
    "state NVML could not read (an error, no permission) and no link seen from the other, or a PCIe "
    "path that was not recorded; never a PCIe level passed off as the connection.",
    why="Collective bandwidth follows the slowest hop: NVLink carries hundreds of GB/s, a PCIe path "
    "through the CPU tens, a path across sockets (SYS) less again. Knowing the matrix explains most "
    "all-reduce numbers.",
    fix="Informational. Compare with the machine's specification; `nvidia-smi topo -m` shows the same.",
)
FEWER_LINKS = Code(
    "GD402",
    "nvlink-fewer-links",
    "Every GPU has all its NVLinks active",
    what="Counts the active NVLink links of each visible GPU (nvmlDeviceGetNvLinkState) against the "
    "number a healthy GPU of its model has: every link NVML lists, active or not (8 on A800/H800). "
    "This is the same count the expected all-reduce busbw (GD407, GD601) is built on, so a GPU "
    "down links here is one the bandwidth verdict holds to its healthy figure. A PCIe card with a "
    "bridge is judged against the links its bridges have (NVIDIA's specs: 3 bridges of 4 links on "
    "A100/H100 PCIe and H100 NVL, one of 4 on GA102, of 2 on TU102), not against its peers, since a "
    "partly seated bridge takes the same links down at both ends: a link count that is not a whole "
    "number of bridges fails (partly seated), fewer bridges than the card takes warns; a card with no "
    "bridge is named only when its peers have one. A GPU whose NVLink state NVML "
    "could not read is named as unreadable (warn), never counted as having none; an SXM module for "
    "which NVML reports no NVLink at all (NOT_SUPPORTED) while its peers of the same model have links "
    "counts as 0 active links.",
    why="A GPU with links down moves its share of every collective over fewer links (or over PCIe when "
    "none is left), and the whole ring or tree waits for it. Warn below the healthy count, fail below "
    "three quarters of it. Every GPU down the same links (a switch tray or fabric fault) is caught "
    "too: a majority vote would call that normal.",
    fix="Links down on an SXM/HGX board are a hardware or fabric fault: check `nvidia-smi nvlink -s` and "
    "`nvidia-smi nvlink -e` (error counters), reset the GPU (`nvidia-smi -r`) or reboot, restart "
    "nvidia-fabricmanager on NVSwitch systems, and have the board serviced if links stay down.",
)
NO_NVLINK_PAIRS = Code(
    "GD403",
    "pairs-without-nvlink",
    "No GPU pair falls back to PCIe while others use NVLink",
    what="On machines where some visible GPU pairs are joined by NVLink, lists the pairs that are not "
    "and the PCIe path between them (SYS: across the CPU sockets). Where the NVLinks that are up "
    "still join every GPU (a mesh such as the DGX-1 V100 hybrid cube mesh), rings stay on NVLink "
    "and this passes; bridged islands, or a GPU cut off from the others, warn. Pairs with a GPU whose "
    "NVLink state is unreadable are left out and named (GD402 reports the GPU).",
    why="A ring or tree over all GPUs is as fast as its slowest hop: A100 pairs reach ~208 GB/s over "
    "NV12 but an all-reduce drops to ~20 GB/s once a GPU crosses SYS (nccl-tests#178).",
    fix="Run the job on GPUs that share NVLink (CUDA_VISIBLE_DEVICES with CUDA_DEVICE_ORDER=PCI_BUS_ID), "
    "or expect PCIe speed for the collectives; on bridged workstations, fit the missing NVLink bridges.",
)
EXPECTED = Code(
    "GD407",
    "expected-busbw",
    "What all-reduce bus bandwidth the visible GPUs reach when healthy",
    what="States, before anything runs, the large-message all-reduce busbw (nccl-tests' definition) "
    "that the visible GPUs reach when healthy, with its basis: the GPU model, the interconnect "
    "(NVSwitch, NVLink mesh, NVLink bridge or PCIe tree, with NCCL's rate per link), and the NCCL "
    "algorithm that will run (ring, or NVLink SHARP on Hopper and later NVSwitch systems with more "
    "than 4 GPUs unless NCCL_NVLS_ENABLE=0 or NCCL_ALGO excludes it). The figure comes from the "
    "hardware, not from the links that happen to be up, and the active check (GD601) judges its "
    "measurement against the same figure. docs/active-checks.md lists the model and its sources.",
    why="A number to hold a run to: nccl-tests, the training job or GD601 can be compared with it "
    "(nccl-tests' NCCL_TESTS_MIN_BW takes such a figure), and a machine with links down shows up as "
    "falling short of it rather than being judged against its own degraded links.",
    fix="Informational. When a measurement falls short of it, see GD601 and the other GD4 findings "
    "(links down, PCIe width or generation, P2P), and the NCCL environment findings (GD6).",
)
CODES = [MATRIX, FEWER_LINKS, NO_NVLINK_PAIRS, PCIE_WIDTH, PCIE_GEN, P2P, EXPECTED]


@check("topology", "NVLink, PCIe and P2P topology", codes=CODES, needs="visible")
def topology(ctx: CheckContext) -> Any:
    snap = ctx.snapshot
    indices = sorted(set(ctx.visible.nvml_indices))  # nvidia-smi order, like topo -m
    labels = topo.matrix(snap, indices)
    details = {
        "tables": [topo.topo_table(snap, indices)],
        "topology": {
            "gpus": indices,
            "matrix": labels,
            "nvswitch": topo.has_nvswitch(snap),
            "nvlink_generation": topo.nvlink_generation(snap),
        },
    }
    expected = _expected(snap, indices, ctx.visible.count)
    summary = _summary(snap, indices)
    figure = expected.evidence.get("expected_busbw_gbps")
    if figure is not None and len(indices) > 1:
        # The line a clean text report shows for this check: say what the machine should reach.
        summary = replace(
            summary, message=f"{summary.message}; all-reduce should reach {figure:.0f} GB/s busbw (GD407)"
        )
    out = [summary]
    # The visible GPUs answer NVML (visibility leaves lost ones out: GD827); a reading that still
    # failed (error, no permission) is unknown, and each judgement below says so rather than guess.
    gpus = [snap.gpu(i) for i in indices]
    out += _fewer_links(snap, gpus)
    out += _pairs_without_nvlink(snap, indices)
    out += pcie_findings(snap, gpus)
    out += p2p_findings(snap, indices)
    out.append(expected)
    return out, details


def _nvlinks_unread(gpus: list[Gpu]) -> dict[int, Missing]:
    """The GPUs whose NVLink state NVML could not give (not "no NVLink": unknown)."""
    return {g.index: m for g in gpus if (m := unread(g.nvlinks)) is not None}


def _summary(snap: Snapshot, indices: list[int]) -> Finding:
    pairs = list(combinations(indices, 2))
    counts = Counter(topo.link_label(snap, a, b) for a, b in pairs)
    evidence: dict[str, Any] = {"pairs": dict(counts), "nvswitch": topo.has_nvswitch(snap)}
    if not pairs:
        return Finding(
            MATRIX.code, Status.PASS, "host", f"one GPU visible (GPU {indices[0]}): no GPU pairs", "", evidence
        )
    gen = topo.nvlink_generation(snap)
    if len(counts) == 1:
        (label,) = counts
        how = ""
        if label.startswith("NV"):
            via = "through NVSwitch" if topo.has_nvswitch(snap) else "direct"
            how = f" (NVLink {gen}, {via})" if gen else f" ({via})"
        text = f"all {len(pairs)} pairs {label}{how}"
    else:
        text = ", ".join(f"{n} pairs {label}" for label, n in counts.most_common())
    unknown = _nvlinks_unread([snap.gpu(i) for i in indices])
    if unknown:
        evidence["nvlinks_unreadable"] = sorted(unknown)
        text += f" (? = NVLink state of GPU {', '.join(str(i) for i in sorted(unknown))} unreadable: GD402)"
    return Finding(MATRIX.code, Status.PASS, "host", f"{len(indices)} GPUs: {text}", "", evidence)


def _fewer_links(snap: Snapshot, gpus: list[Gpu]) -> list[Finding]:
    """Active links against the healthy count (expectations.healthy_nvlinks, the figure GD601 and
    GD407 use) on SXM modules, whose links are always wired; PCIe cards, whose bridges are
    optional, are compared with their peers. A GPU whose NVLink state could not be read is named
    as unreadable, never counted as having none; an SXM module for which NVML reports no NVLink at
    all while its peers of the same model have links counts as 0 active links."""
    counts = {g.index: topo.active_links(g) for g in gpus if isinstance(g.nvlinks, list)}
    linked_models = {g.name for g in gpus if counts.get(g.index)}
    none_reported = [
        g
        for g in gpus
        if g.index not in counts
        and topo.nvlinks_read(g)
        and g.name in linked_models
        and not expectations.is_pcie_card(g)
    ]
    counts.update({g.index: 0 for g in none_reported})
    unknown = _nvlinks_unread(gpus)
    out = []
    if unknown:
        out.append(unreadable_finding(FEWER_LINKS.code, "NVLink state", unknown, "its links are not checked"))
    if len(counts) < 2 or not any(counts.values()) and all(expectations.is_pcie_card(g) for g in gpus):
        return out
    tally = Counter(counts.values()).most_common()
    top = max(n for n, c in tally if c == tally[0][1])  # the usual count; ties go to the higher one
    short = []
    for g in gpus:
        if g.index not in counts:
            continue
        n = counts[g.index]
        if expectations.is_pcie_card(g):
            bridge = _bridge_finding(snap, g, n, top)
            if bridge is not None:
                short.append(bridge)
            continue
        healthy = expectations.healthy_nvlinks(snap, g)
        expected = top if healthy is None else healthy
        if n >= expected:
            continue
        status = Status.FAIL if n < 0.75 * expected else Status.WARN
        cost = (
            "its traffic falls back to PCIe" if n == 0 else f"collectives through it run at about {n}/{expected} speed"
        )
        said = " (NVML reports no NVLink on it)" if g in none_reported else ""
        msg = f"GPU {g.index} has {n} of {expected} NVLinks active{said}, its peers {top}: {cost}"
        links = len(g.nvlinks) if isinstance(g.nvlinks, list) else 0
        evidence = {"active_links": n, "expected": expected, "links": links}
        short.append(Finding(FEWER_LINKS.code, status, gpu_subject(g.index), msg, FEWER_LINKS.fix, evidence))
    if not short:
        msg = f"{len(counts)} GPUs with {top} active NVLinks each"
        short.append(Finding(FEWER_LINKS.code, Status.PASS, "host", msg, "", {"active_links": counts}))
    return out + short


BRIDGE_HINT = (
    "Reseat the NVLink bridge so it is fully home on both cards (a cooler, water block or bracket can stop "
    "it short: NVIDIA/nccl#340), then check that `nvidia-smi nvlink -s` shows every link up on both GPUs."
)


def _bridge_finding(snap: Snapshot, g: Gpu, n: int, top: int) -> Finding | None:
    """A PCIe card judged against the links its bridges have, not its peers: a partly seated bridge
    takes the same links down at both ends, so the peers agree with it. A card with no link up is a
    card without a bridge (optional), named only when its peers of the run have one."""
    links = len(g.nvlinks) if isinstance(g.nvlinks, list) else 0
    evidence: dict[str, Any] = {"active_links": n, "links": links}
    if n == 0:
        if not top:
            return None
        msg = f"GPU {g.index} has no NVLink active while its peers have {top}: its traffic falls back to PCIe"
        hint = "Fit the NVLink bridge (or reseat it), or expect PCIe speed for collectives through this GPU."
        return Finding(FEWER_LINKS.code, Status.WARN, gpu_subject(g.index), msg, hint, {**evidence, "expected": top})
    geometry = bridge_links(g)
    full = expectations.healthy_nvlinks(snap, g) or links
    if n >= full:
        return None
    evidence["expected"] = full
    cost = f"collectives through it run at about {n}/{full} of the bridge speed"
    if geometry is not None and n % geometry[0]:
        per = geometry[0]
        evidence["links_per_bridge"] = per
        msg = (
            f"GPU {g.index} has {n} of {full} NVLinks active: an NVLink bridge makes contact on only "
            f"{n % per} of its {per} links (partly seated); {cost}"
        )
        return Finding(FEWER_LINKS.code, Status.FAIL, gpu_subject(g.index), msg, BRIDGE_HINT, evidence)
    if geometry is not None:
        per, bridges = geometry
        evidence["bridges"] = f"{n // per} of {bridges}"
        up = f"{n // per} of the {bridges} bridges the card takes"
        msg = f"GPU {g.index} has {n} of {full} NVLinks active: {up}; {cost}"
        hint = "Fit the missing NVLink bridge(s), or reseat the ones fitted if all are in place. " + BRIDGE_HINT
        return Finding(FEWER_LINKS.code, Status.WARN, gpu_subject(g.index), msg, hint, evidence)
    msg = f"GPU {g.index} has {n} of the {full} NVLinks NVML lists active; {cost}"
    return Finding(FEWER_LINKS.code, Status.WARN, gpu_subject(g.index), msg, BRIDGE_HINT, evidence)


def _pairs_without_nvlink(snap: Snapshot, indices: list[int]) -> list[Finding]:
    """Pairs without NVLink on a machine that has some. A pair with an end whose NVLink state is
    unreadable and no link seen is unknown: left out and named, never counted as "no NVLink"."""
    pairs = [(a, b) for a, b in combinations(indices, 2) if topo.nvlink_known(snap, a, b)]
    linked = {(a, b): topo.nvlink_count(snap, a, b) for a, b in pairs}
    if not any(linked.values()):
        return []
    unknown = [i for i in indices if not topo.nvlinks_read(snap.gpu(i))]
    known = [i for i in indices if i not in unknown]
    note = ""
    if unknown:
        note = f"; pairs with GPU {', '.join(map(str, unknown))} not judged (NVLink state unreadable: GD402)"
    bare = [(a, b) for (a, b), n in linked.items() if n == 0]
    if not bare:
        msg = f"all {len(pairs)} pairs joined by NVLink{note}"
        return [Finding(NO_NVLINK_PAIRS.code, Status.PASS, "host", msg, "", {"unknown": unknown} if unknown else {})]
    best = max(linked.values())
    levels = {f"{a}-{b}": topo.pcie_level(snap, a, b) for a, b in bare}
    evidence: dict[str, Any] = {
        "pairs_without_nvlink": levels,
        "nvlink_pairs": len(pairs) - len(bare),
        "best": f"NV{best}",
    }
    if unknown:
        evidence["unknown"] = unknown
    if topo.has_ring(known, lambda a, b: bool(linked[(min(a, b), max(a, b))])):
        # A mesh (DGX-1 V100's hybrid cube mesh): rings go around on NVLink; no pair needs PCIe.
        msg = (
            f"{len(bare)} of {len(pairs)} GPU pairs have no direct NVLink, but a ring through all "
            f"{len(known)} GPUs runs on NVLink (a mesh): NCCL's rings stay off PCIe{note}"
        )
        return [Finding(NO_NVLINK_PAIRS.code, Status.PASS, "host", msg, "", evidence)]
    sys_pairs = [p for p, level in levels.items() if level == "SYS"]
    where = f"; {len(sys_pairs)} cross SYS (the CPU interconnect)" if sys_pairs else ""
    listed = ", ".join(f"{p} {lvl}" for p, lvl in levels.items())
    msg = (
        f"{len(bare)} of {len(pairs)} GPU pairs have no NVLink while others have NV{best}{where}: "
        f"collectives over all GPUs run at PCIe speed ({listed}){note}"
    )
    return [Finding(NO_NVLINK_PAIRS.code, Status.WARN, "host", msg, NO_NVLINK_PAIRS.fix, evidence)]


def _expected(snap: Snapshot, indices: list[int], visible: int) -> Finding:
    """GD407: the healthy all-reduce busbw of the visible GPUs (of the machine's, when fewer than
    two are visible: MIG, or CUDA_VISIBLE_DEVICES naming one), with its basis."""
    gpus = indices
    scope = f"these {len(indices)} GPUs"
    if len(indices) < 2 or visible < 2:
        gpus = [g.index for g in snap.gpus if not unreadable(g)]
        if len(gpus) < 2:
            return Finding(EXPECTED.code, Status.SKIP, "host", "one GPU: no all-reduce between GPUs to expect", "")
        mig = any(g.mig_mode_current is True for g in snap.gpus)
        what = (
            "one MIG instance is visible now; the figure is for all of them with MIG off"
            if mig
            else ("one GPU is visible now; the figure is for all of them")
        )
        scope = f"the machine's {len(gpus)} GPUs ({what})"
    expect = expectations.expected_busbw(snap, gpus)
    evidence: dict[str, Any] = {"gpus": gpus, "collective": "allreduce"}
    if expect is None:
        msg = f"no expected all-reduce busbw for {scope}: their NVLink/PCIe facts are not known"
        return Finding(EXPECTED.code, Status.SKIP, "host", msg, "", evidence)
    evidence.update(expect.to_json())
    figure = evidence["expected_busbw_gbps"]  # the rounded figure the evidence carries: one number, not two
    said = f"{figure:.1f} GB/s" if expect.high_gbps is None else expect.figure()
    msg = f"all-reduce on {scope} should reach {said} busbw at 1 GiB and above ({expect.basis})"
    if not expect.certain:
        msg += f"; an estimate: {expect.unknown} would make it certain"
    return Finding(EXPECTED.code, Status.PASS, "host", msg, "", evidence)
