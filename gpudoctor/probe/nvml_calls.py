"""Every NVML call gpudoctor makes: what nvml.h says it needs, and what gpudoctor does without it.

One row per pynvml function (the probe, the watch sampler, the level-2/3 workloads). "needs" quotes
nvml.h (go-nvml gen/nvml/nvml.h at 2f9e261, CUDA 13.3; line numbers are that file's) for support and
permission, and notes what the H200 (driver 580.159.04, /work/gpurun1) measured where it differs;
"without" is what a snapshot, a check or `watch` shows when the call is refused or absent. The
general rules (probe/nvml.py) apply to every row: NOT_SUPPORTED, FUNCTION_NOT_FOUND,
OPERATING_SYSTEM, INVALID_ARGUMENT and pynvml's NVMLLibraryMismatchError are "not there"
(`unsupported`: a fact for an optional feature, a missing reading for one every GPU has);
NO_PERMISSION is "needs root" (a skip naming `sudo`, never a warning); GPU_IS_LOST stops the
questions to that GPU (GD827); any other code is an error (a warning naming the reading; `watch`
asks it again less and less often). Sources: /work/research/nvml/calls.md; docs/nvml-calls.md is
this table rendered (scripts/gen_nvml_calls_doc.py).
"""

from __future__ import annotations

from typing import NamedTuple


class NvmlCall(NamedTuple):
    function: str  # the pynvml function
    used_for: str  # the snapshot field, `watch` metric or workload that reads it
    needs: str  # nvml.h: supported products, permission, platform (line)
    without: str  # what gpudoctor does when it is refused or not there


ALL = "all products"
NOT_THERE = "recorded as not supported"

