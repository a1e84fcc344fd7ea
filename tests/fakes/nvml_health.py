"""The fake NVML's health and pair symbols (ECC, row remapping, fabric, processes, field values,
error counters, topology): a mixin of SnapshotLibrary (tests/fakes/fake_nvml.py)."""

from __future__ import annotations

from typing import Any

from gpudoctor.knowledge.units import MIB
from gpudoctor.snapshot import Gpu, Missing
from tests.fakes import nvml_c as c
from tests.fakes.nvml_c import NvmlError, put, put_text, target, value
from tests.fakes.nvml_h import (
    FABRIC_HEALTH_CODES,
    FABRIC_HEALTH_MASKS,
    FABRIC_STATE_CODES,
    FABRIC_V2,
    FABRIC_V3,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    FI_RECOVERY_ACTION,
    LEVEL_CODES,
    MEMORY_ERROR_UNCORRECTED,
    MEMORY_LOCATION_DRAM,
    NOT_AVAILABLE_ULL,
    NVLINK_COUNTER_FIELDS,
    P2P_CAPS_INDEX_READ,
    P2P_CODES,
    REASON_CODES,
    RECOVERY_ACTION_CODES,
    SRAM_ECC_V1,
    STATUS_CODES,
    TEMPERATURE_V1,
    VALUE_TYPE_UINT,
    VALUE_TYPE_ULL,
    VOLATILE_ECC,
    raise_if_missing,
)


