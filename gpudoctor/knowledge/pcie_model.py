"""The all-reduce bound of GPUs whose ring crosses PCIe (knowledge/expectations.py uses it).

    pcie_figure(snap, gpus, exits=1) -> PcieFigure | None   busbw a healthy machine reaches, or a range
    p2p_cutoff(snap, gpus)           -> DefaultLevel        the P2P level NCCL runs with here
    uses_p2p(snap, a, b, cutoff)     -> bool                whether NCCL talks P2P between two GPUs
    host_path_doubt(snap, gpus)      -> str                 why host-memory figures are not bare-metal ones

The ring crosses PCIe: the slowest GPU's PCIe generation x width at NCCL's rates (shared k ways
where k GPUs below one PCIe switch send through host memory over its uplink), times the efficiency of
the transport (P2P where NCCL uses it: NVML offers it and the pair is within NCCL's P2P level; else host
memory), and a further factor when a host-memory hop (or a P2P hop off AMD) crosses the CPU interconnect
(SYS). `exits` is how many GPUs of each NVLink island the ring can leave it through (bridged pairs: 2):
NCCL's rings leave each island through different GPUs' PCIe links, so that many PCIe hops run side by
side, up to the bridge's own rate.

Where no published measurement backs a class the figure is a range with its basis and `certain` False;
GD601 then warns below the low end and never fails (what would make it certain is named).
"""

from __future__ import annotations

from dataclasses import field
from itertools import combinations

from gpudoctor.knowledge import interconnect as topology
from gpudoctor.knowledge import nccl_rules
from gpudoctor.knowledge.pci_paths import TRANSLATED, gpu_node
from gpudoctor.knowledge.versions import version_tuple
from gpudoctor.records import Record, record
from gpudoctor.snapshot import Gpu, Snapshot, Virtualization

# NCCL's PCIe rate: width x per-lane speed / 80 (src/graph/topo.cc, kvDictPciGen, in 100 Mb/s per
# lane: Gen3 60, Gen4 120, Gen5 240, Gen6 480), so x16 Gen3 = 12 GB/s ("PCI_BW 12.0 // PCI Gen3
# x16", topo.h), Gen4 24, Gen5 48.
NCCL_PCIE_GBPS_PER_LANE = {1: 0.1875, 2: 0.375, 3: 0.75, 4: 1.5, 5: 3.0, 6: 6.0}

