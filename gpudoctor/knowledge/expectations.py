"""What bus bandwidth a HEALTHY machine of this kind reaches: GPU model + interconnect + NCCL algorithm.

The expectation is never derived from the links that happen to be up. It comes from facts a
failing link does not change: the GPU model (compute capability, name), how many NVLinks each
GPU has (NVML lists every link, active or not), the interconnect class, and the NCCL algorithm
that will run. A machine with links down is then judged against its healthy figure and fails,
which is what GD402 (links down) says too.

Interconnect classes (`fabric`), for the set of GPUs that run the collective:

- "nvswitch": some GPU has a link ending at an NVSwitch (HGX/DGX A100, H100, H200, B200), or an
  active link whose far end NVML cannot name (NVSwitches hidden from a VM, as NCCL assumes).
  Bound: the GPU's links x NCCL's rate per link (the switch is non-blocking).
- "mesh": SXM GPUs joined GPU-to-GPU (DGX-1 V100 hybrid cube mesh, 4-GPU HGX A100/H100 boards).
  NCCL's rings use every link a GPU has toward the other GPUs of the run, so the bound is the
  smallest per-GPU sum of links toward the run's GPUs (not one pair's count).
- "bridge": PCIe cards joined by NVLink bridges (A100 PCIe, H100 PCIe/NVL, GA102: RTX 3090,
  A6000, A40). Only when bridges join every GPU of the run; for bridged islands joined over PCIe
  the ring crosses PCIe, and leaves each island through as many GPUs' PCIe links as its smallest
  island has GPUs (two bridged pairs: two PCIe hops side by side, up to the bridge's own rate).
  For meshes and bridges NVLink must carry a whole ring (every GPU once, NVLink pair to NVLink
  pair); otherwise the ring's PCIe hops bound it.
- "pcie": the ring crosses PCIe: knowledge/pcie_model.py (NCCL's PCIe rate, P2P or host memory at
  NCCL's P2P level, widened by NCCL_P2P_LEVEL, switch uplinks shared, SYS, and a range where a
  virtual machine or a translating IOMMU stages the host copies).

Where no published measurement backs a class, the expectation is a range with its basis
(`certain` False): GD601 warns below its low end and never fails against it.

Algorithm: NVLink SHARP (NVLS) runs all-reduce on NVSwitch systems of Hopper or later when more
than 4 GPUs take part, NCCL is 2.17 or later, the CUDA driver is 12.1 or later and neither
NCCL_NVLS_ENABLE=0 nor NCCL_ALGO excludes it; otherwise NCCL rings. The figures are for large
messages: the plateau nccl-tests reaches at 1-16 GiB.

Sources, where each figure is defined below; the calibration corpus is tests/reference/ and
tests/knowledge/test_expectations.py holds this model to it (within 0.8-1.25 of every published figure).

The NVLink generation shown in the basis comes from the GPU architecture (knowledge/interconnect.py,
ARCH_NVLINK_GENERATION), not from nvmlDeviceGetNvLinkVersion, whose answer drivers write in
different styles; the basis says when the NVML answer fits the architecture in no style.
"""

from __future__ import annotations

from itertools import combinations

from gpudoctor.knowledge import interconnect as topology
from gpudoctor.knowledge import nccl_rules
from gpudoctor.knowledge.gpu_products import bridge_links
from gpudoctor.knowledge.pcie_model import (  # noqa: F401  (re-exported: checks and tests read the rates here)
    NCCL_PCIE_GBPS_PER_LANE,
    PCIE_GBPS_PER_LANE,
    PCIE_SOURCE,
    p2p_cutoff,
    pcie_figure,
    uses_p2p,
)
from gpudoctor.records import Record, record
from gpudoctor.snapshot import Gpu, Missing, NvLink, Snapshot

# --- per-link rates --------------------------------------------------------------------------

