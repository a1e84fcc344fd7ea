"""What all-reduce busbw this machine's links should give: a topology -> bandwidth model.

expected busbw = link rate (per GPU, one direction) x the efficiency NCCL reaches in practice.
The link rate is NVLink generation x active links when every pair of the visible GPUs is joined
by NVLink (directly or through NVSwitch), otherwise the slowest GPU's PCIe generation x width,
halved when a pair crosses the CPU interconnect (SYS). Figures and sources: domain.md §2, §4.
The verdict is for large messages (>= 1 GiB); NVLink SHARP (NVLS) may exceed the line rate.

The NVLink generation comes from the GPUs' architecture (compute capability 8.0 -> NVLink 3,
9.0 -> 4, 10.x -> 5; topology.ARCH_NVLINK_GENERATION), not from nvmlDeviceGetNvLinkVersion:
drivers answer that call in different styles (the plain generation, nvml.h's enum, or 7 for an
H100), and reading one style as another put a healthy H100 at NVLink 5's 50 GB/s per link
(702 GB/s expected, a false warning). The NVML answer is a cross-check: the basis says so when
it fits the architecture in no driver style. Only a GPU of unknown architecture falls back to
the recorded link version, read the cautious way (the lower of the styles' generations).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from gpudoctor import topology
from gpudoctor.snapshot import Snapshot

# GB/s per link, one direction: A100 12 x 25 = 300, H100 18 x 25 = 450, B200 18 x 50 = 900.
NVLINK_GBPS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
# GB/s per lane, one direction, after encoding: x16 Gen4 ~31.5, Gen5 ~63 (ml-engineering).
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# 8x A100 NVSwitch: 235 of 300 GB/s (SuperBench NDmv4 baseline, ml-engineering) = 0.78;
# 8x H100 ring ~370 of 450 (sjeaugey, nccl-tests#212) = 0.82. The lower one is the default.
NVLINK_EFFICIENCY = 0.78
NVLINK_SOURCE = (
    "8x A100 NVSwitch 235 GB/s of 300 (microsoft/superbench-results NDmv4 baseline); "
    "8x H100 ~370 of 450 (NVIDIA/nccl-tests#212)"
)
# PCIe rings are bound by CPU and memory (NVIDIA/nccl#1639): 8x L40S Gen4 flat ring 20.75 GB/s
# of 31.5 = 0.66 (flashinfer#4870); cross-NUMA 9.7 (x0.47).
PCIE_EFFICIENCY = 0.6
PCIE_SYS_FACTOR = 0.5
PCIE_SOURCE = "8x L40S PCIe Gen4 flat ring 20.75 GB/s, cross-NUMA 9.7 (flashinfer-ai/flashinfer#4870)"


@dataclass(frozen=True)
class Expectation:
    busbw_gbps: float
    basis: str  # how it was derived, in words
    source: str  # where the efficiency figure comes from
    link: str  # "nvlink", "pcie" or "user"

    def to_json(self) -> dict[str, object]:
        return {"expected_busbw_gbps": round(self.busbw_gbps, 2), "basis": self.basis, "source": self.source}


def user_expectation(min_busbw_gbps: float) -> Expectation:
    return Expectation(min_busbw_gbps, f"--min-busbw {min_busbw_gbps:g} GB/s", "the user", "user")


def expected_busbw(snapshot: Snapshot, indices: list[int]) -> Expectation | None:
    """The busbw the GPUs `indices` (NVML) should reach; None when their links are unknown."""
    if len(indices) < 2:
        return None
    pairs = list(combinations(indices, 2))
    nv = [topology.nvlink_count(snapshot, a, b) for a, b in pairs]
    gen = topology.nvlink_generation(snapshot, indices)
    if all(nv) and gen in NVLINK_GBPS_PER_LINK:
        links = min(nv)
        rate = links * NVLINK_GBPS_PER_LINK[gen]
        basis = f"NVLink {gen} x {links} links = {rate:g} GB/s x {NVLINK_EFFICIENCY:g}"
        odd = topology.nvml_nvlink_disagreements(snapshot, indices)
        if odd:
            raws = ", ".join(map(str, sorted({r for values in odd.values() for r in values})))
            gpus = ", ".join(map(str, sorted(odd)))
            basis += (
                f" (generation from the GPU architecture; NVML's NvLinkVersion answer {raws} "
                f"on GPU {gpus} does not match it and is ignored)"
            )
        return Expectation(rate * NVLINK_EFFICIENCY, basis, NVLINK_SOURCE, "nvlink")
    rates = []
    for i in indices:
        gpu = snapshot.gpu(i)
        if not isinstance(gpu.pcie_gen_max, int) or not isinstance(gpu.pcie_width_max, int):
            return None
        if gpu.pcie_gen_max not in PCIE_GBPS_PER_LANE:
            return None
        rates.append((gpu.pcie_gen_max, gpu.pcie_width_max, PCIE_GBPS_PER_LANE[gpu.pcie_gen_max] * gpu.pcie_width_max))
    g, w, rate = min(rates, key=lambda r: r[2])
    factor = PCIE_EFFICIENCY
    basis = f"PCIe Gen{g} x{w} = {rate:.1f} GB/s x {PCIE_EFFICIENCY:g}"
    if any(topology.pcie_level(snapshot, a, b) == "SYS" for a, b in pairs):
        factor *= PCIE_SYS_FACTOR
        basis += f" x {PCIE_SYS_FACTOR:g} (a pair crosses the CPU interconnect, SYS)"
    return Expectation(rate * factor, basis, PCIE_SOURCE, "pcie")