class HealthSymbols:
    """Needs the SnapshotLibrary's _device, _field, _scalar, _link, _index_of, _mig_denied,
    _listed_pid, live, wall, t0, counter_reads, snapshot, root, documented_root."""

    # -- health -------------------------------------------------------------------------------------------
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: Any, counter_type: Any, ref: Any) -> None:
        if value(error_type) != MEMORY_ERROR_UNCORRECTED:
            raise NvmlError(c.NOT_SUPPORTED)  # only uncorrected counts are recorded
        volatile = value(counter_type) == VOLATILE_ECC
        self._scalar(handle, ref, "ecc_uncorrected_volatile" if volatile else "ecc_uncorrected_aggregate", "")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, ref: Any) -> None:
        self._scalar(handle, ref, "retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus")

    def nvmlDeviceGetRemappedRows(self, handle: Any, corr: Any, unc: Any, pending: Any, failed: Any) -> None:
        rows = self._field(handle, "remapped_rows")
        for ref, v in (
            (corr, rows.correctable),
            (unc, rows.uncorrectable),
            (pending, rows.pending),
            (failed, rows.failed),
        ):
            put(ref, "remappedRows", int(v))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, ref: Any) -> None:
        self._scalar(handle, ref, "clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any, ref: Any) -> None:
        self._scalar(handle, ref, "clock_event_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")

    def _fill_fabric(self, handle: Any, ref: Any, versions: tuple[int, ...]) -> None:
        fabric = self._field(handle, "fabric")
        info = target(ref, "gpuFabricInfo")  # nvml.h 7831: the caller allocates it and sets the version
        if versions and int(info.version) not in versions:
            raise NvmlError(c.ARGUMENT_VERSION_MISMATCH)  # nvml.h 141: NVML_STRUCT_VERSION
        names = {f[0] for f in type(info)._fields_}
        info.state = FABRIC_STATE_CODES[fabric.state]
        info.status = STATUS_CODES.get(fabric.status, c.UNKNOWN)
        health = fabric.health if isinstance(fabric.health, str) else None
        if "healthSummary" in names:
            info.healthSummary = FABRIC_HEALTH_CODES.get(health, 0) if health else 0
        if "healthMask" in names:
            info.healthMask = FABRIC_HEALTH_MASKS.get(health, 0) if health else 0

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, ref: Any) -> None:
        self._fill_fabric(handle, ref, (FABRIC_V2, FABRIC_V3))

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, ref: Any) -> None:
        self._fill_fabric(handle, ref, ())

    def _listed_pid(self, pid: int) -> int:
        """A recorded PID as NVML reports it: the host's under `pid_view="host"`; under "namespace" ours,
        except a process of another namespace (`foreign`), whose utilization samples keep the host PID
        (open-gpu-kernel-modules 570.86.15, kern_perf_ctrl.c: only visible PIDs are translated)."""
        return self.host_pid(pid) if self.pid_view == "host" or pid in self.foreign else pid

    def _listed(self, handle: Any) -> list[Any]:
        """The process list: under "namespace" the driver drops processes the caller cannot see
        (535.113.01, gpu_rmapi.c _gpuConvertPid)."""
        procs = self._field(handle, "processes")
        return [p for p in procs if self.pid_view == "host" or p.pid not in self.foreign]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, procs: Any) -> int | None:
        gpu = self._device(handle)
        if self._mig_denied(gpu):
            raise NvmlError(c.NO_PERMISSION)
        listed = self._listed(handle)
        wanted = target(count, "infoCount")
        if procs is None or wanted.value < len(listed):
            wanted.value = len(listed)
            return c.SUCCESS if not listed else c.INSUFFICIENT_SIZE  # nvml.h 7384-7386
        for slot, p in zip(procs, listed, strict=False):
            slot.pid = self._listed_pid(p.pid)
            slot.usedGpuMemory = NOT_AVAILABLE_ULL if p.used_memory_mib is None else p.used_memory_mib * MIB
            slot.gpuInstanceId = slot.computeInstanceId = 0xFFFFFFFF
        wanted.value = len(listed)
        return None

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, ref: Any) -> None:
        self._scalar(handle, ref, "temperature_c", "nvmlDeviceGetTemperature")

    def nvmlDeviceGetTemperatureV(self, handle: Any, ref: Any) -> None:
        struct = target(ref, "temperature")
        c.check_version(struct, TEMPERATURE_V1, "nvmlTemperature_v1_t")
        struct.temperature = int(self._field(handle, "temperature_c", "nvmlDeviceGetTemperatureV"))

    def nvmlDeviceGetPowerUsage(self, handle: Any, ref: Any) -> None:
        put(ref, "power", round(self._field(handle, "power_draw_w", "nvmlDeviceGetPowerUsage") * 1000))

    def nvmlDeviceGetInforomImageVersion(self, handle: Any, buffer: Any, length: Any) -> None:
        put_text(buffer, length, self._field(handle, "inforom_image"))

    def nvmlDeviceGetGspFirmwareVersion(self, handle: Any, buffer: Any) -> None:
        buffer.value = self._field(handle, "gsp_firmware").encode()  # pynvml returns these bytes undecoded

    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, ref: Any) -> None:
        gpu = self._device(handle, "nvmlDeviceGetFieldValues")
        values = target(ref, "values")
        if value(count) > len(values):
            raise c.FakeViolation(f"FieldValues: count {value(count)} > array of {len(values)}")
        now = self.wall()
        for slot in values[: value(count)]:
            slot.timestamp = int(now * 1e6)  # nvml.h 3014: "CPU Timestamp of this value in microseconds since 1970"
            slot.latencyUsec = 0
            answer = self._field_value(gpu, int(slot.fieldId), now)
            if isinstance(answer, Missing):
                slot.nvmlReturn = REASON_CODES.get(answer.reason, c.UNKNOWN)
            elif isinstance(answer, tuple):
                slot.nvmlReturn, slot.valueType = c.SUCCESS, VALUE_TYPE_ULL
                slot.value.ullVal = answer[0]
            elif isinstance(answer, int) and answer >= 0:
                slot.nvmlReturn, slot.valueType = c.SUCCESS, VALUE_TYPE_UINT
                slot.value.uiVal = answer
            else:
                slot.nvmlReturn = -answer

    def _field_value(self, gpu: Gpu, field_id: int, now: float) -> Any:
        """An int (uint), a (ullVal,) tuple, a Missing, or -code for a per-field error code."""
        if field_id == FI_RECOVERY_ACTION:
            action = gpu.recovery_action
            return action if isinstance(action, Missing) else RECOVERY_ACTION_CODES[action]
        if field_id in (FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES):
            live = self.live[gpu.index]
            kbps = live.pcie_tx_kbps if field_id == FI_PCIE_TX_BYTES else live.pcie_rx_kbps
            if not live.pcie_counters or kbps is None:
                return -live.counters_code
            return ((int(kbps * 1024 * (now - self.t0)) + (1 << 40)) % (1 << 64),)  # starts high: wraps are real
        return -c.NOT_SUPPORTED

    def nvmlDeviceGetSramEccErrorStatus(self, handle: Any, ref: Any) -> None:
        status = target(ref, "status")  # pynvml passes the caller's struct through: byref or nothing works
        c.check_version(status, SRAM_ECC_V1, "nvmlEccSramErrorStatus_v1_t")
        gpu = self._device(handle, "nvmlDeviceGetSramEccErrorStatus")
        if not self.root and self.documented_root:
            raise NvmlError(c.NO_PERMISSION)  # nvml.h 8111 "Requires root/admin permissions."
        sram = gpu.sram_ecc
        raise_if_missing(sram)
        status.aggregateUncParity = sram.aggregate_uncorrectable_parity
        status.aggregateUncSecDed = sram.aggregate_uncorrectable_secded
        status.volatileUncParity = sram.volatile_uncorrectable_parity
        status.volatileUncSecDed = sram.volatile_uncorrectable_secded
        status.bThresholdExceeded = int(sram.threshold_exceeded)

    def nvmlDeviceGetMemoryErrorCounter(
        self, handle: Any, error_type: Any, counter: Any, location: Any, ref: Any
    ) -> None:
        if value(error_type) != MEMORY_ERROR_UNCORRECTED or value(location) != MEMORY_LOCATION_DRAM:
            raise NvmlError(c.NOT_SUPPORTED)  # only DRAM uncorrected counts are recorded
        volatile = value(counter) == VOLATILE_ECC
        name = "ecc_uncorrected_dram_volatile" if volatile else "ecc_uncorrected_dram_aggregate"
        self._scalar(handle, ref, name, "nvmlDeviceGetMemoryErrorCounter")

    def nvmlDeviceGetRowRemapperHistogram(self, handle: Any, ref: Any) -> None:
        hist = self._field(handle, "remap_histogram")
        values = target(ref, "values")
        for name in ("max", "high", "partial", "low", "none"):
            setattr(values, name, getattr(hist, name))

    def _counter(self, key: tuple[object, ...], first: Any, later: Any) -> int:
        """The first reading of an error counter, then the later one (when recorded)."""
        reads = self.counter_reads[key] = self.counter_reads.get(key, 0) + 1
        v = later if reads > 1 and not isinstance(later, Missing) else first
        raise_if_missing(v)
        return int(v)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any, ref: Any) -> None:
        gpu = self._device(handle, "nvmlDeviceGetPcieReplayCounter")
        put(ref, "value", self._counter((gpu.index, "pcie"), gpu.pcie_replays, gpu.pcie_replays_later))

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: Any, counter: Any, ref: Any) -> None:
        nvlink = self._link(handle, link)
        first, later = nvlink.errors, nvlink.errors_later
        raise_if_missing(first)
        name = NVLINK_COUNTER_FIELDS[value(counter)]
        later_value = getattr(later, name) if not isinstance(later, Missing) else later
        gpu = self._index_of(handle)[0].gpu
        put(
            ref,
            "counterValue",
            self._counter((gpu.index, value(link), value(counter)), getattr(first, name), later_value),
        )

    # -- pairs ----------------------------------------------------------------------------------------------
    def _pair(self, h1: Any, h2: Any) -> Any:
        a, b = self._device(h1).index, self._device(h2).index
        pair = self.snapshot.pair(a, b)
        if pair is None:
            raise NvmlError(c.NOT_SUPPORTED)
        return pair

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: Any, h2: Any, ref: Any) -> None:
        level = self._pair(h1, h2).pcie_level
        raise_if_missing(level)
        put(ref, "pathInfo", LEVEL_CODES[level])

    def nvmlDeviceGetP2PStatus(self, h1: Any, h2: Any, index: Any, ref: Any) -> None:
        pair = self._pair(h1, h2)
        status = pair.p2p_read if value(index) == P2P_CAPS_INDEX_READ else pair.p2p_write
        raise_if_missing(status)
        put(ref, "p2pStatus", P2P_CODES[status])