# NCCL's own effective bandwidth of one NVLink, GB/s per direction, by compute capability:
# NVIDIA/nccl src/graph/topo.h (SM60_NVLINK_BW 18.0, SM70 20.0, SM80 20.0, SM86 12.0, SM90 20.6,
# SM100 40.1), chosen by ncclTopoNVLinkBw(). The line rates behind them: 25 GB/s per link for
# NVLink 2-4 and 50 for NVLink 5; GA102 (8.6) runs "four x4 links, with each link providing
# 14.0625 GB/sec bandwidth in each direction" (GA102 whitepaper). sjeaugey (nccl-tests#149): "Each
# NVLink has a line rate of 25GB/s (in each direction) which converts to ~20GB/s effective".
NCCL_NVLINK_GBPS = {6: 18.0, 7: 20.0, 8: 20.0, 9: 20.6, 10: 40.1}
NCCL_NVLINK_GBPS_SM86 = 12.0
NVLINK_SOURCE = "NVIDIA/nccl src/graph/topo.h (ncclTopoNVLinkBw); nccl-tests#149"

# --- efficiencies (measured busbw / NCCL's bound), calibrated on tests/reference/ ---------------

# NVLink rings: 8x A100 NVSwitch 235.65 of 240 (0.98, microsoft/superbench-results v0.4.0
# Azure-NDmv4 baseline, 8 GiB); 8x H200 with NVLS off 367.61 of 370.8 (0.99, ml-engineering
# network/README.md, 16 GiB); 8x B200 ring 682.2 of 721.8 (0.945, ml-engineering, 8 GiB); a bridged
# A100 PCIe pair 208 of 240 (0.87, nccl-tests#178). 0.95 keeps all of them within 0.91-1.04.
NVLINK_RING_EFFICIENCY = 0.95
NVLINK_RING_SOURCE = (
    "ring efficiency from 8x A100 235.65 GB/s (superbench-results NDmv4), 8x H200/B200 ring 367.61/682.2 "
    "(stas00/ml-engineering), bridged A100 PCIe pair 208 (nccl-tests#178)"
)

# NVLS gain over the ring, by number of GPUs: 8x H200 at 8 GiB, NCCL 2.27.7, each count run with
# and without NCCL_NVLS_ENABLE=0 (ml-engineering network/README.md): 4 GPUs 1.00 (ring chosen),
# 5 1.14, 6 1.19, 7 1.26, 8 1.29. sjeaugey (nccl-tests#212): "On 8 GPUs, you should reach a peak
# busBw of ~480GB/s" vs ~370 with the ring. NVIDIA's partition guide: "partitions that have less
# than or equal to four GPUs will not benefit from multicast". Beyond 8 GPUs: the 8-GPU gain.
NVLS_GAIN = {5: 1.14, 6: 1.19, 7: 1.26, 8: 1.29}
NVLS_MIN_GPUS = 5
NVLS_SOURCE = "NVLS gain from 8x H200 sweeps with NCCL_NVLS_ENABLE=0/1 (stas00/ml-engineering); nccl-tests#212"
NCCL_NVLS_VERSION = (2, 17)  # NVIDIA/nccl 2.17.1-1: "Add new NVLS algorithm for allreduce using NVLink SHARP"
CUDA_NVLS_VERSION = (12, 1)  # src/transport/nvls.cc: "NVLS Multicast support requires CUDA12.1 UMD + KMD"
# Inside a VM: NCCL runs NVLS where CUDA reports CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
# (nvls.cc, ncclNvlsInit). NVIDIA documents full-passthrough VMs that own their GPUs and
# NVSwitches (Fabric Manager user guide) and multicast in vGPU VMs "when unified memory (UVM) is
# enabled" (NVIDIA AI Enterprise, vGPU NVSwitch page). The snapshot does not record that attribute, so a VM
# does not change the expectation; the basis names the ring figure a run without multicast reaches.
# The one VM figure found (NVIDIA/nccl#1303) is a run over RoCE between VMs, not a node's NVLS.

# --- per-model facts -----------------------------------------------------------------------------

# Export SKUs keep fewer NVLinks than their architecture: A800 and H800 have 8 ("400GB/s" NVLink
# against 600/900; nccl#1374 on H800: "unidirectional peak BW 200GB/s"). NVML may still list the
# fused-off links, so the count is taken from here, not from the list.
REDUCED_NVLINK_MODELS = {"A800": 8, "H800": 8}

