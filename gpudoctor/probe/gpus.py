"""Per-GPU facts from NVML: identity, modes, links, health, processes."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, NamedTuple

from gpudoctor.knowledge.units import MIB
from gpudoctor.knowledge.xid import recovery_name
from gpudoctor.probe.device import LOST, DeviceReader, bus_id, convert_value, text
from gpudoctor.probe.fabric import fabric
from gpudoctor.probe.host import guarded
from gpudoctor.probe.links import nvlinks, pcie, read_error_counts, with_counts
from gpudoctor.probe.nvml import Nvml
from gpudoctor.probe.pci_tree import card_max_width
from gpudoctor.probe.processes import processes
from gpudoctor.snapshot import Gpu, MigDevice, Missing, RemapHistogram, RemappedRows, SramEcc

COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_TEMPERATURE_GPU = 0
MIG_ENABLED = 1
NVML_MEMORY_LOCATION_DRAM = 2  # nvmlMemoryLocation_t: DRAM (device memory, HBM/GDDR)
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230  # nvml.h field id
NVML_AFFINITY_SCOPE_NODE = 0  # nvmlAffinityScope_t
NODE_SET_WORDS = 4  # 64-bit words of NUMA nodes to ask nvmlDeviceGetMemoryAffinity for: 256 nodes


def cpu_set_words() -> int:
    """64-bit words to ask nvmlDeviceGetCpuAffinity for: enough for this machine, at least 1024 CPUs."""
    return max(16, ((os.cpu_count() or 1) + 63) // 64)


def decode_cpu_mask(words: Any) -> list[int]:
    """nvmlDeviceGetCpuAffinity's array of 64-bit words -> logical CPU ids."""
    cpus = []
    for i, word in enumerate(words):
        word = int(word)
        bit = 0
        while word:
            if word & 1:
                cpus.append(i * 64 + bit)
            word >>= 1
            bit += 1
    return cpus


# A driver without nvmlDeviceGetMemoryInfo_v2: its v1 `used` includes the reserved memory.
V1_ONLY = Missing("unsupported", "no nvmlDeviceGetMemoryInfo_v2: memory_used_mib includes the reserved memory")


