"""GPU interconnect facts derived from a Snapshot: NVLink counts, `nvidia-smi topo -m` labels.

Pure functions over a `Snapshot`; GPUs are named by NVML index (nvidia-smi's numbers).

    active_links(gpu)              -> int   active NVLink links of one GPU (0 without NVLink)
    nvlink_count(snap, a, b)       -> int   links joining GPUs a and b (the # of "NV#")
    has_nvswitch(snap)             -> bool  some active link ends at an NVSwitch
    nvlink_generation(snap)        -> int | None  highest NVLink version seen (3: A100, 4: H100)
    pcie_level(snap, a, b)         -> str   PIX/PXB/PHB/NODE/SYS, or "?" when not recorded
    link_label(snap, a, b)         -> str   what topo -m prints: "X", "NV18", "SYS", ...
    matrix(snap, indices)          -> list[list[str]]  labels for every ordered pair
    topo_table(snap, indices)      -> dict  a details table (render/text.py draws it)
    cpu_list(cpus)                 -> str   [0, 1, 2, 5] -> "0-2,5"

How NV# is counted (as nvidia-smi does): an active link counts toward a peer when its remote
PCI bus id is the peer's. On NVSwitch systems the remote of every link is a switch, and every
pair of GPUs is joined through the fabric by as many links as the weaker GPU has active, so a
pair shows NV<min(active links of a, of b)> (NV18 on HGX H100, NV12 on HGX A100).
"""

from __future__ import annotations

from typing import Any

from gpudoctor.snapshot import Gpu, NvLink, Snapshot

# nvidia-smi's PCIe path levels, nearest first.
PCIE_LEVELS = ("SAME", "PIX", "PXB", "PHB", "NODE", "SYS")


def normalize_bus_id(bus_id: str) -> tuple[int, int, int, int] | str:
    """'00000000:18:00.0' and '0000:18:00.0' compare equal; unparseable ids compare as text."""
    try:
        domain, bus, rest = bus_id.strip().split(":")
        dev, fn = rest.split(".")
        return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return bus_id.strip().upper()


def _links(gpu: Gpu) -> list[NvLink]:
    return [link for link in gpu.nvlinks if link.active] if isinstance(gpu.nvlinks, list) else []


def active_links(gpu: Gpu) -> int:
    return len(_links(gpu))


def switch_links(gpu: Gpu) -> int:
    return sum(1 for link in _links(gpu) if link.remote_type == "switch")


def _direct_links(gpu: Gpu, peer: Gpu) -> int:
    target = normalize_bus_id(peer.pci_bus_id)
    return sum(
        1
        for link in _links(gpu)
        if isinstance(link.remote_bus_id, str)
        and link.remote_type != "switch"
        and normalize_bus_id(link.remote_bus_id) == target
    )


def nvlink_count(snapshot: Snapshot, a: int, b: int) -> int:
    if a == b:
        return 0
    ga, gb = snapshot.gpu(a), snapshot.gpu(b)
    direct = max(_direct_links(ga, gb), _direct_links(gb, ga))
    return direct + min(switch_links(ga), switch_links(gb))


def has_nvswitch(snapshot: Snapshot) -> bool:
    return any(switch_links(g) for g in snapshot.gpus)


def nvlink_generation(snapshot: Snapshot) -> int | None:
    versions = [link.version for g in snapshot.gpus for link in _links(g) if isinstance(link.version, int)]
    return max(versions) if versions else None


def pcie_level(snapshot: Snapshot, a: int, b: int) -> str:
    pair = snapshot.pair(a, b)
    if pair is None or not isinstance(pair.pcie_level, str):
        return "?"
    return pair.pcie_level


def link_label(snapshot: Snapshot, a: int, b: int) -> str:
    if a == b:
        return "X"
    count = nvlink_count(snapshot, a, b)
    return f"NV{count}" if count else pcie_level(snapshot, a, b)


def matrix(snapshot: Snapshot, indices: list[int] | None = None) -> list[list[str]]:
    idx = [g.index for g in snapshot.gpus] if indices is None else list(indices)
    return [[link_label(snapshot, a, b) for b in idx] for a in idx]


def cpu_list(cpus: list[int]) -> str:
    """Logical CPU ids as nvidia-smi prints CPU affinity: ranges joined by commas."""
    runs: list[list[int]] = []
    for c in sorted(set(cpus)):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    out = [str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs]
    return ",".join(out)


def topo_table(snapshot: Snapshot, indices: list[int] | None = None) -> dict[str, Any]:
    """The `nvidia-smi topo -m` matrix as a details table: {"title", "columns", "rows"}."""
    idx = [g.index for g in snapshot.gpus] if indices is None else list(indices)
    labels = matrix(snapshot, idx)
    rows = []
    for i, a in enumerate(idx):
        gpu = snapshot.gpu(a)
        affinity = cpu_list(gpu.cpu_affinity) if isinstance(gpu.cpu_affinity, list) else "N/A"
        numa = str(gpu.numa_node) if isinstance(gpu.numa_node, int) else "N/A"
        rows.append([f"GPU{a}", *labels[i], affinity, numa])
    return {
        "title": "GPU topology (as nvidia-smi topo -m)",
        "columns": ["", *(f"GPU{a}" for a in idx), "CPU Affinity", "NUMA Affinity"],
        "rows": rows,
    }