# Bridged H100 PCIe pairs reach 116 GB/s (nccl#1161, nccl-tests#194: 115.37-116.26 GB/s at
# 1-4 GiB). No public source explains why this is half of a bridged A100 PCIe pair, so the pair
# figure is the measurement itself (fitted, one public data point) and scales with links down.
# Not carried over to the H100 NVL: Azure's health check fails an NC80adis H100 v5 VM (a bridged
# H100 NVL pair) below 208 GB/s at 16 GiB (Azure/azurehpc-health-checks conf/nc80adis_h100_v5.conf,
# "check_nccl_allreduce 208.0 1 16G"), 1.79x that figure; the NVL takes NCCL's per-link rate.
BRIDGE_PAIR_GBPS = {"H100 PCIE": 116.3}
BRIDGE_PAIR_SOURCE = "bridged H100 PCIe pair 116.26 GB/s measured (NVIDIA/nccl#1161, nccl-tests#194)"

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "sendrecv")


@record
class Expectation(Record):
    busbw_gbps: float
    basis: str  # how it was derived, in words
    source: str  # where the rates and efficiencies come from
    link: str  # "nvlink", "pcie" or "user"
    fabric: str = ""  # "nvswitch", "mesh", "bridge", "pcie" ("" for the user's figure)
    algorithm: str = "ring"  # "ring" or "nvls"
    # A class without published evidence is a range: busbw_gbps is its low end, high_gbps its top, and
    # `certain` False: a run is warned below the low end, never failed against a guess.
    high_gbps: float | None = None
    certain: bool = True
    unknown: str = ""  # what would make an uncertain figure certain

    def figure(self) -> str:
        """'228.0 GB/s', or '9.0-25.7 GB/s' for a range."""
        if self.high_gbps is not None and self.high_gbps > self.busbw_gbps:
            return f"{self.busbw_gbps:.1f}-{self.high_gbps:.1f} GB/s"
        return f"{self.busbw_gbps:.1f} GB/s"

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "expected_busbw_gbps": round(self.busbw_gbps, 2),
            "basis": self.basis,
            "source": self.source,
        }
        if self.fabric:
            out["fabric"] = self.fabric
            out["algorithm"] = self.algorithm
        if self.high_gbps is not None:
            out["expected_busbw_high_gbps"] = round(self.high_gbps, 2)
        if not self.certain:
            out["certain"] = False
            out["would_make_it_certain"] = self.unknown
        return out


def user_expectation(min_busbw_gbps: float) -> Expectation:
    return Expectation(min_busbw_gbps, f"--min-busbw {min_busbw_gbps:g} GB/s", "the user", "user")


# --- GPU facts ----------------------------------------------------------------------------------


def _cc(gpu: Gpu) -> tuple[int, int] | None:
    cc = gpu.compute_capability
    if not isinstance(cc, str):
        return None
    try:
        major, _, minor = cc.strip().partition(".")
        return int(major), int(minor or 0)
    except ValueError:
        return None


def nvlink_link_gbps(gpu: Gpu) -> float | None:
    """NCCL's effective rate of one of this GPU's NVLinks (topo.h), None when unknown."""
    cc = _cc(gpu)
    if cc is None:
        return None
    if cc == (8, 6):
        return NCCL_NVLINK_GBPS_SM86
    return NCCL_NVLINK_GBPS.get(min(cc[0], 10)) if cc[0] >= 6 else None


def is_pcie_card(gpu: Gpu) -> bool:
    """A PCIe-form-factor card (NVLink only through bridges), as opposed to an SXM module."""
    name = gpu.name.upper()
    if "PCIE" in name or " NVL" in name or "GEFORCE" in name or "RTX" in name:
        return True
    cc = _cc(gpu)
    return cc in ((8, 6), (8, 9), (12, 0))  # GA102, AD102, GB202 ship only as PCIe cards


def _model_cap(gpu: Gpu) -> int | None:
    name = gpu.name.upper()
    return next((n for model, n in REDUCED_NVLINK_MODELS.items() if model in name), None)


def _bridge_pair(gpu: Gpu) -> float | None:
    name = gpu.name.upper()
    return next((v for model, v in BRIDGE_PAIR_GBPS.items() if model in name), None)


def _links(gpu: Gpu) -> list:
    return list(gpu.nvlinks) if isinstance(gpu.nvlinks, list) else []


def healthy_nvlinks(snapshot: Snapshot, gpu: Gpu) -> int | None:
    """How many NVLinks this GPU has when healthy: every link NVML lists (active or not), capped
    for export SKUs; a GPU whose list could not be read takes the count of its peers of the same
    model. None when the GPU has no NVLink."""
    count = len(_links(gpu))
    if not count:
        if isinstance(gpu.nvlinks, Missing) and gpu.nvlinks.reason == "unsupported":
            return None
        peers = [len(_links(g)) for g in snapshot.gpus if g.name == gpu.name and _links(g)]
        if not peers:
            return None
        count = max(peers)
    cap = _model_cap(gpu)
    bridges = bridge_links(gpu)  # a bridged PCIe card has the links its bridges carry (H100 NVL: 12 of 18)
    if bridges is not None:
        cap = min(cap or count, bridges[0] * bridges[1])
    return min(count, cap) if cap else count


