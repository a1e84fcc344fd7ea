"""How far a NIC is from a GPU on the PCIe tree, in `nvidia-smi topo -m`'s words: PIX, PXB, PHB,
NODE, SYS. Pure functions over the PCI places the network probe records (`Network.pci`).

The walk is NCCL's (src/graph/xml.cc, ncclTopoGetXmlFromSys): from a device's sysfs path, the
parent "switch" is the grand-parent PCI function (the downstream port is skipped, so a switch is
named by its upstream port), and a path component that is not a PCI function (`pci0000:17`) is
the host bridge, where the walk stops at the CPU. Then, as NCCL's path search does
(src/graph/paths.cc) and nvidia-smi's legend says:

    PIX   the two hang below one PCIe switch (at most one bridge between them)
    PXB   below several switches, without reaching the host bridge
    PHB   through the host bridge (the CPU)
    NODE  through two host bridges of one NUMA node (NCCL counts this as PHB)
    SYS   across the CPU interconnect (different NUMA nodes)

NCCL uses GPUDirect RDMA up to PXB by default (NCCL_NET_GDR_LEVEL, src/graph/paths.cc): a GPU
whose nearest NIC is PHB or further sends through host memory.
"""

from __future__ import annotations

import re

from gpudoctor.knowledge.interconnect import nvml_bus_id
from gpudoctor.snapshot import PciPlace

LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _split(path: str) -> tuple[str, list[str]]:
    """(host bridge, PCI functions below it, top first). The host bridge is everything up to the
    last component that is not a PCI function (VMD domains nest a second `pci10000:e0`)."""
    parts = [p for p in path.split("/") if p]
    last_root = max((i for i, p in enumerate(parts) if not _BDF.match(p)), default=-1)
    return "/".join(parts[: last_root + 1]), [p.lower() for p in parts[last_root + 1 :]]


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's '00000000:18:00.0' (or any form topology.normalize_bus_id reads) -> sysfs's
    '0000:18:00.0'. Raises ValueError when it is not a bus id."""
    domain, rest = nvml_bus_id(bus_id).split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def switches(path: str) -> list[str]:
    """The PCIe switches above a device, nearest first, each named by its upstream port."""
    _, functions = _split(path)
    out = []
    i = len(functions) - 1
    while i - 2 >= 0:
        i -= 2
        out.append(functions[i])
    return out


def level(a: PciPlace, b: PciPlace) -> str:
    """The topo -m word for the path between two PCI devices."""
    bridge_a, _ = _split(a.path)
    bridge_b, _ = _split(b.path)
    if bridge_a != bridge_b:
        same_numa = a.numa_node is None or b.numa_node is None or a.numa_node == b.numa_node
        return "NODE" if same_numa else "SYS"
    up_a, up_b = switches(a.path), switches(b.path)
    for i, switch in enumerate(up_a):
        if switch in up_b:
            return "PIX" if i + up_b.index(switch) == 0 else "PXB"
    return "PHB"


def rank(name: str) -> int:
    """Order of the levels, nearest first (unknown names sort last)."""
    return LEVELS.index(name) if name in LEVELS else len(LEVELS)


def near(name: str) -> bool:
    """Close enough for NCCL's default GPUDirect RDMA cut-off (PXB)."""
    return rank(name) <= rank("PXB")