# Raw PCIe rate per lane after line encoding, GB/s per direction (x16 Gen4 ~31.5, Gen5 ~63:
# ml-engineering network/README.md). Host-link checks compare against these (GD405, link probes).
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# PCIe rings (heuristic factors fitted on the PCIe measurements in tests/reference/, not a law).
# NCCL uses P2P for a pair when NVML offers it and the pair is no further apart than NCCL's P2P
# level (src/graph/paths.cc, ncclTopoCheckP2p: PXB by default, SYS on AMD CPUs with at most two
# GPUs from 2.23, SYS on AMD before 2.23: gpudoctor/knowledge/nccl_rules.py). P2P reaches NCCL's PCIe rate:
# 2x V100 PCIe Gen3 PIX 11.68 of 12 (superbench-results v0.2.1), 4x RTX 4090 with P2P behind one
# switch 25.95 of 24 (tinygrad/open-gpu-kernel-modules#36), so 1.0. Other pairs go through host
# memory (NCCL's SHM transport), 0.75 of it (3x A100 PCIe Gen4 NODE 20 of 24, nccl-tests#178; 4x
# RTX 5090 Gen5 35 of 48, NVIDIA/nccl#1639); x 0.8 more when a host-memory hop crosses the CPU
# interconnect (8x RTX 5090 on two sockets 28 against 35 on four GPUs, nccl#1639). sjeaugey (nccl#1639):
# "On PCI systems, the performance you get is usually determined by the bandwidth your CPU and memory
# can deliver". A P2P hop across AMD sockets takes no such factor: P2P rings across two AMD sockets
# reach 0.86-0.95 of NCCL's rate, inside [0.8, 1.25] of it, where x 0.8 put the last above the top of
# the model's range: 8x RTX 4090 on 2x EPYC 7542 20.64 of 24 (blog.chlc.cc), 8x RTX 5090 on 2x EPYC 9575F 45.70 of 48
# (aikitoria/open-gpu-kernel-modules README), 7 Blackwell cards on dual Turin 41.3-41.7 of 48
# (voipmonitor/rtx6kpro hardware/pcie-bandwidth.md); P2P write copies across those sockets run at
# 55.6 against 56.6 GB/s within one (the aikitoria README's p2pBandwidthLatencyTest). No P2P ring
# across Intel sockets was found, so there a P2P hop keeps the 0.8 (NCCL's default never takes it).
#
# Host memory traffic of GPUs behind one PCIe switch (pairs at PIX/PXB/SAME) all crosses the
# switch's uplink: NCCL routes a pair without P2P through the CPU (paths.cc, addInterStep: "Divert
# all traffic through the CPU") and its ring search takes each ring's bandwidth from every link the
# path crosses (search.cc, followPath), so k such GPUs share the uplink k ways. The uplink's width
# is not in the snapshot: it is taken as the GPUs' own (a heuristic; NCCL reads it from sysfs).
# 2x RTX 2080 Ti on one switch without P2P: 4.00 GB/s against 12 / 2 x 0.75 = 4.5 (the
# Anthony-Hoo AutoDL report, tests/reference/).
PCIE_P2P_EFFICIENCY = 1.0
PCIE_HOST_EFFICIENCY = 0.75
PCIE_SYS_FACTOR = 0.8
SWITCH_LEVELS = ("SAME", "PIX", "PXB")  # nvidia-smi levels of two GPUs below one PCIe switch
PCIE_SOURCE = (
    "PCIe factors fitted on 2x V100 PCIe 11.68 GB/s (superbench-results v0.2.1), 4x RTX 4090 P2P 25.95 "
    "(tinygrad/open-gpu-kernel-modules#36), 3x A100 PCIe 20 (nccl-tests#178), 4x/8x RTX 5090 35/28 "
    "(NVIDIA/nccl#1639), P2P across sockets 8x RTX 5090 45.70 (aikitoria/open-gpu-kernel-modules README); P2P "
    "level and host paths through the CPU from nccl src/graph/paths.cc, search.cc"
)

# Host-memory paths that are not bare metal's: inside a VM every staged copy crosses the hypervisor's
# IOMMU mappings and the guest sees virtual root ports, and on bare metal an IOMMU that translates the
# GPUs' DMA does the same. The bare-metal factors above were fitted without either. Heuristic range
# (no published VM figure had its readings: tests/reference/pcie_class_busbw.md): from this share of
# the bare-metal figure up to it.
VM_HOST_LOW = 0.35
# P2P that NCCL_P2P_LEVEL widens beyond NCCL's default: NCCL's own default keeps it off because it is
# not always faster (nccl-tests#74: 8x A40 on AMD EPYC, all-reduce "slightly slower if I allow
# peer-to-peer communication via PCIe"): between the host-memory and the P2P figure.


@record
class PcieFigure(Record):
    busbw_gbps: float  # the figure to hold a run to (the low end of a range)
    basis: str
    high_gbps: float | None = None  # the top of the range, when the figure is one
    certain: bool = True
    unknown: str = ""  # what would make an uncertain figure certain
    notes: list[str] = field(default_factory=list)


def p2p_ok(snapshot: Snapshot, a: int, b: int) -> bool | None:
    pair = snapshot.pair(a, b)
    if pair is None:
        return None
    statuses = [s for s in (pair.p2p_read, pair.p2p_write) if isinstance(s, str)]
    if not statuses:
        return None
    return all(s == "ok" for s in statuses)