def _bus(gpu: Gpu) -> object:
    return topology.normalize_bus_id(gpu.pci_bus_id)


def _links_toward(gpu: Gpu, peers: list[Gpu]) -> tuple[int, int]:
    """(active links to the given peers, inactive links whose far end is unknown or one of them)."""
    targets = {_bus(p) for p in peers}
    active = down = 0
    for link in _links(gpu):
        remote = link.remote_bus_id
        known = isinstance(remote, str) and link.remote_type != "switch"
        to_peer = known and topology.normalize_bus_id(remote) in targets  # type: ignore[arg-type]
        if link.active and to_peer:
            active += 1
        elif not link.active and (to_peer or not known):
            down += 1
    return active, down


# --- environment: which algorithm NCCL will run ------------------------------------------------------


def _version(text: object) -> tuple[int, ...] | None:
    if not isinstance(text, str):
        return None
    parts = []
    for piece in text.strip().split("+")[0].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts) or None


def algo_allows(value: str, collective: str, algorithm: str) -> bool:
    """Whether NCCL_ALGO lets `collective` use `algorithm` (NCCL env.rst, NCCL_ALGO): a comma list,
    '^' to exclude, and since 2.24 'func:list;func:list' where the first entry may omit the
    function and applies to every function not listed later."""
    chosen: str | None = None
    for i, entry in enumerate(e.strip() for e in value.split(";")):
        if not entry:
            continue
        func, sep, algos = entry.rpartition(":")
        if not sep and i > 0:
            continue  # only the first entry may omit the function
        func = func.strip().lower()
        if func == collective or (not func and chosen is None):
            chosen = algos
    if chosen is None:
        return True
    chosen = chosen.strip().lower()
    invert = chosen.startswith("^")
    names = {n.strip() for n in chosen.lstrip("^").split(",") if n.strip()}
    return (algorithm not in names) if invert else (algorithm in names)


def nvls_blocker(snapshot: Snapshot, gpus: list[Gpu], collective: str) -> str | None:
    """Why NVLS will not run on an NVSwitch set of these GPUs ("" reasons are hardware); None when it will."""
    if collective != "allreduce":
        return f"{collective} runs the ring"
    ccs = [_cc(g) for g in gpus]
    if any(cc is None or cc < (9, 0) for cc in ccs):
        return "NVLS needs Hopper or later"
    if len(gpus) < NVLS_MIN_GPUS:
        return f"NCCL picks the ring for {len(gpus)} GPUs (NVLS from {NVLS_MIN_GPUS})"
    env = snapshot.env
    if nccl_rules.nccl_int(env.get("NCCL_NVLS_ENABLE")) == 0:  # nvls.cc: if (!ncclParamNvlsEnable() ...)
        return f"NCCL_NVLS_ENABLE={env['NCCL_NVLS_ENABLE']}"
    algo = env.get("NCCL_ALGO", "").strip()
    if algo and not algo_allows(algo, collective, "nvls"):
        return f"NCCL_ALGO={algo} excludes NVLS"
    nccl = _version(snapshot.software.torch_nccl)
    if nccl is not None and nccl[:2] < NCCL_NVLS_VERSION:
        return f"NCCL {snapshot.software.torch_nccl} predates NVLS (2.17)"
    cuda = _version(snapshot.driver.cuda_driver_version)
    if cuda is not None and cuda[:2] < CUDA_NVLS_VERSION:
        return f"the driver's CUDA {snapshot.driver.cuda_driver_version} predates multicast (12.1)"
    return None


# --- the model ---------------------------------------------------------------------------------------


def _to_switch(link: NvLink, buses: set[tuple[int, int, int, int] | str]) -> bool:
    """A link to an NVSwitch: NVML says so (whatever its state), or an active link whose far end
    NCCL cannot see (an NVSwitch hidden from a VM: topology.ends_at_switch)."""
    return link.remote_type == "switch" or (link.active and topology.ends_at_switch(link, buses))


