"""A fake pynvml: the same function names, answered from a Snapshot.

Any recorded snapshot (tests/fixtures/*.json) or one built in a test can drive it:

    fake = FakeNvml(snapshot)
    collected = collect_machine(Nvml(fake), environ={})

A `Missing` field is raised as the real `pynvml.NVMLError` its reason stands for
(unsupported -> NOT_SUPPORTED, no_permission -> NO_PERMISSION, gpu_lost -> GPU_IS_LOST,
error -> UNKNOWN). Knobs: `init_failure` ("no_driver", "no_library", "version_mismatch",
"no_permission"), `lose_after` (GPU index -> device calls answered before it falls off
the bus), `missing_functions` (names that raise FUNCTION_NOT_FOUND, like an old driver),
`nvlink_version_style` ("enum": nvml.h's nvmlNvlinkVersion_t, as newer drivers answer;
"generation": the plain generation, as older ones do). Error counters (NVLink, PCIe replays)
answer their recorded first reading the first time they are asked and the `*_later` reading
after that, as a link that errors between the probe's two readings would. NVML constants are nvml.h's raw
values written out here, never imported from the probe.

To extend it (e.g. live readings for `watch`), add a method named like the pynvml
function; `self._device(handle)` does the bookkeeping and returns the Gpu to answer from.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml

from gpudoctor.knowledge.units import MIB
from gpudoctor.probe.nvml import NVML_RETURN_NAMES
from gpudoctor.snapshot import Gpu, MigDevice, Missing, Snapshot

REASON_CODES = {
    "unsupported": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "not_collected": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "no_permission": pynvml.NVML_ERROR_NO_PERMISSION,
    "gpu_lost": pynvml.NVML_ERROR_GPU_IS_LOST,
    "error": pynvml.NVML_ERROR_UNKNOWN,
}
INIT_FAILURES = {
    "no_driver": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    "no_library": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    "version_mismatch": pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    "no_permission": pynvml.NVML_ERROR_NO_PERMISSION,
    "unknown": pynvml.NVML_ERROR_UNKNOWN,
}
COMPUTE_MODE_CODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}
REMOTE_TYPE_CODES = {"gpu": 0, "ibmnpu": 1, "switch": 2}
FABRIC_STATE_CODES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
FABRIC_HEALTH_CODES = {"healthy": 1, "unhealthy": 2, "limited_capacity": 3}
# healthMask bits consistent with the summary: DEGRADED_BW at bit 0, ROUTE_UNHEALTHY at bit 4
# (1 = true, 2 = false).
FABRIC_HEALTH_MASKS = {
    "healthy": (2 << 0) | (2 << 4),
    "limited_capacity": (1 << 0) | (2 << 4),
    "unhealthy": (2 << 0) | (1 << 4),
}
# The raw values of nvml.h, written out here so the fake does not echo the probe's own tables.
# nvmlGpuTopologyLevel_t: NVML_TOPOLOGY_INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30,
# NODE 40, SYSTEM 50 (named as `nvidia-smi topo -m` prints them).
LEVEL_CODES = {"SAME": 0, "PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
# nvmlGpuP2PStatus_t: OK 0, CHIPSET_NOT_SUPPORED 1, GPU_NOT_SUPPORTED 2, IOH_TOPOLOGY_NOT_SUPPORTED 3,
# DISABLED_BY_REGKEY 4, NOT_SUPPORTED 5, UNKNOWN 6.
P2P_CODES = {
    "ok": 0,
    "chipset_not_supported": 1,
    "gpu_not_supported": 2,
    "topology_not_supported": 3,
    "disabled_by_regkey": 4,
    "not_supported": 5,
    "unknown": 6,
}
# nvmlNvlinkVersion_t for each generation, as a newer driver answers nvmlDeviceGetNvLinkVersion:
# NVML_NVLINK_VERSION_1_0 1, 2_0 2, 3_0 4, 4_0 6, 5_0 7 (2_2 = 3 and 3_1 = 5 exist too).
NVLINK_ENUM_OF_GENERATION = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7}
RETURN_CODES = {name: code for code, name in NVML_RETURN_NAMES.items()}
# nvmlDeviceGpuRecoveryAction_t (nvml.h) and the field id that answers it.
RECOVERY_ACTION_CODES = {"none": 0, "gpu_reset": 1, "node_reboot": 2, "drain_p2p": 3, "drain_and_reset": 4}
FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_MEMORY_LOCATION_DRAM = 2
# nvmlNvLinkErrorCounter_t: DL_REPLAY 0, DL_RECOVERY 1, DL_CRC_FLIT 2, DL_CRC_DATA 3.
NVLINK_COUNTER_FIELDS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}
IDENTITY_CALLS = {"nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo"}


def raise_if_missing(*values: Any) -> None:
    for value in values:
        if isinstance(value, Missing):
            raise pynvml.NVMLError(REASON_CODES.get(value.reason, pynvml.NVML_ERROR_UNKNOWN))


def _function_not_found(*args: Any) -> Any:
    """What pynvml does when the driver's library lacks a symbol: fail at call time."""
    raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def pci_info(bus_id: str) -> Any:
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    return info