CALLS: tuple[NvmlCall, ...] = (
    NvmlCall(
        "nvmlInit",
        "everything",
        f'{ALL}; NO_PERMISSION "if NVML does not have permission to talk to the driver" (3999)',
        "no GPU facts: Driver.nvml_status says why (GD101), the host's facts are still collected",
    ),
    NvmlCall("nvmlShutdown", "everything", ALL, "nothing to do"),
    NvmlCall("nvmlSystemGetDriverVersion", "driver_version", ALL, "the version is unreadable"),
    NvmlCall("nvmlSystemGetCudaDriverVersion", "cuda_driver_version", ALL, "the version is unreadable"),
    NvmlCall("nvmlSystemGetNVMLVersion", "nvml_version", ALL, "the version is unreadable"),
    NvmlCall("nvmlDeviceGetCount", "the GPU list", ALL, "no GPU facts (nvml_status error)"),
    NvmlCall(
        "nvmlDeviceGetHandleByIndex",
        "every GPU fact",
        f'{ALL}; NO_PERMISSION "if the user doesn\'t have permission to talk to this device" (4633); '
        '"causes NVML to initialize the target GPU" (4610): 6.6 ms per GPU on the H200',
        "the GPU is recorded unreachable with the reason and its kernel bus id (GD827)",
    ),
    NvmlCall("nvmlDeviceGetIndex", "watch: which GPU an XID event is about", ALL, "the event is dropped"),
    NvmlCall("nvmlDeviceGetUUID", "uuid", ALL, '""'),
    NvmlCall("nvmlDeviceGetName", "name", ALL, '""'),
    NvmlCall("nvmlDeviceGetPciInfo", "pci_bus_id", ALL, '"" (no bus id: network locality is not judged)'),
    NvmlCall(
        "nvmlDeviceGetMemoryInfo",
        "memory_total_mib, memory_used_mib, memory_reserved_mib; watch mem_used",
        f'{ALL}; v2 (nvmlMemory_v2) first: used is "Allocated device memory" (274), reserved apart; MIG: the '
        'aggregate "only if the caller has appropriate privileges" (6678-6680), NO_PERMISSION (6744)',
        "v1 where v2 is not there (used then includes the reserved memory; memory_reserved_mib not supported); "
        "refused: needs root",
    ),
    NvmlCall("nvmlDeviceGetMigMode", "mig_mode_current/pending", "Ampere or newer (12782)", NOT_THERE),
    NvmlCall("nvmlDeviceGetMaxMigDeviceCount", "mig_devices", "Ampere or newer; Linux (13397)", NOT_THERE),
    NvmlCall(
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "mig_devices",
        'Ampere or newer; NOT_FOUND "if no valid MIG device was found at index" (13437)',
        "an empty slot is skipped",
    ),
    NvmlCall("nvmlDeviceGetEccMode", "ecc_mode_current/pending", "Fermi or newer, devices with ECC (6860)", NOT_THERE),
    NvmlCall("nvmlDeviceGetCudaComputeCapability", "compute_capability", ALL, "unreadable (warn)"),
    NvmlCall("nvmlDeviceGetVbiosVersion", "vbios", ALL, "unreadable (warn)"),
    NvmlCall("nvmlDeviceGetEnforcedPowerLimit", "power_limit_w; watch", "Kepler or newer (6619)", NOT_THERE),
    NvmlCall("nvmlDeviceGetPersistenceMode", "persistence_mode", f"{ALL}; Linux only (5409)", NOT_THERE),
    NvmlCall("nvmlDeviceGetComputeMode", "compute_mode", ALL, "unreadable (warn)"),
    NvmlCall(
        "nvmlDeviceGetCurrPcieLinkGeneration", "pcie_gen_current; link probes", "Fermi or newer (5533)", NOT_THERE
    ),
    NvmlCall("nvmlDeviceGetCurrPcieLinkWidth", "pcie_width_current; link probes", "Fermi or newer (5551)", NOT_THERE),
    NvmlCall(
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "pcie_gen_max",
        'Fermi or newer; "possible with this device and system" (5474)',
        NOT_THERE,
    ),
    NvmlCall(
        "nvmlDeviceGetMaxPcieLinkWidth",
        "pcie_width_max",
        'Fermi or newer; "possible with this device and system" (5513); no GPU-only width call exists '
        "(pcie_width_gpu_max is read from sysfs)",
        NOT_THERE,
    ),
    NvmlCall(
        "nvmlDeviceGetGpuMaxPcieLinkGeneration",
        "pcie_gen_gpu_max",
        'Fermi or newer; "supported by this device" (5495); drivers with the 12.0 header',
        "not supported: links are judged against the card-and-slot maximum",
    ),
    NvmlCall("nvmlDeviceGetNvLinkState", "nvlinks", "Pascal or newer (9488)", 'not supported: "no NVLink"'),
    NvmlCall("nvmlDeviceGetNvLinkVersion", "nvlinks[].version_raw", "Pascal or newer (9508)", NOT_THERE),
    NvmlCall("nvmlDeviceGetNvLinkRemotePciInfo", "nvlinks[].remote_bus_id", "Pascal or newer (9548)", NOT_THERE),
    NvmlCall("nvmlDeviceGetNvLinkRemoteDeviceType", "nvlinks[].remote_type", "(no support line; 9725)", NOT_THERE),
    NvmlCall(
        "nvmlDeviceGetNvLinkErrorCounter",
        "nvlinks[].errors",
        "Pascal or newer (9567); not supported from Blackwell on",
        "asked once per GPU, then not supported",
    ),
    NvmlCall(
        "nvmlDeviceGetNumaNodeId",
        "numa_node",
        '"only applies to platforms where the GPUs are NUMA nodes" (5035): NOT_SUPPORTED on a PCIe H200',
        "not supported: the GPU's memory is not a node (numa_affinity and cpu_affinity place it)",
    ),
    NvmlCall("nvmlDeviceGetCpuAffinity", "cpu_affinity", "Kepler or newer; Linux only (4971)", NOT_THERE),
    NvmlCall(
        "nvmlDeviceGetMemoryAffinity",
        "numa_affinity (topo -m's NUMA Affinity)",
        "Kepler or newer; Linux (4911)",
        NOT_THERE,
    ),
    NvmlCall(
        "nvmlDeviceGetTotalEccErrors",
        "ecc_uncorrected_volatile/aggregate; deep memory test",
        "Fermi or newer; ECC devices with ECC mode enabled (6957)",
        "not supported: no ECC (a skip)",
    ),
    NvmlCall(
        "nvmlDeviceGetMemoryErrorCounter",
        "ecc_uncorrected_dram_volatile/aggregate",
        "Fermi or newer; ECC mode enabled (7026)",
        "not supported: no ECC",
    ),
    NvmlCall(
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "retired_pages_pending",
        "Kepler or newer (8391); NOT_SUPPORTED on the H200 (Ampere and later remap rows)",
        NOT_THERE,
    ),
    NvmlCall("nvmlDeviceGetRemappedRows", "remapped_rows", "Ampere or newer; not with MIG (8409)", NOT_THERE),
    NvmlCall("nvmlDeviceGetRowRemapperHistogram", "remap_histogram", "(no support line; 8437)", NOT_THERE),
    NvmlCall(
        "nvmlDeviceGetCurrentClocksEventReasons",
        "clock_event_reasons; watch throttle",
        "all fully supported products (6099); drivers R535+",
        "the deprecated nvmlDeviceGetCurrentClocksThrottleReasons is asked",
    ),
    NvmlCall(
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "clock_event_reasons (drivers before R535)",
        "DEPRECATED(13.0) (6126)",
        NOT_THERE,
    ),
    NvmlCall(
        "nvmlDeviceGetGpuFabricInfoV",
        "fabric",
        "Hopper or newer; the caller sets the struct version (7831): v3, then v2",
        "the legacy nvmlDeviceGetGpuFabricInfo is asked",
    ),
    NvmlCall(
        "nvmlDeviceGetGpuFabricInfo", "fabric (older drivers)", "Hopper or newer; DEPRECATED(13.0) (7829)", NOT_THERE
    ),
    NvmlCall(
        "nvmlDeviceGetComputeRunningProcesses",
        "processes; watch",
        'Fermi or newer; NO_PERMISSION "if the user doesn\'t have permission" (7394); MIG aggregate needs '
        "privileges (7378-7380)",
        "refused: needs root; a driver without the _v3 symbol (NVMLLibraryMismatchError): not supported",
    ),
    NvmlCall(
        "nvmlDeviceGetTemperatureV",
        "temperature_c; watch temp",
        f"{ALL} (5998); drivers R570+",
        "nvmlDeviceGetTemperature",
    ),
    NvmlCall("nvmlDeviceGetTemperature", "temperature_c (drivers before R570)", "DEPRECATED(13.0) (5958)", NOT_THERE),
    NvmlCall("nvmlDeviceGetPowerUsage", "power_draw_w; watch power", "Fermi or newer (6533)", NOT_THERE),
    NvmlCall("nvmlDeviceGetInforomImageVersion", "inforom_image", "products with an inforom (5256)", NOT_THERE),
    NvmlCall(
        "nvmlDeviceGetGspFirmwareVersion",
        "gsp_firmware",
        'NOT_SUPPORTED "if GSP firmware is not enabled" (8084); pynvml returns bytes',
        "GSP firmware off (a fact)",
    ),
    NvmlCall(
        "nvmlDeviceGetFieldValues",
        "recovery_action (field 230, R570+); watch PCIe bytes (fields 197/198, R555+)",
        "each field answers its own code (10214-10230)",
        "field by field: not supported; PCIe rates then come from nvmlDeviceGetPcieThroughput off the sampling thread",
    ),
    NvmlCall(
        "nvmlDeviceGetSramEccErrorStatus",
        "sram_ecc (GD829)",
        'Ampere or newer; "Requires root/admin permissions." (8111), yet NO_PERMISSION is not in its return '
        "list and driver 580.159.04 answered uid 65534 (measured)",
        "refused: needs root (a skip naming sudo, never a warning)",
    ),
    NvmlCall("nvmlDeviceGetPcieReplayCounter", "pcie_replays", "Kepler or newer (5592)", NOT_THERE),
    NvmlCall("nvmlDeviceGetP2PStatus", "pairs[].p2p_read/write", "(no support line; 5145)", "unreadable"),
    NvmlCall(
        "nvmlDeviceGetTopologyCommonAncestor",
        "pairs[].pcie_level",
        f'{ALL}; Linux only; UNKNOWN "an error has occurred in underlying topology discovery" (5119)',
        "unknown (`?` in the topology)",
    ),
    NvmlCall("nvmlDeviceGetUtilizationRates", "watch util, mem_util", "Fermi or newer; not with MIG (7065)", "n/a"),
    NvmlCall("nvmlDeviceGetClockInfo", "watch sm_clock", "Fermi or newer (5610)", "n/a"),
    NvmlCall(
        "nvmlDeviceGetPcieThroughput",
        "watch PCIe rates on drivers without fields 197/198",
        'Maxwell or newer; not in vGPU guests (5576); "a byte counter over a 20ms interval" (5571)',
        "n/a; never on the sampling thread",
    ),
    NvmlCall(
        "nvmlDeviceGetProcessUtilization",
        "watch: each process's SM share",
        'Maxwell or newer; not with MIG (8512); NOT_FOUND "if sample entries are not found" (8524); 2.8 ms on the H200',
        "n/a; NOT_FOUND is no busy process, not an error; asked only with the process readings",
    ),
    NvmlCall("nvmlEventSetCreate", "watch XIDs", "Fermi or newer (9867)", "no XID events in watch"),
    NvmlCall(
        "nvmlDeviceRegisterEvents", "watch XIDs", "Fermi or newer; Linux only (9884)", "no XID events for that GPU"
    ),
    NvmlCall(
        "nvmlEventSetWait_v2",
        "watch XIDs",
        'Fermi or newer; events of other processes "only if the caller has appropriate privileges" (9959); '
        'TIMEOUT "if no event arrived" (9972)',
        "TIMEOUT: nothing pending",
    ),
    NvmlCall("nvmlEventSetFree", "watch XIDs", "Fermi or newer (9981)", "nothing to do"),
)


def markdown() -> str:
    """The table as docs/nvml-calls.md shows it."""
    lines = [
        "# NVML calls: what each needs, and what gpudoctor does without it",
        "",
        "Generated from `gpudoctor/probe/nvml_calls.py` by `scripts/gen_nvml_calls_doc.py`; do not edit.",
        "",
        *(line.strip() for line in (__doc__ or "").split("\n\n")[1].splitlines()),
        "",
        "| pynvml function | used for | what nvml.h says it needs | without it |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{c.function}` | {c.used_for} | {c.needs} | {c.without} |" for c in CALLS]
    return "\n".join(lines) + "\n"
