"""Snapshots of the machines measured in tests/reference/allreduce_busbw.json, and degraded copies.

Each entry names its GPU model, count, interconnect class and, where the source printed one, a
real `nvidia-smi topo -m` matrix (tests/reference/topo/). The builder turns that into the facts
the probe would record: NVLinks (to NVSwitch chips, or to the peers the matrix shows as NV#),
PCIe levels for the other pairs, P2P status, PCIe generation/width, CPU, NCCL version, CUDA driver
version and NCCL environment, and `vm` (a cloud VM: CPUID's hypervisor bit set). Where the
matrix shows NV# for a pair, its PCIe level is taken from
the NUMA affinity column (same node: NODE, else SYS); machines without a matrix take the entry's
`pcie_level` for every pair, else are two sockets with the GPUs split evenly (the HGX/DGX
layout), NODE within a socket. Entries marked `unfit` (with the reason) are kept as evidence but
not measured against.

    python -m tests.helpers.reference_machines     # the corpus: published, expected, ratio, verdict, basis
"""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from gpudoctor.snapshot import (
    SCHEMA_VERSION,
    Driver,
    Gpu,
    GpuPair,
    Host,
    Missing,
    NvLink,
    Snapshot,
    Software,
    Virtualization,
)
from tests.paths import REFERENCE

CORPUS = REFERENCE / "allreduce_busbw.json"
NOT_SAID = Missing("not_collected", "not stated by the source")


@dataclass(frozen=True)
class Measured:
    id: str
    entry: dict[str, Any]
    snapshot: Snapshot
    indices: list[int]  # the GPUs (NVML indices) the measured run used
    collective: str
    busbw_gbps: float


@dataclass(frozen=True)
class Topo:
    labels: dict[tuple[int, int], str]  # (a, b), a < b -> "NV12", "SYS", ...
    numa: dict[int, str]  # GPU -> NUMA affinity cell ("" when absent)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in (line.split("\t") if "\t" in line else re.split(r" {2,}", line.strip()))]


