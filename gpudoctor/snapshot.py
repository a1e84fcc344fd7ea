"""Snapshot: the frozen facts about one machine, and their JSON round-trip.

A snapshot holds every physical GPU that NVML sees plus the host and the allow-listed
environment. Checks read only this; the probe is the only code that fills it. A field
that could not be read holds a `Missing` with the reason instead of a value.

JSON encoding: dataclasses become objects, a `Missing` becomes
``{"missing": "<reason>", "detail": "..."}``. `docs/snapshot-format.md` documents it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import types
import typing
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any, TypeVar, Union

from gpudoctor.records import Record, record

SCHEMA_VERSION = 1

# One machine's bounds; a document beyond them was not read from a machine, and costs what it likes.
# NVIDIA's driver supports at most 32 GPUs in one system (NV_MAX_DEVICES, nvlimits.h in
# open-gpu-kernel-modules: tests/reference/gpus_per_system.md); the largest nodes sold hold 8 or 16.
# MAX_GPUS leaves 8x the driver's limit. Linux refuses an environment string longer than
# MAX_ARG_STRLEN (32 pages, 131072 bytes: execve(2), "Limits on size of arguments and environment").
MAX_GPUS = 256
MAX_ENV_VALUE = 131072

# Why a field holds no value. "not_collected": an older snapshot or a hand-written one
# left the field out.
MISSING_REASONS = ("unsupported", "no_permission", "gpu_lost", "error", "not_collected")


@record
class Missing(Record):
    """A fact the probe could not read, and why."""

    reason: str
    detail: str = ""

    def __bool__(self) -> bool:  # so `if gpu.numa_node:` never mistakes Missing for a value
        return False


T = TypeVar("T")


def known(value: T | Missing) -> bool:
    return not isinstance(value, Missing)


def value_or(value: T | Missing, default: T) -> T:
    return default if isinstance(value, Missing) else value


NOT_COLLECTED = Missing("not_collected")
# Field metadata key: a field added after schema_version 1 that is left out of the JSON while
# it is not collected (readers default it), so older recordings round-trip byte for byte.
OMIT_NOT_COLLECTED = "omit_when_not_collected"


def _later() -> Any:
    """A field added after schema_version 1: left out of the JSON while not collected."""
    return dataclasses.field(default=NOT_COLLECTED, metadata={OMIT_NOT_COLLECTED: True})


@record
class NvLinkErrors(Record):
    """nvmlDeviceGetNvLinkErrorCounter for one link: counts since the driver loaded (or the
    counters were last reset), as `nvidia-smi nvlink -e` prints them."""

    replay: int | Missing = NOT_COLLECTED  # NVML_NVLINK_ERROR_DL_REPLAY: packets resent
    recovery: int | Missing = NOT_COLLECTED  # NVML_NVLINK_ERROR_DL_RECOVERY: link retrained
    crc_flit: int | Missing = NOT_COLLECTED  # NVML_NVLINK_ERROR_DL_CRC_FLIT: flow-control CRC errors
    crc_data: int | Missing = NOT_COLLECTED  # NVML_NVLINK_ERROR_DL_CRC_DATA: data CRC errors


@record
class NvLink(Record):
    link: int
    active: bool
    version: int | Missing = NOT_COLLECTED
    remote_bus_id: str | Missing = NOT_COLLECTED
    remote_type: str | Missing = NOT_COLLECTED  # "gpu", "switch", "ibmnpu"
    # What nvmlDeviceGetNvLinkVersion answered, undecoded: drivers differ (plain generation, or
    # nvml.h's nvmlNvlinkVersion_t enum), so a recording keeps what this driver said. Left out
    # of the JSON when not collected, so snapshots written before it read and write unchanged.
    version_raw: int | Missing = _later()
    # The error counters, read twice: once with the GPU's other facts and once at the end of
    # the probe (Gpu.error_window_s apart), so a link that is erroring now shows as a rise.
    errors: NvLinkErrors | Missing = _later()
    errors_later: NvLinkErrors | Missing = _later()


@record
class GpuProcess(Record):
    pid: int  # as NVML reports it: a host PID, also inside a container
    used_memory_mib: int | None = None  # None: NVML could not say (e.g. under WDDM/MIG)
    local_pid: int | None = None  # the same process's PID in our namespace, if found
    user: str | None = None
    command: str | None = None


@record
class MigDevice(Record):
    index: int
    uuid: str
    memory_total_mib: int | Missing = NOT_COLLECTED


@record
class RemappedRows(Record):
    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@record
class SramEcc(Record):
    """nvmlDeviceGetSramEccErrorStatus: uncorrectable errors in on-chip SRAM (L2, SM register
    files, microcontrollers), apart from the HBM/DRAM ones."""

    aggregate_uncorrectable_parity: int
    aggregate_uncorrectable_secded: int
    volatile_uncorrectable_parity: int
    volatile_uncorrectable_secded: int
    # NVIDIA's RMA flag: more than 4 unique parity or 2 unique SEC-DED uncorrectable events in
    # one address bank (GPU Memory Error Management, "RMA Policy").
    threshold_exceeded: bool

    @property
    def aggregate_uncorrectable(self) -> int:
        return self.aggregate_uncorrectable_parity + self.aggregate_uncorrectable_secded

    @property
    def volatile_uncorrectable(self) -> int:
        return self.volatile_uncorrectable_parity + self.volatile_uncorrectable_secded


@record
class RemapHistogram(Record):
    """nvmlDeviceGetRowRemapperHistogram: how many DRAM banks have all, most, some, few or none
    of their spare rows left ("Bank Remap Availability Histogram" in nvidia-smi -q)."""

    max: int
    high: int
    partial: int
    low: int
    none: int


@record
class FabricInfo(Record):
    """NVSwitch fabric registration (Hopper and later): nvmlDeviceGetGpuFabricInfo."""

    state: str  # "not_supported", "not_started", "in_progress", "completed"
    # "success" or the NVML error name reported for the registration; meaningful only once the state
    # is "completed", so a reading without it (a recording, a hand-written snapshot) is a Missing.
    status: str | Missing = NOT_COLLECTED
    health: str | Missing = NOT_COLLECTED  # "healthy", "unhealthy", "limited_capacity"


@record
class Gpu(Record):
    index: int  # NVML index, which is PCI bus order (nvidia-smi's GPU number)
    uuid: str
    name: str
    pci_bus_id: str  # "00000000:18:00.0" as NVML reports it
    memory_total_mib: int | Missing = NOT_COLLECTED
    # Allocated memory, as nvidia-smi prints it: NVML's v2 `used` (nvml.h 274). A driver without
    # nvmlDeviceGetMemoryInfo_v2 gives v1's, which also counts the reserved memory (nvml.h 259);
    # memory_reserved_mib is then Missing.
    memory_used_mib: int | Missing = NOT_COLLECTED
    compute_capability: str | Missing = NOT_COLLECTED  # "9.0"
    vbios: str | Missing = NOT_COLLECTED
    power_limit_w: float | Missing = NOT_COLLECTED
    persistence_mode: bool | Missing = NOT_COLLECTED
    compute_mode: str | Missing = NOT_COLLECTED  # "default", "exclusive_process", "prohibited"
    mig_mode_current: bool | Missing = NOT_COLLECTED
    mig_mode_pending: bool | Missing = NOT_COLLECTED
    mig_devices: list[MigDevice] | Missing = NOT_COLLECTED
    ecc_mode_current: bool | Missing = NOT_COLLECTED
    ecc_mode_pending: bool | Missing = NOT_COLLECTED
    pcie_gen_current: int | Missing = NOT_COLLECTED
    pcie_gen_max: int | Missing = NOT_COLLECTED  # of the GPU and the slot together
    pcie_width_current: int | Missing = NOT_COLLECTED
    pcie_width_max: int | Missing = NOT_COLLECTED
    nvlinks: list[NvLink] | Missing = NOT_COLLECTED
    numa_node: int | Missing = NOT_COLLECTED
    cpu_affinity: list[int] | Missing = NOT_COLLECTED  # logical CPU ids
    # health
    ecc_uncorrected_volatile: int | Missing = NOT_COLLECTED
    ecc_uncorrected_aggregate: int | Missing = NOT_COLLECTED
    retired_pages_pending: bool | Missing = NOT_COLLECTED
    remapped_rows: RemappedRows | Missing = NOT_COLLECTED
    clock_event_reasons: int | Missing = NOT_COLLECTED  # NVML bitmask
    fabric: FabricInfo | Missing = NOT_COLLECTED
    processes: list[GpuProcess] | Missing = NOT_COLLECTED
    temperature_c: int | Missing = NOT_COLLECTED
    power_draw_w: float | Missing = NOT_COLLECTED
    lost: bool = False  # NVML answered GPU_IS_LOST for this device
    # Fields added after schema_version 1 (left out of the JSON while not collected):
    unreachable: str | Missing = _later()  # why NVML gave no handle; absent when it gave one
    inforom_image: str | Missing = _later()  # "G520.0200.00.05"
    gsp_firmware: str | Missing = _later()  # "550.54.15"; unsupported when GSP firmware is off
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: "none", "gpu_reset", "node_reboot", "drain_p2p",
    # "drain_and_reset" (and the newer "recover_imex_domain", "bus_reset", "system_reboot")
    recovery_action: str | Missing = _later()
    sram_ecc: SramEcc | Missing = _later()
    ecc_uncorrected_dram_volatile: int | Missing = _later()
    ecc_uncorrected_dram_aggregate: int | Missing = _later()
    remap_histogram: RemapHistogram | Missing = _later()
    pcie_replays: int | Missing = _later()  # nvmlDeviceGetPcieReplayCounter, first read
    pcie_replays_later: int | Missing = _later()  # ...and again at the end of the probe
    error_window_s: float | Missing = _later()  # seconds between the two reads of the error counters
    # Memory the driver and firmware reserve (NVML v2 `reserved`; nvidia-smi memory.reserved): never
    # a process's, so not in memory_used_mib.
    memory_reserved_mib: int | Missing = _later()
    # The card's own PCIe maximum, beside pcie_gen_max/pcie_width_max (the card and its slot
    # together): nvmlDeviceGetGpuMaxPcieLinkGeneration, and the GPU's Link Capabilities width from
    # sysfs (max_link_width; NVML has no GPU-only width call). A slot or a virtual root port that
    # caps the link shows as pcie_gen_max < pcie_gen_gpu_max.
    pcie_gen_gpu_max: int | Missing = _later()
    pcie_width_gpu_max: int | Missing = _later()
    # The NUMA node(s) nearest the GPU (nvmlDeviceGetMemoryAffinity, scope node): nvidia-smi topo -m's
    # "NUMA Affinity". numa_node is its "GPU NUMA ID": the GPU's own memory as a node, only on
    # platforms where GPU memory is a NUMA node (nvml.h 5035), N/A on PCIe GPUs.
    numa_affinity: list[int] | Missing = _later()


@record
class GpuPair(Record):
    """Facts about an ordered-independent pair of GPUs (a < b, NVML indices)."""

    a: int
    b: int
    # nvmlDeviceGetTopologyCommonAncestor as nvidia-smi names it:
    # "SAME" (internal), "PIX", "PXB", "PHB", "NODE", "SYS"
    pcie_level: str | Missing = NOT_COLLECTED
    # nvmlDeviceGetP2PStatus: "ok", "chipset_not_supported", "gpu_not_supported",
    # "topology_not_supported", "disabled_by_regkey", "not_supported", "unknown"
    p2p_read: str | Missing = NOT_COLLECTED
    p2p_write: str | Missing = NOT_COLLECTED


@record
class Driver(Record):
    # How NVML came up: "ok", "no_library" (libnvidia-ml not found), "no_driver"
    # (kernel module not loaded), "version_mismatch", "no_permission", "error".
    nvml_status: str = "ok"
    nvml_detail: str = ""
    driver_version: str | Missing = NOT_COLLECTED  # "550.54.15"
    cuda_driver_version: str | Missing = NOT_COLLECTED  # "12.4"
    nvml_version: str | Missing = NOT_COLLECTED
    kernel_module_version: str | Missing = NOT_COLLECTED  # from /proc/driver/nvidia/version
    fabric_manager: str | Missing = NOT_COLLECTED  # systemd state: "active", "inactive", ...
    # Fields added after schema_version 1 (left out of the JSON while not collected): the user-space
    # side on disk, apart from the loaded module, so a version mismatch names both halves.
    nvml_library: str | Missing = _later()  # the file libnvidia-ml.so.1 resolves to: "libnvidia-ml.so.550.107.02"
    nvml_library_changed: str | Missing = _later()  # ISO 8601 time that file was last changed (installed)


@record
class XidEvent(Record):
    pci_bus_id: str
    xid: int
    text: str
    timestamp: str = ""  # as the log printed it


@record
class PortStatus(Record):
    host: str
    port: int
    free: bool
    holder_pid: int | None = None
    holder_command: str | None = None
    resolves: bool = True  # host name lookup worked


# The RDMA port error counters a snapshot keeps (IBA PortCounters), with their width in bits
# (the kernel's PORT_PMA_ATTR table, drivers/infiniband/core/sysfs.c): they saturate at
# 2^width - 1 instead of wrapping.
RDMA_ERROR_COUNTERS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "excessive_buffer_overrun_errors": 4,
}


@record
class RdmaPort(Record):
    """One port of an InfiniBand/RoCE device: /sys/class/infiniband/<dev>/ports/<n>/."""

    port: int
    state: str | Missing = NOT_COLLECTED  # "ACTIVE", "DOWN", "INIT", "ARMED" (sysfs "4: ACTIVE")
    phys_state: str | Missing = NOT_COLLECTED  # "LinkUp", "Polling", "Disabled", ... (sysfs "5: LinkUp")
    rate_gbps: float | Missing = NOT_COLLECTED  # 400.0 from "400 Gb/sec (4X NDR)"
    rate: str | Missing = NOT_COLLECTED  # the sysfs text, "400 Gb/sec (4X NDR)"
    link_layer: str | Missing = NOT_COLLECTED  # "InfiniBand" or "Ethernet" (RoCE)
    # ports/<n>/counters/<name>: symbol_error, link_downed, link_error_recovery,
    # excessive_buffer_overrun_errors, port_rcv_errors (PortCounters; they saturate, never wrap)
    counters: dict[str, int] | Missing = NOT_COLLECTED


@record
class RdmaDevice(Record):
    """An InfiniBand/RoCE device (HCA): /sys/class/infiniband/<name>/."""

    name: str  # "mlx5_0"
    pci_bus_id: str | Missing = NOT_COLLECTED  # "0000:1a:00.0" (the device link)
    hca_type: str | Missing = NOT_COLLECTED  # "MT4129" (ConnectX-7)
    board_id: str | Missing = NOT_COLLECTED  # "MT_0000000838"
    fw_ver: str | Missing = NOT_COLLECTED  # "28.39.1002"
    node_guid: str | Missing = NOT_COLLECTED  # "b83f:d203:00a1:b2c4"
    netdevs: list[str] | Missing = NOT_COLLECTED  # network interfaces of the same PCI function
    ports: list[RdmaPort] = field(default_factory=list)


@record
class NetInterface(Record):
    """A network interface: /sys/class/net/<name>/."""

    name: str
    kind: str = "other"  # "ether", "infiniband" (IPoIB), "loopback", "other" (from `type`)
    virtual: bool = False  # no PCI device behind it (bridge, veth, bond, ...)
    operstate: str | Missing = NOT_COLLECTED  # "up", "down", "unknown", ...
    speed_mbps: int | None | Missing = NOT_COLLECTED  # None: the driver does not know (link down)
    mtu: int | Missing = NOT_COLLECTED
    pci_bus_id: str | None | Missing = NOT_COLLECTED  # None: virtual


@record
class PciPlace(Record):
    """Where a PCI device hangs: its path under /sys/devices and its NUMA node."""

    path: str  # "pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0"
    numa_node: int | None = None  # None: the kernel does not say (-1)


@record
class GpuDirect(Record):
    """What GPUDirect RDMA (NIC reads/writes GPU memory) can rest on, as NCCL looks for it."""

    # The peer-memory module NCCL finds (src/transport/net_ib/gdr.cc): "nvidia_peermem"
    # (/sys/module/nvidia_peermem), "nv_mem" / "nv_mem_nc" (MLNX_OFED's nv_peer_mem); None: none.
    peermem: str | None | Missing = NOT_COLLECTED
    # /proc/driver/nvidia/version says "Open Kernel Module": the dma-buf path needs it.
    open_kernel_module: bool | Missing = NOT_COLLECTED


@record
class Network(Record):
    """Inter-node network facts from sysfs/procfs (probe/network.py)."""

    rdma: list[RdmaDevice] | Missing = NOT_COLLECTED
    interfaces: list[NetInterface] | Missing = NOT_COLLECTED
    gpudirect: GpuDirect | Missing = NOT_COLLECTED
    # PCI bus id (sysfs form, lower case) -> place, for the GPUs and the NICs: GPU-NIC locality.
    pci: dict[str, PciPlace] | Missing = NOT_COLLECTED


@record
class PciNode(Record):
    """A PCI function on the path from a GPU up to its root port (the GPU itself, PCIe switch ports, the
    root port): what sysfs and, for root, PCI configuration space say about it (probe/pci_tree.py)."""

    upstream: str | None = None  # the bridge above it (sysfs bus id, "0000:17:00.0"); None below a host bridge
    # Link Capabilities (sysfs max_link_speed / max_link_width): for a GPU the card's own maximum, for
    # the bridge above it the slot's, whatever the two trained to.
    max_link_gen: int | Missing = NOT_COLLECTED
    max_link_width: int | Missing = NOT_COLLECTED
    iommu_group: int | None | Missing = NOT_COLLECTED  # /sys/.../iommu_group; None: no IOMMU group
    # The group's DMA domain (/sys/kernel/iommu_groups/<n>/type): "identity" (iommu=pt: no translation),
    # "DMA" / "DMA-FQ" (translated), "blocked", "unmanaged" (a VFIO user owns it)
    iommu_type: str | Missing = NOT_COLLECTED
    # ACS Control register (PCIe extended capability 0x000D, offset 6): bit 0 source validation,
    # 2 P2P request redirect, 3 P2P completion redirect, 4 upstream forwarding, 5 P2P egress control,
    # 6 direct translated P2P. None: no ACS capability; no_permission: extended configuration space
    # needs root (an unprivileged read of sysfs `config` stops at 64 bytes).
    acs_ctrl: int | None | Missing = NOT_COLLECTED


@record
class Virtualization(Record):
    """Whether the machine is a virtual machine, as the kernel sees it."""

    hypervisor: bool | Missing = NOT_COLLECTED  # x86 CPUID's hypervisor bit (/proc/cpuinfo flag "hypervisor")
    # DMI (/sys/class/dmi/id): "QEMU", "Microsoft Corporation", "Amazon EC2", "Google"; product "Virtual Machine"
    sys_vendor: str | Missing = NOT_COLLECTED
    product_name: str | Missing = NOT_COLLECTED


@record
class Host(Record):
    hostname: str = ""
    kernel: str = ""
    cpu_count: int | Missing = NOT_COLLECTED  # logical CPUs on the machine
    cpu_affinity: list[int] | Missing = NOT_COLLECTED  # CPUs this process may run on
    cpu_quota: float | Missing = NOT_COLLECTED  # cgroup CPU quota in cores; Missing: none set
    numa_cpus: dict[str, list[int]] | Missing = NOT_COLLECTED  # NUMA node -> CPUs
    ram_total_bytes: int | Missing = NOT_COLLECTED
    ram_available_bytes: int | Missing = NOT_COLLECTED
    cgroup_memory_limit_bytes: int | None | Missing = NOT_COLLECTED  # None: no limit set
    shm_total_bytes: int | Missing = NOT_COLLECTED
    container: str | None | Missing = NOT_COLLECTED  # "docker", "podman", "kubernetes", ...
    pid_namespace_isolated: bool | Missing = NOT_COLLECTED
    iommu_cmdline: list[str] | Missing = NOT_COLLECTED  # iommu/pci= tokens of /proc/cmdline
    iommu_groups: int | Missing = NOT_COLLECTED  # entries in /sys/kernel/iommu_groups
    memlock_limit_bytes: int | None | Missing = NOT_COLLECTED  # None: unlimited
    nofile_limit: int | None | Missing = NOT_COLLECTED
    network_interfaces: list[str] | Missing = NOT_COLLECTED
    xid_events: list[XidEvent] | Missing = NOT_COLLECTED  # from the kernel log
    master_port: PortStatus | Missing = NOT_COLLECTED
    # Fields added after schema_version 1 (left out of the JSON while not collected):
    cpu_arch: str | Missing = _later()  # platform.machine(): "x86_64", "aarch64", "ppc64le"
    # x86: /proc/cpuinfo vendor_id as CPUID gives it ("GenuineIntel", "AuthenticAMD",
    # "CentaurHauls", "  Shanghai  "); ARM: the "CPU implementer" code ("0x41")
    cpu_vendor: str | Missing = _later()
    network: Network | Missing = _later()  # probe/network.py: RDMA ports, interfaces, GPUDirect, PCI places
    booted: str | Missing = _later()  # ISO 8601 time the kernel booted (/proc/stat btime)
    # sysfs bus id (lower case) -> node, for every GPU and each bridge above it: PCIe link capabilities,
    # IOMMU groups and ACS control on the GPUs' paths (probe/pci_tree.py)
    pci_tree: dict[str, PciNode] | Missing = _later()
    virtualization: Virtualization | Missing = _later()


@record
class Software(Record):
    python: str = ""
    gpudoctor: str = ""
    nvidia_ml_py: str | Missing = NOT_COLLECTED
    torch: str | Missing = NOT_COLLECTED  # "2.4.1+cu121"
    torch_cuda: str | None | Missing = NOT_COLLECTED  # None: a CPU build
    torch_nccl: str | Missing = NOT_COLLECTED  # "2.21.5"


@record
class Snapshot(Record):
    schema_version: int
    created: str  # ISO 8601
    gpus: list[Gpu]
    pairs: list[GpuPair] = field(default_factory=list)
    driver: Driver = field(default_factory=Driver)
    host: Host = field(default_factory=Host)
    software: Software = field(default_factory=Software)
    env: dict[str, str] = field(default_factory=dict)  # allow-listed variables only

    def gpu(self, index: int) -> Gpu:
        """The GPU of NVML index `index` (the first listed); KeyError if none. O(1)."""
        by_index = self.derived("gpu_index", lambda: {g.index: g for g in reversed(self.gpus)})
        try:
            return by_index[index]
        except KeyError:
            raise KeyError(index) from None

    def pair(self, a: int, b: int) -> GpuPair | None:
        """The recorded pair of GPUs a and b, in either order (the first listed). O(1)."""
        by_ends = self.derived("pair_index", lambda: {(p.a, p.b): p for p in reversed(self.pairs)})
        return by_ends.get((min(a, b), max(a, b)))

    def derived(self, name: str, make: Callable[[], T]) -> T:
        """A fact derived from this snapshot, made once by `make` and kept (per-pair questions on a
        node of N GPUs would otherwise rebuild it N^2 times). Kept beside the fields, not as one, so
        equality, JSON and replace() ignore it; made again if the GPU or pair list was swapped or
        resized after it was made (snapshots are not meant to change once built)."""
        key = (len(self.gpus), len(self.pairs), id(self.gpus), id(self.pairs))
        kept = self.__dict__.get("_derived")
        if kept is None or kept[0] != key:
            kept = (key, {})
            self.__dict__["_derived"] = kept  # frozen: __setattr__ refuses, the instance dict does not
        facts = kept[1]
        if name not in facts:
            facts[name] = make()
        return facts[name]  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------
# JSON round-trip


def now_iso() -> str:
    """The local time now, with its UTC offset, to the second: what `created` holds in
    snapshots and reports (one definition; torch- and NVML-free to import)."""
    return dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="seconds")


class SnapshotError(Exception):
    """A snapshot file that cannot be used; the message is one line for the user."""


def _not_collected(value: Any) -> bool:
    return isinstance(value, Missing) and value.reason == "not_collected"


def to_jsonable(obj: Any) -> Any:
    if isinstance(obj, Missing):
        out = {"missing": obj.reason}
        if obj.detail:
            out["detail"] = obj.detail
        return out
    if dataclasses.is_dataclass(obj):
        return {
            f.name: to_jsonable(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not (f.metadata.get(OMIT_NOT_COLLECTED) and _not_collected(getattr(obj, f.name)))
        }
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


def dumps(snapshot: Snapshot) -> str:
    return json.dumps(to_jsonable(snapshot), indent=2) + "\n"


class _Bad(Exception):
    """A value that does not decode. Its path is built only on this path, one segment per level
    while it unwinds (innermost first), so a good snapshot costs no path strings."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.path: list[str] = []