def fabric_of(snapshot: Snapshot, gpus: list[Gpu]) -> str:
    """The interconnect class of these GPUs, from facts a failing link does not change."""
    buses = topology.gpu_buses(snapshot)
    if any(_to_switch(link, buses) for g in snapshot.gpus for link in _links(g)):
        return "nvswitch"
    if any(_links(g) for g in gpus) and not any(is_pcie_card(g) for g in gpus):
        if not any(link.active for g in snapshot.gpus for link in _links(g)):
            # Every link down. SXM modules are always wired: an 8-GPU board of Ampere or later
            # is an NVSwitch board (HGX A100/H100/H200/B200); smaller boards and V100 are meshes.
            big = len(snapshot.gpus) >= 8 and all((_cc(g) or (0, 0)) >= (8, 0) for g in gpus)
            return "nvswitch" if big else "mesh"
        return "mesh"
    if any(is_pcie_card(g) and any(link.active for link in _links(g)) for g in gpus):
        return "bridge"
    return "pcie"


def _nvlink_per_gpu(snapshot: Snapshot, gpus: list[Gpu], fabric: str) -> dict[int, int] | None:
    """Healthy NVLinks each GPU can use toward the others of the set; None when the ring must
    cross PCIe (a GPU with no NVLink toward the set, or bridged islands)."""
    out: dict[int, int] = {}
    for gpu in gpus:
        healthy = healthy_nvlinks(snapshot, gpu)
        if healthy is None:
            return None
        if fabric == "nvswitch":
            out[gpu.index] = healthy
            continue
        peers = [p for p in gpus if p.index != gpu.index]
        active, down = _links_toward(gpu, peers)
        if fabric == "bridge" and not any(link.active for link in _links(gpu)):
            return None  # a card without a working bridge: its traffic crosses PCIe
        usable = min(active + down, healthy)
        if usable == 0:
            return None
        out[gpu.index] = usable
    if fabric != "nvswitch" and not _ring_on_nvlink(snapshot, gpus):
        return None
    return out


def _ring_on_nvlink(snapshot: Snapshot, gpus: list[Gpu]) -> bool:
    """Whether NCCL's ring can go around the set on NVLink alone (a ring through every GPU along
    NVLink-joined pairs), where an SXM GPU with links down counts as joined to all: its board is
    wired for it, the links are what failed. Bridged islands, or a chain, make the ring cross PCIe."""
    wild = {g.index for g in gpus if not is_pcie_card(g) and any(not link.active for link in _links(g))}

    def joined(a: int, b: int) -> bool:
        return bool(topology.nvlink_count(snapshot, a, b)) or a in wild or b in wild

    return topology.has_ring([g.index for g in gpus], joined)


def _generation_note(snapshot: Snapshot, indices: list[int]) -> str:
    odd = topology.nvml_nvlink_disagreements(snapshot, indices)
    if not odd:
        return ""
    raws = ", ".join(map(str, sorted({r for values in odd.values() for r in values})))
    gpus = ", ".join(map(str, sorted(odd)))
    return (
        f" (generation from the GPU architecture; NVML's NvLinkVersion answer {raws} "
        f"on GPU {gpus} does not match it and is ignored)"
    )