def parse_topo(text: str) -> Topo:
    """The GPU-to-GPU labels and NUMA affinity of an `nvidia-smi topo -m` matrix."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next(line for line in lines if "GPU0" in line and not line.startswith("GPU0"))
    columns = [c for c in _cells(header) if c]
    numa_col = columns.index("NUMA Affinity") if "NUMA Affinity" in columns else None
    labels: dict[tuple[int, int], str] = {}
    numa: dict[int, str] = {}
    for line in lines:
        cells = _cells(line)
        if not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        a = int(cells[0][3:])
        values = cells[1:]
        for col, value in zip(columns, values, strict=False):  # NIC rows are shorter
            if re.fullmatch(r"GPU\d+", col) and int(col[3:]) != a:
                b = int(col[3:])
                labels[(min(a, b), max(a, b))] = value
        numa[a] = values[numa_col] if numa_col is not None and numa_col < len(values) else ""
    return Topo(labels, numa)


def _bus(i: int) -> str:
    return f"00000000:{0x10 + 0x10 * i:02X}:00.0"


SWITCHES = [f"00000000:{b:02X}:00.0" for b in (0x05, 0x06, 0x07, 0x08)]


def _level(entry: dict[str, Any], topo: Topo | None, a: int, b: int) -> str:
    label = topo.labels.get((a, b)) if topo else None
    if label and not label.startswith("NV"):
        return label
    if topo is None and entry.get("pcie_level"):
        return str(entry["pcie_level"])
    if topo and topo.numa.get(a) and topo.numa.get(b):
        return "NODE" if topo.numa[a] == topo.numa[b] else "SYS"
    sockets = int(entry.get("sockets", 2 if entry["count"] > 2 else 1))
    per = max(1, entry["count"] // sockets)
    return "NODE" if a // per == b // per else "SYS"


def _nvlinks(entry: dict[str, Any], topo: Topo | None, i: int) -> list[NvLink] | Missing:
    fabric = entry["fabric"]
    if fabric == "nvswitch":
        n = entry["nvlinks_per_gpu"]
        return [NvLink(k, True, Missing("not_collected"), SWITCHES[k % 4], "switch") for k in range(n)]
    if fabric in ("mesh", "bridge") and topo is not None:
        links: list[NvLink] = []
        for (a, b), label in sorted(topo.labels.items()):
            if i in (a, b) and label.startswith("NV"):
                peer = b if a == i else a
                links += [
                    NvLink(len(links) + k, True, Missing("not_collected"), _bus(peer), "gpu")
                    for k in range(int(label[2:]))
                ]
        return links
    if fabric == "bridge":  # a pair without a printed matrix: GPU 0 and 1 bridged
        peer = 1 - i
        return [NvLink(k, True, Missing("not_collected"), _bus(peer), "gpu") for k in range(entry["nvlinks_per_gpu"])]
    return Missing("unsupported", "this GPU has no NVLink")


def build(entry: dict[str, Any]) -> Snapshot:
    topo = parse_topo((REFERENCE / entry["topo"]).read_text()) if entry.get("topo") else None
    gen, width = entry["pcie"]
    gpus = [
        Gpu(
            index=i,
            uuid=f"GPU-{i:08x}-0000-4000-8000-{zlib.crc32(entry['id'].encode()):012x}",
            name=entry["gpu"],
            pci_bus_id=_bus(i),
            compute_capability=entry["cc"],
            pcie_gen_current=gen,
            pcie_gen_max=gen,
            pcie_width_current=width,
            pcie_width_max=width,
            nvlinks=_nvlinks(entry, topo, i),
        )
        for i in range(entry["count"])
    ]
    p2p = entry.get("p2p", "ok")
    pairs = [
        GpuPair(a, b, _level(entry, topo, a, b), p2p, p2p)
        for a in range(entry["count"])
        for b in range(a + 1, entry["count"])
    ]
    return Snapshot(
        schema_version=SCHEMA_VERSION,
        created="2026-01-01T00:00:00+00:00",
        gpus=gpus,
        pairs=pairs,
        driver=Driver(cuda_driver_version=entry.get("driver_cuda") or NOT_SAID),
        host=replace(
            Host(cpu_arch=cpu[0], cpu_vendor=cpu[1]) if (cpu := entry.get("cpu")) else Host(),
            virtualization=Virtualization(hypervisor=True) if entry.get("vm") else NOT_SAID,
        ),
        software=Software(torch_nccl=entry.get("nccl") or NOT_SAID),
        env=dict(entry.get("env", {})),
    )


# A corpus-style entry (no published figure) for the DGX-1's hybrid cube mesh: 8 V100s, some pairs
# without a direct NVLink (tests/reference/topo/).
DGX1 = dict(
    id="dgx1",
    gpu="Tesla V100-SXM2-32GB",
    cc="7.0",
    count=8,
    fabric="mesh",
    pcie=[3, 16],
    topo="topo/dgx1-8x-v100-hybrid-cube-mesh.reconstructed.txt",
)


def corpus() -> list[dict[str, Any]]:
    return json.loads(CORPUS.read_text())["machines"]


def measured() -> list[Measured]:
    """Every run the model is held to (entries marked unfit are left out)."""
    out = []
    for entry in corpus():
        if entry.get("unfit"):
            continue
        indices = entry.get("gpus_used") or list(range(entry["count"]))
        collective = entry.get("collective", "allreduce")
        out.append(Measured(entry["id"], entry, build(entry), indices, collective, entry["busbw_gbps"]))
    return out


# --- degraded copies ----------------------------------------------------------------------------


def links_down(snapshot: Snapshot, index: int, keep: int = 0) -> Snapshot:
    """GPU `index` keeps only its first `keep` NVLinks; the others go down at both ends (their far
    end is no longer reported), as a failed link or a GPU fallen off the fabric looks."""
    gpu = snapshot.gpu(index)
    assert isinstance(gpu.nvlinks, list)
    dead = gpu.nvlinks[keep:]
    toward = Counter(link.remote_bus_id for link in dead if link.remote_type == "gpu")
    gone = {"active": False, "remote_bus_id": Missing("error"), "remote_type": Missing("error")}
    gpus = []
    for g in snapshot.gpus:
        links = g.nvlinks
        if g.index == index:
            links = [replace(link, **gone) if link in dead else link for link in gpu.nvlinks]
        elif isinstance(links, list) and toward[g.pci_bus_id]:
            left = toward[g.pci_bus_id]  # the peer loses its end of each dead link toward this GPU
            new = []
            for link in links:
                if left and link.active and link.remote_bus_id == gpu.pci_bus_id:
                    link, left = replace(link, **gone), left - 1
                new.append(link)
            links = new
        gpus.append(replace(g, nvlinks=links))
    return replace(snapshot, gpus=gpus)


def narrow_slot(snapshot: Snapshot, index: int, width: int = 8) -> Snapshot:
    """GPU `index` trained at x`width` in its x16 slot (the maximum stays what slot and GPU can do)."""
    gpus = [replace(g, pcie_width_current=width) if g.index == index else g for g in snapshot.gpus]
    return replace(snapshot, gpus=gpus)


# --- the calibration table -----------------------------------------------------------------------


def table() -> list[str]:
    """One line per corpus entry: published busbw, the model's healthy expectation, their ratio and
    the verdict GD601 would give the published figure (CheckOptions' default 0.8 / 0.5 lines)."""
    from gpudoctor.knowledge.expectations import expected_busbw

    lines = [f"{'run':<40} {'published':>9} {'expected':>8} {'ratio':>5}  verdict  basis"]
    for entry in corpus():
        indices = entry.get("gpus_used") or list(range(entry["count"]))
        e = expected_busbw(build(entry), indices, collective=entry.get("collective", "allreduce"))
        if e is None:
            lines.append(f"{entry['id']:<40} {entry['busbw_gbps']:>9.2f}   (no expectation)")
            continue
        ratio = entry["busbw_gbps"] / e.busbw_gbps
        verdict = "fail" if ratio < 0.5 and e.certain else "warn" if ratio < 0.8 else "pass"
        inside = e.busbw_gbps <= entry["busbw_gbps"] <= e.high_gbps if e.high_gbps else 0.8 <= ratio <= 1.25
        verdict += "" if inside else "*"
        note = f"  [unfit: {entry['unfit']}]" if entry.get("unfit") else ""
        lines.append(
            f"{entry['id']:<40} {entry['busbw_gbps']:>9.2f} {e.figure()[:-5]:>9} {ratio:>5.2f}  {verdict:<7}  "
            f"{e.fabric}/{e.algorithm}: {e.basis}{note}"
        )
    lines.append("* outside [0.8, 1.25], or outside the range where the model states one (ratio: to its low end)")
    return lines


if __name__ == "__main__":
    print("\n".join(table()))
