"""The fake NVML's live readings for the watch sampler (utilization, clocks, PCIe throughput,
process utilization samples, XID events): a mixin of SnapshotLibrary (tests/fakes/fake_nvml.py)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

from tests.fakes import nvml_c as c
from tests.fakes.nvml_c import NvmlError, put, target, value
from tests.fakes.nvml_h import CLOCK_SM, EVENT_XID, PCIE_TX


@dataclass
class LiveGpu:
    """What a GPU is doing, for the watch sampler. Rates in KB/s as nvmlDeviceGetPcieThroughput
    answers them (None: NOT_SUPPORTED); the byte counters (fields 197/198) advance at the same rates,
    from `counters_at`, unless `pcie_counters` is False (a driver before R555: the field answers
    `counters_code`)."""

    util: int = 0
    mem_util: int = 0
    sm_clock: int = 1980
    pcie_rx_kbps: int | None = 0
    pcie_tx_kbps: int | None = 0
    pcie_counters: bool = True
    counters_code: int = c.NOT_SUPPORTED
    # (pid, timestamp in microseconds, SM %) samples nvmlDeviceGetProcessUtilization returns when newer
    # than asked; None: NOT_SUPPORTED
    util_samples: list[tuple[int, int, int]] | None = field(default_factory=list)
    xids: list[int] = field(default_factory=list)


class LiveSymbols:
    """Needs the SnapshotLibrary's _device, _listed_pid, live, devices, event_set."""

    # -- live readings (watch) ---------------------------------------------------------------------------------
    def _live(self, handle: Any, symbol: str) -> LiveGpu:
        return self.live[self._device(handle, symbol).index]

    def nvmlDeviceGetUtilizationRates(self, handle: Any, ref: Any) -> None:
        live = self._live(handle, "nvmlDeviceGetUtilizationRates")
        util = target(ref, "utilization")
        util.gpu, util.memory = live.util, live.mem_util

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: Any, ref: Any) -> None:
        live = self._live(handle, "nvmlDeviceGetClockInfo")
        if value(clock) != CLOCK_SM:
            raise NvmlError(c.NOT_SUPPORTED)
        put(ref, "clock", live.sm_clock)

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: Any, ref: Any) -> None:
        live = self._live(handle, "nvmlDeviceGetPcieThroughput")
        kbps = live.pcie_tx_kbps if value(counter) == PCIE_TX else live.pcie_rx_kbps
        if kbps is None:
            raise NvmlError(c.NOT_SUPPORTED)
        put(ref, "value", kbps)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, samples: Any, count: Any, since: Any) -> int | None:
        """nvml.h 8496-8497: samples newer than `since` (microseconds), NOT_FOUND when there is none;
        the first call (samples NULL) asks how many. Only processes with a non-zero share have a sample.
        With `pid_view="host"` the PIDs are the host's, as the process list's."""
        live = self._live(handle, "nvmlDeviceGetProcessUtilization")
        if live.util_samples is None:
            raise NvmlError(c.NOT_SUPPORTED)
        if samples is None:
            self.util_asked.append(value(since))
        newer = [s for s in live.util_samples if s[1] > value(since)]
        if not newer:
            raise NvmlError(c.NOT_FOUND)
        wanted = target(count, "processSamplesCount")
        if samples is None or wanted.value < len(newer):
            wanted.value = len(newer)
            return c.INSUFFICIENT_SIZE
        for slot, (pid, stamp, sm) in zip(samples, newer, strict=False):
            slot.pid, slot.timeStamp, slot.smUtil = self._listed_pid(pid), stamp, sm
        wanted.value = len(newer)
        return None

    def nvmlEventSetCreate(self, ref: Any) -> None:
        c.set_pointer(ref, self.event_set)

    def nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> None:
        self._device(handle, "nvmlDeviceRegisterEvents")
        if c.pointer_value(event_set) != self.event_set:
            raise NvmlError(c.INVALID_ARGUMENT)

    def nvmlEventSetWait_v2(self, event_set: Any, ref: Any, timeout_ms: Any) -> None:
        if c.pointer_value(event_set) != self.event_set:
            raise NvmlError(c.INVALID_ARGUMENT)
        for dev in self.devices:
            live = self.live[dev.gpu.index]
            if live.xids and not dev.lost:
                data = target(ref, "data")
                data.device = ctypes.cast(ctypes.c_void_p(dev.address), type(data.device))
                data.eventType, data.eventData = EVENT_XID, live.xids.pop(0)
                return
        raise NvmlError(c.TIMEOUT)  # nvml.h 9972: "if no event arrived in specified timeout"

    def nvmlEventSetFree(self, event_set: Any) -> None:
        if c.pointer_value(event_set) != self.event_set:
            raise NvmlError(c.INVALID_ARGUMENT)