Decoder = Callable[[Any], Any]
_DECODERS: dict[Any, Decoder] = {}


def _decoder(tp: Any) -> Decoder:
    """The decoder of type `tp`, built once (a closure per type; a dataclass's reads its fields'
    types on first use) and kept: decoding a snapshot then calls closures, never reflection."""
    dec = _DECODERS.get(tp)
    if dec is None:
        dec = _DECODERS[tp] = _build(tp)
    return dec


def _decode_as(tp: Any, data: Any, where: str) -> Any:
    try:
        return _decoder(tp)(data)
    except _Bad as bad:
        raise SnapshotError(f"{where}{''.join(reversed(bad.path))}: {bad.message}") from None


def _build(tp: Any) -> Decoder:
    origin = typing.get_origin(tp)
    if origin in _UNIONS:
        return _union(typing.get_args(tp))
    if origin is list:
        return _list(typing.get_args(tp)[0])
    if origin is dict:
        return _dict(_decoder(typing.get_args(tp)[1]))
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp)
    if tp in _SCALARS:
        return _SCALARS[tp]
    if tp is Any:
        return lambda data: data

    def undecodable(data: Any) -> Any:
        raise _Bad(f"cannot decode type {tp!r}")  # a bug in the types above

    return undecodable


def _int(data: Any) -> int:
    if type(data) is int or (isinstance(data, int) and not isinstance(data, bool)):
        return data
    raise _Bad(f"expected an integer, got {data!r}")