def _memory_facts(memory: tuple[Any, bool] | Missing) -> dict[str, int | Missing]:
    """Total, used (allocated: v2) and reserved MiB from Nvml.memory_info's answer."""
    if isinstance(memory, Missing):
        return dict(memory_total_mib=memory, memory_used_mib=memory, memory_reserved_mib=memory)
    struct, v2 = memory
    what = "nvmlDeviceGetMemoryInfo"
    return dict(
        memory_total_mib=convert_value(struct, lambda m: int(m.total) // MIB, what),
        memory_used_mib=convert_value(struct, lambda m: int(m.used) // MIB, what),
        memory_reserved_mib=convert_value(struct, lambda m: int(m.reserved) // MIB, what) if v2 else V1_ONLY,
    )


def _bool(value: Any) -> bool:
    return bool(int(value))


def _numa(value: Any) -> int | Missing:
    node = int(value)
    return node if node >= 0 else Missing("unsupported", "NVML reports no NUMA node for this GPU")


def _remapped(value: Any) -> RemappedRows:
    corr, unc, pending, failed = value
    return RemappedRows(correctable=int(corr), uncorrectable=int(unc), pending=bool(pending), failed=bool(failed))


def _recovery_action(value: Any) -> str:
    return recovery_name(int(value))


def _sram_ecc(raw: dict[str, int]) -> SramEcc:
    return SramEcc(
        aggregate_uncorrectable_parity=raw["aggregateUncParity"],
        aggregate_uncorrectable_secded=raw["aggregateUncSecDed"],
        volatile_uncorrectable_parity=raw["volatileUncParity"],
        volatile_uncorrectable_secded=raw["volatileUncSecDed"],
        threshold_exceeded=bool(raw["bThresholdExceeded"]),
    )


def _histogram(value: Any) -> RemapHistogram:
    return RemapHistogram(**{k: int(getattr(value, k)) for k in ("max", "high", "partial", "low", "none")})


# nvml.h: nvmlDeviceGetGspFirmwareVersion answers NVML_ERROR_NOT_SUPPORTED "if GSP firmware is not
# enabled for GPU" (the probe records that as `unsupported`), and nvidia-smi prints "N/A" for it. A
# library that answers with that text, or with nothing, says the same: GSP firmware off, a fact
# (tests/reference/unreadable_readings.md), not an unknown.
GSP_OFF = Missing("unsupported", "GSP firmware off: NVML gave no version")


def _firmware(value: Any) -> str | Missing:
    version = text(value).strip()
    return GSP_OFF if version in ("", "N/A") else version


def _pair_field(value: Any, i: int, convert: Any, what: str) -> Any:
    return convert_value(value, lambda v: convert(v[i]), what)


def mig_devices(reader: DeviceReader, mode: Any) -> list[MigDevice] | Missing:
    if isinstance(mode, Missing):
        return mode
    if int(mode[0]) != MIG_ENABLED:
        return []
    count = reader.read("nvmlDeviceGetMaxMigDeviceCount", int)
    if isinstance(count, Missing):
        return count
    devices = []
    for slot in range(count):
        handle = reader.call("nvmlDeviceGetMigDeviceHandleByIndex", slot)
        if isinstance(handle, Missing):
            if handle.reason == "gpu_lost":
                return handle
            continue  # an empty slot answers NOT_FOUND
        uuid = convert_value(reader.nvml.call("nvmlDeviceGetUUID", handle), text, "nvmlDeviceGetUUID")
        memory = reader.nvml.call("nvmlDeviceGetMemoryInfo", handle)
        devices.append(
            MigDevice(
                index=slot,
                uuid=uuid if isinstance(uuid, str) else "",
                memory_total_mib=convert_value(memory, lambda m: int(m.total) // MIB, "nvmlDeviceGetMemoryInfo"),
            )
        )
    return devices


# The same reading under its current and its deprecated call: nvml.h 13.0 marks
# nvmlDeviceGetCurrentClocksThrottleReasons DEPRECATED(13.0) (its replacement is in drivers since
# R535) and nvmlDeviceGetTemperature DEPRECATED(13.0) (nvmlDeviceGetTemperatureV since R570). The
# current call is asked first, so a driver that drops the old one does not turn a reading into n/a;
# an older driver answers FUNCTION_NOT_FOUND for the new one, and the old one is asked.
CLOCK_EVENT_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
TEMPERATURE_CALLS = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")


def read_first(reader: DeviceReader, calls: tuple[str, ...], *args: Any) -> tuple[int | Missing, str | None]:
    """The integer the first call that has an answer gives, and that call's name (None while every
    name is unsupported).

    A name that is `unsupported` (missing from nvidia-ml-py, or FUNCTION_NOT_FOUND in the
    driver) passes to the next; any other answer, error or not, is the answer. A caller that
    asks repeatedly (the watch sampler) passes `(name,)` once a name has answered.
    """
    value: int | Missing = Missing("unsupported", f"no {calls[0]} call")
    for name in calls:
        value = reader.read(name, int, *args)
        if not (isinstance(value, Missing) and value.reason == "unsupported"):
            return value, name
    return value, None


def read_clock_event_reasons(
    reader: DeviceReader, calls: tuple[str, ...] = CLOCK_EVENT_CALLS
) -> tuple[int | Missing, str | None]:
    return read_first(reader, calls)


def clock_event_reasons(reader: DeviceReader) -> int | Missing:
    return read_clock_event_reasons(reader)[0]


_IDENTITY = ("index", "uuid", "name", "pci_bus_id", "lost", "unreachable")


def unreachable_gpu(index: int, why: Missing, pci_bus_id: str = "") -> Gpu:
    """A GPU whose handle NVML would not give: every fact carries the reason, `unreachable` says
    it in words, and the bus id comes from the kernel driver when it could tell."""
    fields = {f.name: why for f in dataclasses.fields(Gpu) if f.name not in _IDENTITY}
    return Gpu(
        index=index,
        uuid="",
        name="",
        pci_bus_id=pci_bus_id,
        lost=why.reason == "gpu_lost",
        unreachable=f"nvmlDeviceGetHandleByIndex({index}): {why.detail or why.reason}",
        **fields,
    )


class GpuReading(NamedTuple):
    gpu: Gpu
    handle: Any  # the NVML handle, or a Missing once the GPU cannot be asked
    counted_at: float | None  # when its error counters were read (None: not read)


def read_gpu(nvml: Nvml, index: int, root: Path, isolated: bool | Missing, pci_bus_id: str = "") -> GpuReading:
    """The facts of GPU `index` and its handle. `pci_bus_id` (from the kernel driver) names a
    GPU NVML gives no handle for."""
    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    if isinstance(handle, Missing):
        return GpuReading(unreachable_gpu(index, handle, pci_bus_id), handle, None)
    r = DeviceReader(nvml, handle)
    uuid = r.read("nvmlDeviceGetUUID", text)
    name = r.read("nvmlDeviceGetName", text)
    pci = convert_value(r.call("nvmlDeviceGetPciInfo"), bus_id, "nvmlDeviceGetPciInfo")
    memory = r.memory()
    mig_mode = r.call("nvmlDeviceGetMigMode")
    ecc_mode = r.call("nvmlDeviceGetEccMode")
    compute_capability = r.read("nvmlDeviceGetCudaComputeCapability", lambda v: f"{int(v[0])}.{int(v[1])}")
    facts: dict[str, Any] = dict(
        **_memory_facts(memory),
        compute_capability=compute_capability,
        vbios=r.read("nvmlDeviceGetVbiosVersion", text),
        power_limit_w=r.read("nvmlDeviceGetEnforcedPowerLimit", lambda mw: int(mw) / 1000.0),
        persistence_mode=r.read("nvmlDeviceGetPersistenceMode", _bool),
        compute_mode=r.read("nvmlDeviceGetComputeMode", lambda m: COMPUTE_MODES.get(int(m), f"mode_{int(m)}")),
        mig_mode_current=_pair_field(mig_mode, 0, _bool, "nvmlDeviceGetMigMode"),
        mig_mode_pending=_pair_field(mig_mode, 1, _bool, "nvmlDeviceGetMigMode"),
        mig_devices=mig_devices(r, mig_mode),
        ecc_mode_current=_pair_field(ecc_mode, 0, _bool, "nvmlDeviceGetEccMode"),
        ecc_mode_pending=_pair_field(ecc_mode, 1, _bool, "nvmlDeviceGetEccMode"),
        **pcie(r),
        pcie_width_gpu_max=guarded(card_max_width, root, pci) if isinstance(pci, str) else pci,
        nvlinks=nvlinks(r, compute_capability),
        numa_node=r.read("nvmlDeviceGetNumaNodeId", _numa),
        cpu_affinity=r.read("nvmlDeviceGetCpuAffinity", decode_cpu_mask, cpu_set_words()),
        numa_affinity=r.read("nvmlDeviceGetMemoryAffinity", decode_cpu_mask, NODE_SET_WORDS, NVML_AFFINITY_SCOPE_NODE),
        ecc_uncorrected_volatile=r.read(
            "nvmlDeviceGetTotalEccErrors", int, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
        ),
        ecc_uncorrected_aggregate=r.read(
            "nvmlDeviceGetTotalEccErrors", int, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC
        ),
        retired_pages_pending=r.read("nvmlDeviceGetRetiredPagesPendingStatus", _bool),
        remapped_rows=r.read("nvmlDeviceGetRemappedRows", _remapped),
        clock_event_reasons=clock_event_reasons(r),
        fabric=fabric(r),
        processes=processes(r, root, isolated),
        temperature_c=read_first(r, TEMPERATURE_CALLS, NVML_TEMPERATURE_GPU)[0],
        power_draw_w=r.read("nvmlDeviceGetPowerUsage", lambda mw: int(mw) / 1000.0),
        inforom_image=r.read("nvmlDeviceGetInforomImageVersion", text),
        gsp_firmware=r.read("nvmlDeviceGetGspFirmwareVersion", _firmware),
        recovery_action=convert_value(
            r.field(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), _recovery_action, "recovery action"
        ),
        sram_ecc=convert_value(
            r.struct("nvmlDeviceGetSramEccErrorStatus", "c_nvmlEccSramErrorStatus_v1_t"), _sram_ecc, "SRAM ECC status"
        ),
        ecc_uncorrected_dram_volatile=r.read(
            "nvmlDeviceGetMemoryErrorCounter",
            int,
            NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            NVML_VOLATILE_ECC,
            NVML_MEMORY_LOCATION_DRAM,
        ),
        ecc_uncorrected_dram_aggregate=r.read(
            "nvmlDeviceGetMemoryErrorCounter",
            int,
            NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            NVML_AGGREGATE_ECC,
            NVML_MEMORY_LOCATION_DRAM,
        ),
        remap_histogram=r.read("nvmlDeviceGetRowRemapperHistogram", _histogram),
    )
    # The error counters come last: the end of the probe reads them again (machine.py), and
    # the time between the two readings is then as long as it can be.
    counts = read_error_counts(r, facts["nvlinks"])
    facts["nvlinks"] = with_counts(facts["nvlinks"], counts)
    gpu = Gpu(
        index=index,
        uuid=uuid if isinstance(uuid, str) else "",
        name=name if isinstance(name, str) else "",
        pci_bus_id=pci if isinstance(pci, str) else "",
        lost=r.lost,
        pcie_replays=counts.pcie_replays,
        **facts,
    )
    return GpuReading(gpu, LOST if r.lost else handle, counts.at if counts.any_read else None)