class FakeDevice:
    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.calls = 0
        self.lost = gpu.lost


class FakeMigDevice:
    def __init__(self, parent: FakeDevice, mig: MigDevice) -> None:
        self.parent = parent
        self.mig = mig


class FakeNvml:
    """Stands in for the pynvml module. Only the calls the probe makes are answered."""

    # The probe allocates these for nvmlDeviceGetGpuFabricInfo(V), as it must with pynvml.
    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfo_v2_t = pynvml.c_nvmlGpuFabricInfo_v2_t
    c_nvmlGpuFabricInfo_v3_t = pynvml.c_nvmlGpuFabricInfo_v3_t
    c_nvmlEccSramErrorStatus_v1_t = pynvml.c_nvmlEccSramErrorStatus_v1_t  # nvmlDeviceGetSramEccErrorStatus
    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        init_failure: str | None = None,
        lose_after: dict[int, int] | None = None,
        missing_functions: set[str] | frozenset[str] = frozenset(),
        past_last_link: int = pynvml.NVML_ERROR_NOT_SUPPORTED,
        nvlink_version_style: str = "enum",
    ) -> None:
        self.snapshot = snapshot
        self.init_failure = init_failure
        self.lose_after = dict(lose_after or {})
        self.missing_functions = set(missing_functions)
        self.past_last_link = past_last_link
        self.nvlink_version_style = nvlink_version_style  # "enum" (newer drivers) or "generation" (older)
        self.devices = [FakeDevice(gpu) for gpu in sorted(snapshot.gpus, key=lambda g: g.index)]
        self.initialized = 0
        self.calls: list[str] = []  # every function called, in order
        self.counter_reads: dict[tuple[object, ...], int] = {}  # how often each error counter was read

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml"):
            object.__getattribute__(self, "calls").append(name)
            if name in object.__getattribute__(self, "missing_functions"):
                return _function_not_found
        return object.__getattribute__(self, name)

    # -- bookkeeping -----------------------------------------------------------------

    def _ready(self) -> None:
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: Any, call: str = "") -> Gpu:
        """The Gpu behind a handle; raises GPU_IS_LOST once the device has fallen off."""
        self._ready()
        if not isinstance(handle, FakeDevice):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle.calls += 1
        budget = self.lose_after.get(handle.gpu.index)
        if budget is not None and handle.calls > budget:
            handle.lost = True
        if handle.lost and not (handle.gpu.lost and call in IDENTITY_CALLS):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle.gpu

    # -- library and system ------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_failure is not None:
            raise pynvml.NVMLError(INIT_FAILURES[self.init_failure])
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._ready()
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._ready()
        raise_if_missing(self.snapshot.driver.driver_version)
        return self.snapshot.driver.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._ready()
        version = self.snapshot.driver.cuda_driver_version
        raise_if_missing(version)
        major, minor = version.split(".")[:2]
        return int(major) * 1000 + int(minor) * 10

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._ready()
        raise_if_missing(self.snapshot.driver.nvml_version)
        return self.snapshot.driver.nvml_version

    def nvmlDeviceGetCount(self) -> int:
        self._ready()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._ready()
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.devices[index]

    # -- identity and configuration ----------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, FakeMigDevice):
            return handle.mig.uuid
        return self._device(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return pci_info(self._device(handle, "nvmlDeviceGetPciInfo").pci_bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        if isinstance(handle, FakeMigDevice):
            raise_if_missing(handle.mig.memory_total_mib)
            total = handle.mig.memory_total_mib * MIB
            return SimpleNamespace(total=total, used=0, free=total)
        gpu = self._device(handle)
        raise_if_missing(gpu.memory_total_mib, gpu.memory_used_mib)
        total, used = gpu.memory_total_mib * MIB, gpu.memory_used_mib * MIB
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        cc = self._device(handle).compute_capability
        raise_if_missing(cc)
        major, minor = cc.split(".")
        return int(major), int(minor)

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        vbios = self._device(handle).vbios
        raise_if_missing(vbios)
        return vbios

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        watts = self._device(handle).power_limit_w
        raise_if_missing(watts)
        return round(watts * 1000)

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        mode = self._device(handle).persistence_mode
        raise_if_missing(mode)
        return int(mode)

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        mode = self._device(handle).compute_mode
        raise_if_missing(mode)
        return COMPUTE_MODE_CODES[mode]

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._device(handle)
        raise_if_missing(gpu.mig_mode_current, gpu.mig_mode_pending)
        return [int(gpu.mig_mode_current), int(gpu.mig_mode_pending)]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu = self._device(handle)
        raise_if_missing(gpu.mig_devices)
        return max([7] + [m.index + 1 for m in gpu.mig_devices])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> FakeMigDevice:
        gpu = self._device(handle)
        raise_if_missing(gpu.mig_devices)
        for mig in gpu.mig_devices:
            if mig.index == index:
                return FakeMigDevice(handle, mig)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        gpu = self._device(handle)
        raise_if_missing(gpu.ecc_mode_current, gpu.ecc_mode_pending)
        return [int(gpu.ecc_mode_current), int(gpu.ecc_mode_pending)]

    # -- links ---------------------------------------------------------------------------

    def _field(self, handle: Any, name: str) -> Any:
        value = getattr(self._device(handle), name)
        raise_if_missing(value)
        return value

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._field(handle, "pcie_gen_current")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._field(handle, "pcie_gen_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._field(handle, "pcie_width_current")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._field(handle, "pcie_width_max")

    def _link(self, handle: Any, link: int) -> Any:
        links = self._device(handle).nvlinks
        raise_if_missing(links)
        for nvlink in links:
            if nvlink.link == link:
                return nvlink
        # No such link: NOT_SUPPORTED, or INVALID_ARGUMENT past the last link on GB200.
        raise pynvml.NVMLError(self.past_last_link if links else pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return int(self._link(handle, link).active)

    def nvmlDeviceGetNvLinkVersion(self, handle: Any, link: int) -> int:
        """A recorded raw answer (NvLink.version_raw) as it was; else the generation, written in
        the driver style `nvlink_version_style`."""
        nvlink = self._link(handle, link)
        if isinstance(nvlink.version_raw, int):
            return nvlink.version_raw
        raise_if_missing(nvlink.version)
        if self.nvlink_version_style == "generation":
            return nvlink.version
        return NVLINK_ENUM_OF_GENERATION[nvlink.version]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        remote = self._link(handle, link).remote_bus_id
        raise_if_missing(remote)
        return pci_info(remote)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        remote = self._link(handle, link).remote_type
        raise_if_missing(remote)
        return REMOTE_TYPE_CODES.get(remote, 0xFF)

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return self._field(handle, "numa_node")

    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpu_set_size: int) -> list[int]:
        words = [0] * cpu_set_size
        for cpu in self._field(handle, "cpu_affinity"):
            if cpu // 64 < cpu_set_size:
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    # -- health ----------------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        if error_type != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # only uncorrected is recorded
        name = "ecc_uncorrected_volatile" if counter_type == pynvml.NVML_VOLATILE_ECC else "ecc_uncorrected_aggregate"
        return self._field(handle, name)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        return int(self._field(handle, "retired_pages_pending"))

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        rows = self._field(handle, "remapped_rows")
        return rows.correctable, rows.uncorrectable, int(rows.pending), int(rows.failed)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._field(handle, "clock_event_reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._field(handle, "clock_event_reasons")

    def _fill_fabric(self, handle: Any, ref: Any) -> int:
        fabric = self._field(handle, "fabric")
        info = ref._obj  # the probe passes ctypes.byref(struct), as pynvml requires
        names = {f[0] for f in type(info)._fields_}
        info.state = FABRIC_STATE_CODES[fabric.state]
        info.status = RETURN_CODES.get(fabric.status, pynvml.NVML_ERROR_UNKNOWN)
        health = fabric.health if isinstance(fabric.health, str) else None
        if "healthSummary" in names:
            info.healthSummary = FABRIC_HEALTH_CODES.get(health, 0) if health else 0
        if "healthMask" in names:
            info.healthMask = FABRIC_HEALTH_MASKS.get(health, 0) if health else 0
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, ref: Any) -> int:
        return self._fill_fabric(handle, ref)

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, ref: Any) -> int:
        return self._fill_fabric(handle, ref)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return [
            SimpleNamespace(
                pid=p.pid,
                usedGpuMemory=None if p.used_memory_mib is None else p.used_memory_mib * MIB,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for p in self._field(handle, "processes")
        ]

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._field(handle, "temperature_c")

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return round(self._field(handle, "power_draw_w") * 1000)

    def nvmlDeviceGetInforomImageVersion(self, handle: Any) -> str:
        return self._field(handle, "inforom_image")

    def nvmlDeviceGetGspFirmwareVersion(self, handle: Any) -> bytes:
        return self._field(handle, "gsp_firmware").encode()  # pynvml hands back the raw buffer

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        gpu = self._device(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, field_id in zip(values, field_ids, strict=True):
            slot.fieldId = field_id
            action = gpu.recovery_action if field_id == FI_DEV_GET_GPU_RECOVERY_ACTION else Missing("unsupported")
            if isinstance(action, Missing):
                slot.nvmlReturn = REASON_CODES.get(action.reason, pynvml.NVML_ERROR_UNKNOWN)
                continue
            slot.nvmlReturn = pynvml.NVML_SUCCESS
            slot.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
            slot.value.uiVal = RECOVERY_ACTION_CODES[action]
        return values

    def nvmlDeviceGetSramEccErrorStatus(self, handle: Any, ref: Any) -> int:
        sram = self._field(handle, "sram_ecc")
        status = ref._obj  # the probe passes ctypes.byref(struct), as pynvml requires
        status.aggregateUncParity = sram.aggregate_uncorrectable_parity
        status.aggregateUncSecDed = sram.aggregate_uncorrectable_secded
        status.volatileUncParity = sram.volatile_uncorrectable_parity
        status.volatileUncSecDed = sram.volatile_uncorrectable_secded
        status.bThresholdExceeded = int(sram.threshold_exceeded)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMemoryErrorCounter(self, handle: Any, error_type: int, counter_type: int, location: int) -> int:
        if error_type != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED or location != NVML_MEMORY_LOCATION_DRAM:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # only DRAM uncorrected is recorded
        volatile = counter_type == pynvml.NVML_VOLATILE_ECC
        return self._field(handle, "ecc_uncorrected_dram_volatile" if volatile else "ecc_uncorrected_dram_aggregate")

    def nvmlDeviceGetRowRemapperHistogram(self, handle: Any) -> Any:
        hist = self._field(handle, "remap_histogram")
        values = pynvml.c_nvmlRowRemapperHistogramValues()
        for name in ("max", "high", "partial", "low", "none"):
            setattr(values, name, getattr(hist, name))
        return values

    def _counter(self, key: tuple[object, ...], first: Any, later: Any) -> int:
        """The first reading of an error counter, then the later one (when recorded)."""
        reads = self.counter_reads[key] = self.counter_reads.get(key, 0) + 1
        value = later if reads > 1 and not isinstance(later, Missing) else first
        raise_if_missing(value)
        return value

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        gpu = self._device(handle)
        return self._counter((gpu.index, "pcie"), gpu.pcie_replays, gpu.pcie_replays_later)

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        nvlink = self._link(handle, link)
        first, later = nvlink.errors, nvlink.errors_later
        raise_if_missing(first)
        name = NVLINK_COUNTER_FIELDS[counter]
        later_value = getattr(later, name) if not isinstance(later, Missing) else later
        return self._counter((handle.gpu.index, link, counter), getattr(first, name), later_value)

    # -- pairs -----------------------------------------------------------------------------

    def _pair(self, h1: Any, h2: Any) -> Any:
        a, b = self._device(h1).index, self._device(h2).index
        pair = self.snapshot.pair(a, b)
        if pair is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pair

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: Any, h2: Any) -> int:
        level = self._pair(h1, h2).pcie_level
        raise_if_missing(level)
        return LEVEL_CODES[level]

    def nvmlDeviceGetP2PStatus(self, h1: Any, h2: Any, index: int) -> int:
        pair = self._pair(h1, h2)
        status = pair.p2p_read if index == pynvml.NVML_P2P_CAPS_INDEX_READ else pair.p2p_write
        raise_if_missing(status)
        return P2P_CODES[status]