def _float(data: Any) -> float:
    if type(data) is float:
        return data
    if isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)
    raise _Bad(f"expected a number, got {data!r}")


def _str(data: Any) -> str:
    if isinstance(data, str):
        return data
    raise _Bad(f"expected str, got {data!r}")


def _bool(data: Any) -> bool:
    if isinstance(data, bool):
        return data
    raise _Bad(f"expected bool, got {data!r}")


_SCALARS: dict[type, Decoder] = {int: _int, float: _float, str: _str, bool: _bool}


def _union(options: tuple[Any, ...]) -> Decoder:
    """`X | Missing`, `X | None`: a Missing object, None, or the first of the other types that
    takes the value (the error of the first one tried when none does)."""
    takes_missing, takes_none = Missing in options, type(None) in options
    tried = [_decoder(o) for o in options if o not in (Missing, type(None))]
    exact = _exact(options)

    def decode(data: Any) -> Any:
        if type(data) is exact:
            return data
        if takes_missing and isinstance(data, dict) and "missing" in data:
            reason = data["missing"]
            if reason not in MISSING_REASONS:
                raise _Bad(f"unknown missing reason {reason!r}")
            return Missing(reason, str(data.get("detail", "")))
        if data is None and takes_none:
            return None
        failed = None
        for dec in tried:
            try:
                return dec(data)
            except _Bad as bad:
                failed = failed or bad
        raise failed or _Bad(f"unexpected {data!r}")

    return decode