def default_cutoff(snapshot: Snapshot, gpus: int) -> nccl_rules.DefaultLevel:
    """NCCL's default P2P level for a run on `gpus` GPUs of this node: nccl_rules.default_p2p_level for
    the CPU and NCCL version; a CPU the snapshot does not name is taken as PXB, the default of current
    NCCL on every CPU but AMD."""
    host = snapshot.host
    arch, vendor = nccl_rules.cpu_kind(
        host.cpu_arch if isinstance(host.cpu_arch, str) else None,
        host.cpu_vendor if isinstance(host.cpu_vendor, str) else None,
    )
    if not arch:
        return nccl_rules.DefaultLevel("PXB", "NCCL's default PXB (CPU not recorded)")
    nccl = snapshot.software.torch_nccl
    level = nccl_rules.default_p2p_level(version_tuple(nccl) if isinstance(nccl, str) else None, arch, vendor, gpus)
    return nccl_rules.DefaultLevel(level.level, f"NCCL's default {level.level}, {level.basis}")


def p2p_cutoff(snapshot: Snapshot, gpus: int) -> nccl_rules.DefaultLevel:
    """The P2P level NCCL runs with: its default, widened by NCCL_P2P_LEVEL when that reaches further.
    A variable that cuts P2P (a narrower NCCL_P2P_LEVEL, NCCL_P2P_DISABLE) is left out on purpose: it
    is a fault GD62x names, whose cost GD601 must see, as on NVLink machines."""
    default = default_cutoff(snapshot, gpus)
    value = snapshot.env.get("NCCL_P2P_LEVEL")
    wider = nccl_rules.level(value) if value is not None else None
    if wider is not None and nccl_rules.RANK[wider] > nccl_rules.RANK[default.level]:
        return nccl_rules.DefaultLevel(wider, f"NCCL_P2P_LEVEL={value} widens {default.basis}")
    return default


def uses_p2p(snapshot: Snapshot, a: int, b: int, cutoff: str) -> bool:
    """Whether NCCL talks P2P between GPUs a and b (NVML offers it, not further apart than the cut-off;
    an unrecorded status or level is taken as near and offered)."""
    if p2p_ok(snapshot, a, b) is False:
        return False
    level = topology.pcie_level(snapshot, a, b)
    path = nccl_rules.NVIDIA_SMI_TO_NCCL.get(level, "PIX" if level == "?" else "SYS")
    return nccl_rules.RANK[path] <= nccl_rules.RANK[cutoff]


def switch_groups(snapshot: Snapshot, indices: list[int]) -> list[list[int]]:
    """The GPUs below one PCIe switch (joined by SAME/PIX/PXB pairs), groups of two or more."""
    group = {i: {i} for i in indices}
    for a, b in combinations(indices, 2):
        if topology.pcie_level(snapshot, a, b) in SWITCH_LEVELS and group[a] is not group[b]:
            merged = group[a] | group[b]
            for i in merged:
                group[i] = merged
    unique = {id(g): g for g in group.values()}
    return sorted((sorted(g) for g in unique.values() if len(g) > 1), key=lambda g: g[0])


def host_path_doubt(snapshot: Snapshot, gpus: list[Gpu]) -> str:
    """Why host-memory figures may not be bare metal's here ("" when nothing says so): a virtual
    machine (CPUID's hypervisor bit), or an IOMMU that translates the GPUs' DMA."""
    virt = snapshot.host.virtualization
    if isinstance(virt, Virtualization) and virt.hypervisor is True:
        vendor = virt.sys_vendor if isinstance(virt.sys_vendor, str) else ""
        return f"a virtual machine{f' ({vendor})' if vendor else ''}"
    nodes = [gpu_node(snapshot, g) for g in gpus]
    if nodes and all(n is not None and n.iommu_type in TRANSLATED for n in nodes):
        return "an IOMMU that translates the GPUs' DMA (IOMMU domain DMA)"
    return ""


def _amd(snapshot: Snapshot) -> bool:
    host = snapshot.host
    arch = host.cpu_arch if isinstance(host.cpu_arch, str) else None
    vendor = host.cpu_vendor if isinstance(host.cpu_vendor, str) else None
    return nccl_rules.cpu_kind(arch, vendor) == ("x86", "amd")


def _rates(gpus: list[Gpu]) -> dict[int, tuple[float, int, int]] | None:
    rates: dict[int, tuple[float, int, int]] = {}
    for gpu in gpus:
        gen, width = gpu.pcie_gen_max, gpu.pcie_width_max
        if not isinstance(gen, int) or not isinstance(width, int) or gen not in NCCL_PCIE_GBPS_PER_LANE:
            return None
        rates[gpu.index] = (NCCL_PCIE_GBPS_PER_LANE[gen] * width, gen, width)
    return rates


