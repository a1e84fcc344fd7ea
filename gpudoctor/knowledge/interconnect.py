"""GPU interconnect facts derived from a Snapshot: NVLink counts, `nvidia-smi topo -m` labels.

Pure functions over a `Snapshot`; GPUs are named by NVML index (nvidia-smi's numbers).

    active_links(gpu)              -> int   active NVLink links of one GPU (0 without NVLink)
    nvlinks_read(gpu)              -> bool  NVML answered for its NVLinks (a list, or "no NVLink")
    nvlink_count(snap, a, b)       -> int   links joining GPUs a and b (the # of "NV#")
    nvlink_known(snap, a, b)       -> bool  whether that count is a fact (not 0 for want of a reading)
    ends_at_switch(link, buses)    -> bool  the link ends at an NVSwitch (or at a far end NCCL cannot see)
    has_nvswitch(snap)             -> bool  some active link ends at an NVSwitch
    nvlink_generation(snap, idx)   -> int | None  NVLink generation of the GPUs (3: A100, 4: H100), slowest
    arch_nvlink_generation(cc)     -> int | None  NVLink generation of an architecture ("9.0" -> 4)
    decode_nvml_nvlink_version(raw, cc) -> int | None  a raw nvmlDeviceGetNvLinkVersion answer, decoded
    nvml_nvlink_version_agrees(raw, gen) -> bool  the raw answer fits the generation in some driver style
    has_ring(nodes, joined)        -> bool  a ring over every node along joined pairs (NCCL's ring on NVLink)
    pcie_level(snap, a, b)         -> str   PIX/PXB/PHB/NODE/SYS, or "?" when not recorded
    link_label(snap, a, b)         -> str   what topo -m prints: "X", "NV18", "SYS", ...; "?" unknown
    matrix(snap, indices)          -> list[list[str]]  labels for every ordered pair
    topo_table(snap, indices)      -> dict  a details table (render/text.py draws it)
    cpu_list(cpus)                 -> str   [0, 1, 2, 5] -> "0-2,5"
    normalize_bus_id(id)           -> key   the one way to compare PCI bus ids (NVML, lspci, kernel log)
    nvml_bus_id(id)                -> str   the same id written as NVML writes it

How NV# is counted (as nvidia-smi does): an active link counts toward a peer when its remote
PCI bus id is the peer's. On NVSwitch systems the remote of every link is a switch, and every
pair of GPUs is joined through the fabric by as many links as the weaker GPU has active, so a
pair shows NV<min(active links of a, of b)> (NV18 on HGX H100, NV12 on HGX A100). A link whose
far end NVML cannot name, and that is no GPU of the snapshot, counts as an NVSwitch link, as NCCL
counts it (inside VMs the switches are often not visible).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from functools import lru_cache
from typing import Any

from gpudoctor.snapshot import Gpu, Missing, NvLink, Snapshot

# nvidia-smi's PCIe path levels, nearest first.
PCIE_LEVELS = ("SAME", "PIX", "PXB", "PHB", "NODE", "SYS")


@lru_cache(maxsize=4096)  # the same few ids are compared per pair of GPUs
def normalize_bus_id(bus_id: str) -> tuple[int, int, int, int] | str:
    """The one PCI bus id comparison key: NVML's '00000000:18:00.0', lspci's '0000:18:00.0' and
    the kernel log's 'PCI:0000:18:00' (no function: a GPU is function 0) compare equal.
    Unparseable ids compare as text."""
    text = bus_id.strip()
    if text[:4].upper() == "PCI:":
        text = text[4:]
    try:
        domain, bus, rest = text.split(":")
        dev, _, fn = rest.partition(".")
        return int(domain, 16), int(bus, 16), int(dev, 16), int(fn or "0", 16)
    except ValueError:
        return bus_id.strip().upper()


def nvml_bus_id(bus_id: str) -> str:
    """Any form normalize_bus_id reads -> NVML's '00000000:18:00.0' (what snapshots store).
    Raises ValueError for an id it cannot parse."""
    key = normalize_bus_id(bus_id)
    if isinstance(key, str):
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, dev, fn = key
    return f"{domain:08X}:{bus:02X}:{dev:02X}.{fn:x}"


def _links(gpu: Gpu) -> list[NvLink]:
    return [link for link in gpu.nvlinks if link.active] if isinstance(gpu.nvlinks, list) else []


def active_links(gpu: Gpu) -> int:
    return len(_links(gpu))


def nvlinks_read(gpu: Gpu) -> bool:
    """Whether NVML answered for this GPU's NVLinks: a list of links, or NOT_SUPPORTED for link 0
    (the probe's Missing("unsupported"): the GPU has no NVLink, a fact). Any other Missing
    (error, no_permission, gpu_lost, not collected) leaves its links unknown, not absent."""
    links = gpu.nvlinks
    return isinstance(links, list) or (isinstance(links, Missing) and links.reason == "unsupported")


def gpu_buses(snapshot: Snapshot) -> set[tuple[int, int, int, int] | str]:
    """The bus ids of the GPUs the snapshot sees (normalize_bus_id keys)."""
    return set(_buses(snapshot))


def _buses(snapshot: Snapshot) -> frozenset[tuple[int, int, int, int] | str]:
    return snapshot.derived("gpu_buses", lambda: frozenset(normalize_bus_id(g.pci_bus_id) for g in snapshot.gpus))


def ends_at_switch(link: NvLink, gpus: AbstractSet[tuple[int, int, int, int] | str] | None = None) -> bool:
    """Whether a link ends at an NVSwitch as NCCL reads it: NVML says so, or NVML cannot name the
    far end (type "unknown" or unreadable) and it is no GPU in `gpus`. Inside a VM the NVSwitches
    are often invisible; NCCL then assumes one (src/graph/xml.cc: "Remote NVLink device is not
    visible inside this VM. Assume NVSwitch."). Without `gpus`, only NVML's word counts."""
    if link.remote_type == "switch":
        return True
    if gpus is None or link.remote_type in ("gpu", "ibmnpu"):
        return False
    remote = link.remote_bus_id
    return not (isinstance(remote, str) and normalize_bus_id(remote) in gpus)


def switch_links(gpu: Gpu, gpus: AbstractSet[tuple[int, int, int, int] | str] | None = None) -> int:
    """Active links of `gpu` ending at an NVSwitch (ends_at_switch; `gpus`: the snapshot's bus ids)."""
    return sum(1 for link in _links(gpu) if ends_at_switch(link, gpus))


class _NvLinkFacts:
    """Per GPU of a snapshot, made once (nvlink_count is asked for every pair: N^2 questions, each
    of which recomputed the bus map and walked every link made the static checks N^3 and worse)."""

    def __init__(self, snapshot: Snapshot) -> None:
        buses = _buses(snapshot)
        self.switch: dict[int, int] = {}  # GPU index -> active links ending at an NVSwitch
        self.direct: dict[int, Counter[tuple[int, int, int, int] | str]] = {}  # -> far GPU bus -> links
        self.bus: dict[int, tuple[int, int, int, int] | str] = {}
        for g in reversed(snapshot.gpus):  # the first GPU of an index wins, as Snapshot.gpu
            self.switch[g.index] = switch_links(g, buses)
            self.bus[g.index] = normalize_bus_id(g.pci_bus_id)
            self.direct[g.index] = Counter(
                normalize_bus_id(link.remote_bus_id)
                for link in _links(g)
                if isinstance(link.remote_bus_id, str) and link.remote_type != "switch"
            )


def nvlink_count(snapshot: Snapshot, a: int, b: int) -> int:
    if a == b:
        return 0
    snapshot.gpu(a), snapshot.gpu(b)  # KeyError for a GPU the snapshot lacks
    facts = snapshot.derived("nvlink_facts", lambda: _NvLinkFacts(snapshot))
    direct = max(facts.direct[a][facts.bus[b]], facts.direct[b][facts.bus[a]])
    return direct + min(facts.switch[a], facts.switch[b])


def nvlink_known(snapshot: Snapshot, a: int, b: int) -> bool:
    """Whether nvlink_count(a, b) is a fact: some link between them was seen, or both GPUs'
    NVLink state was read. A pair with an unreadable end and no link seen is unknown."""
    ga, gb = snapshot.gpu(a), snapshot.gpu(b)
    return bool(nvlink_count(snapshot, a, b)) or (nvlinks_read(ga) and nvlinks_read(gb))


def has_nvswitch(snapshot: Snapshot) -> bool:
    buses = _buses(snapshot)
    return any(switch_links(g, buses) for g in snapshot.gpus)


# The NVLink generation of each architecture, by CUDA compute capability. This, not NVML's
# nvmlDeviceGetNvLinkVersion, decides the generation: drivers answer that call differently
# (older ones the plain generation, A100 -> 3, H100 -> 4; newer ones nvml.h's
# nvmlNvlinkVersion_t enum, A100 -> 4 or 5, H100 -> 6; some report H100 as 7, the enum's 5.0).
# 8.6 (GA102: RTX 3090, A6000, A40) is NVLink 3 over bridges; its lower rate per link (4 x 14.0625
# GB/s, GA102 whitepaper) is in expectations.py, which keys rates on the compute capability.
# 7.5 (TU102: RTX 2080 Ti, Titan RTX, Quadro RTX 6000/8000) is NVLink 2 over bridges, two x8 links
# (Turing whitepaper: "second-generation NVLink", 25 GB/s per link per direction).
ARCH_NVLINK_GENERATION = {"6.0": 1, "7.0": 2, "7.5": 2, "8.0": 3, "8.6": 3, "9.0": 4}
ARCH_NVLINK_GENERATION_BY_MAJOR = {10: 5}  # Blackwell datacentre: 10.0 B200, 10.3 B300

# nvml.h nvmlNvlinkVersion_t: NVML_NVLINK_VERSION_1_0 = 1, 2_0 = 2, 2_2 = 3, 3_0 = 4, 3_1 = 5,
# 4_0 = 6, 5_0 = 7 -> the generation (major version) each stands for.
NVML_NVLINK_ENUM_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5}
NVLINK_GENERATIONS = range(1, 6)  # generations a driver may answer in the plain style


def arch_nvlink_generation(compute_capability: str | Missing) -> int | None:
    """The NVLink generation of a GPU architecture; None when unknown (or not NVLink-capable)."""
    if not isinstance(compute_capability, str):
        return None
    cc = compute_capability.strip()
    if cc in ARCH_NVLINK_GENERATION:
        return ARCH_NVLINK_GENERATION[cc]
    try:
        major = int(cc.split(".")[0])
    except ValueError:
        return None
    return ARCH_NVLINK_GENERATION_BY_MAJOR.get(major)


def _nvml_readings(raw: int) -> set[int]:
    """The generations a raw nvmlDeviceGetNvLinkVersion answer can mean, across driver styles."""
    out = set()
    if raw in NVML_NVLINK_ENUM_GENERATION:
        out.add(NVML_NVLINK_ENUM_GENERATION[raw])
    if raw in NVLINK_GENERATIONS:
        out.add(raw)
    return out


def nvml_nvlink_version_agrees(raw: int, generation: int) -> bool:
    """Whether a raw NVML answer fits `generation` as some driver writes it (plain or enum).

    The H100-answers-7 quirk does not fit either style: it reads as a disagreement, which is
    why the architecture and not this answer decides the generation.
    """
    return generation in _nvml_readings(raw)


def decode_nvml_nvlink_version(raw: int, compute_capability: str | Missing = "") -> int | None:
    """The NVLink generation for one link: the architecture's when known, else the raw answer
    read the cautious way (the lower generation where the two driver styles differ)."""
    arch = arch_nvlink_generation(compute_capability)
    if arch is not None:
        return arch
    readings = _nvml_readings(raw)
    return min(readings) if readings else None


def gpu_nvlink_generation(gpu: Gpu) -> int | None:
    """One GPU's NVLink generation: from its architecture, else its links' recorded versions."""
    if not _links(gpu):
        return None
    arch = arch_nvlink_generation(gpu.compute_capability)
    if arch is not None:
        return arch
    versions = [link.version for link in _links(gpu) if isinstance(link.version, int)]
    return min(versions) if versions else None


def nvlink_generation(snapshot: Snapshot, indices: list[int] | None = None) -> int | None:
    """The NVLink generation of the GPUs `indices` (all by default) that have active links:
    the slowest one's, since a pair runs at the lower generation. None without NVLink."""
    gpus = snapshot.gpus if indices is None else [snapshot.gpu(i) for i in indices]
    gens = [g for g in (gpu_nvlink_generation(gpu) for gpu in gpus) if g is not None]
    return min(gens) if gens else None


def nvml_nvlink_disagreements(snapshot: Snapshot, indices: list[int] | None = None) -> dict[int, list[int]]:
    """GPU index -> the raw NVML NVLink versions that do not fit its architecture's generation
    in any driver style (the cross-check; empty when all agree or nothing was recorded)."""
    gpus = snapshot.gpus if indices is None else [snapshot.gpu(i) for i in indices]
    out: dict[int, list[int]] = {}
    for gpu in gpus:
        arch = arch_nvlink_generation(gpu.compute_capability)
        if arch is None:
            continue
        raws = {link.version_raw for link in _links(gpu) if isinstance(link.version_raw, int)}
        bad = sorted(r for r in raws if not nvml_nvlink_version_agrees(r, arch))
        if bad:
            out[gpu.index] = bad
    return out


def has_ring(nodes: list[int], joined: Callable[[int, int], bool]) -> bool:
    """Whether a ring visits every node once over `joined` pairs (a Hamiltonian cycle): what an
    NCCL ring needs to stay on NVLink. Two nodes need one joined pair. Exhaustive search for the
    few GPUs of a mesh board (8 on a DGX-1); past 12 nodes, every node joined to two others and
    all of them connected stands in for it."""
    if len(nodes) < 3:
        return len(nodes) < 2 or joined(nodes[0], nodes[1])
    near = {a: [b for b in nodes if b != a and joined(a, b)] for a in nodes}
    seen, todo = {nodes[0]}, [nodes[0]]
    while todo:
        for b in near[todo.pop()]:
            if b not in seen:
                seen.add(b)
                todo.append(b)
    if len(seen) < len(nodes) or any(len(n) < 2 for n in near.values()):
        return False
    if len(nodes) > 12:
        return True
    first = nodes[0]

    def walk(at: int, left: frozenset[int]) -> bool:
        if not left:
            return first in near[at]
        return any(walk(b, left - {b}) for b in near[at] if b in left)

    return walk(first, frozenset(nodes[1:]))


def pcie_level(snapshot: Snapshot, a: int, b: int) -> str:
    pair = snapshot.pair(a, b)
    if pair is None or not isinstance(pair.pcie_level, str):
        return "?"
    return pair.pcie_level


def link_label(snapshot: Snapshot, a: int, b: int) -> str:
    if a == b:
        return "X"
    count = nvlink_count(snapshot, a, b)
    if count:
        return f"NV{count}"
    # No NVLink seen: the PCIe path, unless an end's NVLinks could not be read (then the pair
    # may well be NVLink: "?", never a PCIe level passed off as the connection).
    return pcie_level(snapshot, a, b) if nvlink_known(snapshot, a, b) else "?"


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


def _numa_affinity(gpu: Gpu) -> str:
    """nvidia-smi topo -m's "NUMA Affinity": the nodes near the GPU (nvmlDeviceGetMemoryAffinity);
    a snapshot from before that reading has only the GPU's own node id, where GPU memory is a node."""
    if isinstance(gpu.numa_affinity, list) and gpu.numa_affinity:
        return cpu_list(gpu.numa_affinity)
    return str(gpu.numa_node) if isinstance(gpu.numa_node, int) else "N/A"


def topo_table(snapshot: Snapshot, indices: list[int] | None = None) -> dict[str, Any]:
    """The `nvidia-smi topo -m` matrix as a details table: {"title", "columns", "rows"}."""
    idx = [g.index for g in snapshot.gpus] if indices is None else list(indices)
    labels = matrix(snapshot, idx)
    rows = []
    for i, a in enumerate(idx):
        gpu = snapshot.gpu(a)
        affinity = cpu_list(gpu.cpu_affinity) if isinstance(gpu.cpu_affinity, list) else "N/A"
        numa = _numa_affinity(gpu)
        rows.append([f"GPU{a}", *labels[i], affinity, numa])
    return {
        "title": "GPU topology (as nvidia-smi topo -m)",
        "columns": ["", *(f"GPU{a}" for a in idx), "CPU Affinity", "NUMA Affinity"],
        "rows": rows,
    }