def _exact(tp: Any) -> type | None:
    """The type whose values a decoder of `tp` returns as they are, without a call: the scalar
    type itself, or a union's first option tried when it is one (`int | Missing`: int)."""
    if tp in _SCALARS:
        return tp  # type: ignore[no-any-return]
    options = tp if isinstance(tp, tuple) else typing.get_args(tp) if typing.get_origin(tp) in _UNIONS else ()
    others = [o for o in options if o not in (Missing, type(None))]
    return others[0] if others and others[0] in _SCALARS else None


_UNIONS = (Union, types.UnionType)


def _list(item_type: Any) -> Decoder:
    item, exact = _decoder(item_type), _exact(item_type)

    def decode(data: Any) -> list[Any]:
        if not isinstance(data, list):
            raise _Bad("expected a list")
        try:
            return [v if type(v) is exact else item(v) for v in data]
        except _Bad:
            _locate(item, enumerate(data), "[{}]")
            raise

    return decode


def _dict(item: Decoder) -> Decoder:
    def decode(data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise _Bad("expected an object")
        try:
            return {str(k): item(v) for k, v in data.items()}
        except _Bad:
            _locate(item, data.items(), ".{}")
            raise

    return decode


def _locate(item: Decoder, entries: Any, segment: str) -> None:
    """On the error path only: decode the entries again to name the first that fails."""
    for key, value in entries:
        try:
            item(value)
        except _Bad as bad:
            bad.path.append(segment.format(key))
            raise bad from None


_REQUIRED = object()


def _dataclass(cls: type) -> Decoder:
    """An object's decoder: its fields in order, each decoded, defaulted or missing (an error).
    The instance is filled as its __init__ would fill it, without the per-field setattr calls
    that a frozen dataclass's __init__ makes (most of the cost): these classes have no
    __post_init__, no slots and no init=False field (checked here; otherwise __init__ runs)."""
    table: list[tuple[str, Decoder, type | None, Any, Any]] | None = None
    plain = not hasattr(cls, "__post_init__") and not hasattr(cls, "__slots__")
    plain = plain and all(f.init for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    new = object.__new__

    def decode(data: Any) -> Any:
        nonlocal table
        if not isinstance(data, dict):
            raise _Bad("expected an object")
        if table is None:  # first use: the field types resolved once (a type may name itself)
            hints = _field_types(cls)
            table = [
                (f.name, _decoder(hints[f.name]), _exact(hints[f.name]), *_absent(f))
                for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            ]
        values = {}
        for name, dec, exact, default, factory in table:
            if name in data:
                value = data[name]
                if type(value) is not exact:
                    try:
                        value = dec(value)
                    except _Bad as bad:
                        bad.path.append(f".{name}")
                        raise
                values[name] = value
            elif default is not _REQUIRED:
                values[name] = default
            elif factory is not None:
                values[name] = factory()
            else:
                raise _Bad(f"required field {name!r} is missing")
        if not plain:
            return cls(**values)
        obj = new(cls)
        obj.__dict__.update(values)
        return obj

    return decode


def _field_types(cls: type) -> dict[str, Any]:
    """typing.get_type_hints for a dataclass of this module, each annotation's text evaluated once
    for all the classes that share it ("int | Missing"): start-up pays ~40 evaluations, not ~400.
    A class from elsewhere is read by typing.get_type_hints (its annotations name its module's types)."""
    if cls.__module__ != __name__ or any(
        base.__module__ != __name__ for base in cls.__mro__[1:-1] if base is not Record
    ):
        return typing.get_type_hints(cls)
    return {f.name: _annotation(f.type) if isinstance(f.type, str) else f.type for f in dataclasses.fields(cls)}  # type: ignore[arg-type]


@functools.cache
def _annotation(text: str) -> Any:
    return eval(text, globals())  # noqa: S307  (an annotation of this module's own source)


def _absent(f: dataclasses.Field[Any]) -> tuple[Any, Any]:
    """What a field left out of the JSON holds: (its default or _REQUIRED, its default factory or None)."""
    default = _REQUIRED if f.default is dataclasses.MISSING else f.default
    factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
    return default, factory


def part_from_jsonable(cls: type[T], data: Any, where: str) -> T:
    """One part of a snapshot (its Software, read from another interpreter: probe/interpreter.py),
    decoded and checked as a whole snapshot's parts are (SnapshotError otherwise)."""
    return _decode_as(cls, data, where)  # type: ignore[no-any-return]


def from_jsonable(data: Any) -> Snapshot:
    if not isinstance(data, dict):
        raise SnapshotError("not a gpudoctor snapshot: the top level is not a JSON object")
    version = data.get("schema_version")
    if version is None:
        raise SnapshotError("not a gpudoctor snapshot: no schema_version")
    if version != SCHEMA_VERSION:
        raise SnapshotError(
            f"snapshot schema_version {version!r} is not supported (this gpudoctor reads {SCHEMA_VERSION})"
        )
    snapshot = _decode_as(Snapshot, data, "snapshot")
    _check_consistent(snapshot)
    return snapshot


def _check_consistent(snapshot: Snapshot) -> None:
    """Facts that decode one by one but cannot all be true of one machine."""
    why = gpus_problem([g.index for g in snapshot.gpus], [g.uuid for g in snapshot.gpus])
    if why is not None:
        raise SnapshotError(why)
    for name, value in snapshot.env.items():
        if len(value) > MAX_ENV_VALUE:
            raise SnapshotError(
                f"{name} is {len(value)} characters long: longer than Linux lets an environment value be "
                f"({MAX_ENV_VALUE}, MAX_ARG_STRLEN)"
            )
    indices = {g.index for g in snapshot.gpus}
    for p in snapshot.pairs:
        if p.a not in indices or p.b not in indices or p.a == p.b:
            raise SnapshotError(f"pair {p.a}-{p.b} names a GPU that is not in the snapshot")


def gpus_problem(indices: list[Any], uuids: list[Any]) -> str | None:
    """Why a list of one machine's GPUs (a snapshot's, a report's facts) cannot be one machine's: too
    many, or two sharing an index or UUID (a list doubled would compare as twice the GPUs)."""
    if len(indices) > MAX_GPUS:
        return f"{len(indices)} GPUs: more than one machine holds (at most {MAX_GPUS})"
    for what, values in (("GPU index", indices), ("GPU UUID", uuids)):
        seen: set[object] = set()
        for v in values:
            if v in seen:
                return f"two GPUs share the {what} {v!r}"
            seen.add(v)
    if any(isinstance(i, int) and i < 0 for i in indices):
        return "a GPU index is negative"
    return None


def _no_constants(name: str) -> Any:
    raise SnapshotError(f"not valid JSON: {name} is not a number JSON allows")


def loads(text: str) -> Snapshot:
    try:
        # NaN/Infinity are Python's extension to JSON: a reading of NaN watts is no reading.
        data = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise SnapshotError("not valid JSON: nested too deeply") from None
    return from_jsonable(data)


# A snapshot of 8 GPUs is about 60 KB; a file this large is something else (/dev/zero, a log).
MAX_SNAPSHOT_BYTES = 32 << 20


def load(path: str | Path) -> Snapshot:
    """The snapshot in file `path`, or on standard input for "-"."""
    from gpudoctor.safety.safe_io import InputFileError, read_stdin_text, read_text

    try:
        text = read_stdin_text(MAX_SNAPSHOT_BYTES) if path == "-" else read_text(path, MAX_SNAPSHOT_BYTES)
    except InputFileError as exc:
        raise SnapshotError(f"{path}: {exc.strerror}") from None
    except FileNotFoundError:
        raise SnapshotError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SnapshotError(f"{path}: is a directory, not a snapshot file") from None
    except PermissionError:
        raise SnapshotError(f"{path}: permission denied") from None
    except UnicodeDecodeError:
        raise SnapshotError(f"{path}: not a text file") from None
    except OSError as exc:
        raise SnapshotError(f"{path}: {exc.strerror}") from None
    try:
        return loads(text)
    except SnapshotError as exc:
        raise SnapshotError(f"{path}: {exc}") from None


def write(snapshot: Snapshot, path: str | Path) -> None:
    """Write a snapshot file whole, through gpudoctor.safety.safe_io (no link followed, never half a file)."""
    from gpudoctor.safety.safe_io import write_text

    write_text(path, dumps(snapshot))