def pcie_figure(snapshot: Snapshot, gpus: list[Gpu], exits: int = 1, cap: float | None = None) -> PcieFigure | None:
    """The busbw of a ring over these GPUs that crosses PCIe; `exits` PCIe hops side by side (up to
    `cap`, the NVLink islands' own rate). None when a GPU's PCIe link is not recorded."""
    rates = _rates(gpus)
    if rates is None:
        return None
    indices = sorted(rates)
    link, gen, width = min(rates.values())
    pairs = list(combinations(indices, 2))
    default = default_cutoff(snapshot, len(indices))
    cutoff = p2p_cutoff(snapshot, len(indices))
    host = [p for p in pairs if not uses_p2p(snapshot, *p, cutoff.level)]
    widened = [p for p in pairs if p not in host and not uses_p2p(snapshot, *p, default.level)]
    bound, shared = link, ""
    for group in switch_groups(snapshot, indices):
        # Host-staged hops of every GPU in the group cross its uplink; with P2P inside the group
        # the ring enters and leaves it once.
        staged = any(a in group and b in group for a, b in host)
        flows = len(group) if staged else (1 if len(group) < len(indices) else 0)
        uplink = min(rates[i][0] for i in group)
        if flows > 1 and uplink / flows < bound:
            bound = uplink / flows
            shared = f" / {flows} (GPUs {', '.join(map(str, group))} share one PCIe switch uplink)"
    factor = PCIE_HOST_EFFICIENCY if host else PCIE_P2P_EFFICIENCY
    if not host:
        how = "P2P" + (", P2P status unknown: assumed" if any(p2p_ok(snapshot, *p) is None for p in pairs) else "")
    elif any(p2p_ok(snapshot, *p) is False for p in host):
        how = "through host memory (no P2P)"
    else:
        how = f"through host memory (pairs beyond {cutoff.level}: {cutoff.basis})"
    basis = f"PCIe Gen{gen} x{width} = {link:g} GB/s (NCCL's rate){shared}" + (
        f", {how}" if factor == 1 else f" x {factor:g} {how}"
    )
    crosses = any(topology.pcie_level(snapshot, a, b) == "SYS" for a, b in pairs)
    if crosses and (host or not _amd(snapshot)):
        factor *= PCIE_SYS_FACTOR
        basis += f" x {PCIE_SYS_FACTOR:g} (a pair crosses the CPU interconnect, SYS)"
    elif crosses:
        basis += " (a P2P pair crosses the CPU interconnect of an AMD host, SYS: no further factor)"
    busbw = bound * factor
    if exits > 1:
        top = busbw * exits if cap is None else min(busbw * exits, cap)
        basis += (
            f"; the ring leaves each NVLink island through {exits} GPUs' PCIe links side by side: up to {top:.1f} GB/s"
        )
        return PcieFigure(
            busbw,
            basis,
            top,
            False,
            "a published measurement of several bridged pairs in one box (Azure's NC96ads A100 v4 pass floor, "
            "25 GB/s at 8 GiB, sits inside the range)",
        )
    if widened:
        low = bound * PCIE_HOST_EFFICIENCY * (PCIE_SYS_FACTOR if crosses else 1.0)  # the host-memory figure
        basis += (
            f"; {cutoff.basis}: P2P on {len(widened)} pair(s) NCCL's default keeps off, which is not always "
            f"faster than host memory (nccl-tests#74): {low:.1f}-{busbw:.1f} GB/s"
        )
        return PcieFigure(low, basis, busbw, False, "a run with and without NCCL_P2P_LEVEL on this machine")
    doubt = host_path_doubt(snapshot, gpus) if host else ""
    if doubt:
        low = busbw * VM_HOST_LOW
        basis += (
            f"; through host memory on {doubt}, whose staged copies the bare-metal factors do not cover: "
            f"{low:.1f}-{busbw:.1f} GB/s"
        )
        return PcieFigure(low, basis, busbw, False, "published busbw of this VM or IOMMU setup (or --min-busbw)")
    return PcieFigure(busbw, basis)