def _nvlink_expectation(
    snapshot: Snapshot, gpus: list[Gpu], fabric: str, per_gpu: dict[int, int], collective: str
) -> Expectation | None:
    indices = [g.index for g in gpus]
    slowest = min(gpus, key=lambda g: (per_gpu[g.index] * (nvlink_link_gbps(g) or 0.0), g.index))
    links = per_gpu[slowest.index]
    gen = topology.nvlink_generation(snapshot, indices)
    what = f"NVLink {gen}" if gen else "NVLink"
    where = {"nvswitch": "through NVSwitch", "mesh": "direct to its peers", "bridge": "over bridges"}[fabric]
    pair = _bridge_pair(slowest) if fabric == "bridge" else None
    if pair is not None:
        healthy = healthy_nvlinks(snapshot, slowest) or links
        busbw = pair * links / healthy
        basis = f"{links} of {healthy} {what} links per GPU {where}: {pair:g} GB/s measured on a healthy bridged pair"
        return Expectation(busbw, basis + _generation_note(snapshot, indices), BRIDGE_PAIR_SOURCE, "nvlink", fabric)
    rate = nvlink_link_gbps(slowest)
    if rate is None:
        return None
    bound = links * rate
    busbw = bound * NVLINK_RING_EFFICIENCY
    basis = (
        f"{links} {what} links per GPU {where} x {rate:g} GB/s (NCCL's rate per link) = {bound:.1f} GB/s "
        f"x {NVLINK_RING_EFFICIENCY:g} ring"
    )
    source = f"{NVLINK_SOURCE}; {NVLINK_RING_SOURCE}"
    algorithm = "ring"
    if fabric == "nvswitch":
        blocker = nvls_blocker(snapshot, gpus, collective)
        if blocker is None:
            gain = NVLS_GAIN[min(max(len(gpus), NVLS_MIN_GPUS), max(NVLS_GAIN))]
            ring = busbw
            busbw *= gain
            basis += (
                f" x {gain:g} NVLS ({len(gpus)} GPUs; where the driver offers no multicast, as in some VMs, "
                f"NCCL rings: {ring:.1f} GB/s)"
            )
            source += f"; {NVLS_SOURCE}"
            algorithm = "nvls"
        elif all((_cc(g) or (0, 0)) >= (9, 0) for g in gpus) and collective == "allreduce":
            basis += f" (no NVLS: {blocker})"
    return Expectation(busbw, basis + _generation_note(snapshot, indices), source, "nvlink", fabric, algorithm)


def _islands(snapshot: Snapshot, gpus: list[Gpu]) -> list[list[int]]:
    """The GPUs joined by NVLink among these (connected groups, singletons included)."""
    group = {g.index: {g.index} for g in gpus}
    for a, b in combinations([g.index for g in gpus], 2):
        if topology.nvlink_count(snapshot, a, b) and group[a] is not group[b]:
            merged = group[a] | group[b]
            for i in merged:
                group[i] = merged
    return sorted((sorted(g) for g in {id(g): g for g in group.values()}.values()), key=lambda g: g[0])


def _pcie(snapshot: Snapshot, gpus: list[Gpu], fabric: str, collective: str) -> Expectation | None:
    """The ring crosses PCIe. Bridged islands: each island's ring hops leave it through as many GPUs'
    PCIe links as its smallest island has GPUs, up to the islands' own NVLink rate."""
    exits, cap, what = 1, None, ""
    if fabric != "pcie":
        islands = _islands(snapshot, gpus)
        exits = min(len(i) for i in islands)
        what = "bridged islands" if fabric == "bridge" else "NVLink does not join every GPU"
        if exits > 1:
            members = [snapshot.gpu(i) for i in islands[0]]
            per_gpu = _nvlink_per_gpu(snapshot, members, fabric) if fabric == "bridge" else None
            inner = _nvlink_expectation(snapshot, members, fabric, per_gpu, collective) if per_gpu else None
            cap = inner.busbw_gbps if inner is not None else None
    figure = pcie_figure(snapshot, gpus, exits, cap)
    if figure is None:
        return None
    basis = figure.basis + (f"; {what}: the ring crosses PCIe" if what else "")
    source = f"NVIDIA/nccl src/graph/topo.cc (PCIe rate); {PCIE_SOURCE}"
    return Expectation(
        figure.busbw_gbps, basis, source, "pcie", "pcie", "ring", figure.high_gbps, figure.certain, figure.unknown
    )


def expected_busbw(snapshot: Snapshot, indices: list[int], *, collective: str = "allreduce") -> Expectation | None:
    """The large-message busbw (nccl-tests' definition for `collective`) the GPUs `indices` (NVML)
    reach when healthy; None when fewer than two GPUs or their links are unknown.

    All-reduce, all-gather, reduce-scatter and send/recv share the link bound (nccl-tests busbw
    already scales each by its own factor); only all-reduce gets NVLink SHARP."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r} (one of {', '.join(COLLECTIVES)})")
    if len(indices) < 2:
        return None
    gpus = [snapshot.gpu(i) for i in sorted(set(indices))]
    fabric = fabric_of(snapshot, gpus)
    if fabric != "pcie":
        per_gpu = _nvlink_per_gpu(snapshot, gpus, fabric)
        if per_gpu is not None:
            expect = _nvlink_expectation(snapshot, gpus, fabric, per_gpu, collective)
            if expect is not None:
                return expect
    return _pcie(snapshot, gpus, fabric, collective)
