"""Live NVML readings for `gpudoctor watch`, through `Nvml.call` (the one pynvml importer).

Per GPU, a metric that answers NOT_SUPPORTED is remembered and never asked again (shown as
n/a); a GPU that answers GPU_IS_LOST is marked lost and skipped from then on, while the
other GPUs go on being read.

Processes are resolved the way the snapshot probe resolves them (`probe.processes`): NVML
reports host PIDs, and inside an isolated PID namespace they are left unresolved rather
than pinned on whatever local process has the same number. Each process's share of the GPU's
SM time comes from nvmlDeviceGetProcessUtilization (Maxwell and newer; samples newer than the
last one seen). CPU% and RSS of the processes we can see, and the host's CPU use, load, RAM and
swap (`host_reading`, which needs no NVML), come from psutil here too, so `watch` itself reads
neither /proc nor the environment.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpudoctor.probe.device import DeviceReader
from gpudoctor.probe.gpus import CLOCK_EVENT_CALLS, read_clock_event_reasons
from gpudoctor.probe.host import guarded, pid_namespace_isolated
from gpudoctor.probe.nvml import InitResult, Nvml
from gpudoctor.probe.processes import from_nvml
from gpudoctor.snapshot import NOT_COLLECTED, GpuProcess, Missing

# NVML enum values (nvml.h), kept here so a fake library need not define them.
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_EVENT_TYPE_XID = 0x8
MIB = 1024 * 1024


@dataclass
class DeviceState:
    index: int
    handle: Any
    name: str = ""
    uuid: str = ""
    mem_total: int | None = None
    power_limit: float | None = None
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)  # metrics that answered NOT_SUPPORTED
    # Clock event reasons: the call names still to try; narrowed to the one that answered.
    throttle_calls: tuple[str, ...] = CLOCK_EVENT_CALLS
    # nvmlDeviceGetProcessUtilization returns the samples newer than this (microseconds, CPU clock).
    util_seen_us: int = 0


@dataclass(frozen=True)
class ProcessUsage:
    """What psutil says about a process we can see (by its PID in our namespace)."""

    cpu: float | None  # % of one core since the previous reading; None on the first
    rss_mib: int | None
    started: float | None = None  # psutil's create_time: who a signal would reach


class UsageReader:
    """CPU% and RSS of processes by local PID, kept between calls: CPU% is measured over the interval
    since the previous call (psutil.Process.cpu_percent), so a process's first reading has none."""

    def __init__(self) -> None:
        self._usage: dict[int, psutil.Process] = {}

    def read(self, pids: Iterable[int]) -> dict[int, ProcessUsage]:
        """A PID psutil cannot see is left out."""
        out: dict[int, ProcessUsage] = {}
        wanted = set(pids)
        for pid in wanted:
            proc = self._usage.get(pid)
            try:
                if proc is None:
                    proc = psutil.Process(pid)
                    proc.cpu_percent(None)  # the first call only starts the measurement
                    self._usage[pid] = proc
                    cpu = None
                else:
                    cpu = round(proc.cpu_percent(None), 1)
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                cpu = None
            try:
                rss: int | None = proc.memory_info().rss // MIB
            except psutil.Error:
                rss = None
            try:
                started: float | None = proc.create_time()
            except psutil.Error:
                started = None
            out[pid] = ProcessUsage(cpu, rss, started)
        for pid in list(self._usage):
            if pid not in out:
                del self._usage[pid]
        return out


class NvmlSampler:
    """Reads utilization, memory, power, temperature, clocks, PCIe, throttle reasons and XIDs."""

    def __init__(self, nvml: Nvml | None = None, indices: list[int] | None = None, root: Path | str = "/") -> None:
        self.nvml = nvml or Nvml()
        self.indices = indices
        self.root = Path(root)  # relocates the /proc reads, for tests
        self.devices: list[DeviceState] = []
        self.count = 0  # GPUs the driver reports (indices 0..count-1), whatever `indices` selected
        self.isolated: bool | Missing = NOT_COLLECTED
        self._event_set: Any = None
        self._usage = UsageReader()

    def open(self) -> InitResult:
        result = self.nvml.init()
        if not result.ok:
            return result
        count = self.nvml.call("nvmlDeviceGetCount")
        if isinstance(count, Missing):
            return InitResult("error", f"nvmlDeviceGetCount failed: {count.detail or count.reason}")
        self.count = int(count)
        wanted = range(count) if self.indices is None else [i for i in self.indices if 0 <= i < count]
        for index in wanted:
            handle = self.nvml.call("nvmlDeviceGetHandleByIndex", index)
            dev = DeviceState(index, handle)
            if isinstance(handle, Missing):
                dev.lost = handle.reason == "gpu_lost"
                dev.handle = None
                self.devices.append(dev)
                continue
            dev.name = _text(self.nvml.call("nvmlDeviceGetName", handle))
            dev.uuid = _text(self.nvml.call("nvmlDeviceGetUUID", handle))
            mem = self.nvml.call("nvmlDeviceGetMemoryInfo", handle)
            dev.mem_total = None if isinstance(mem, Missing) else int(mem.total // MIB)
            limit = self.nvml.call("nvmlDeviceGetEnforcedPowerLimit", handle)
            dev.power_limit = None if isinstance(limit, Missing) else round(limit / 1000, 1)
            self.devices.append(dev)
        self._register_xid_events()
        self.isolated = guarded(pid_namespace_isolated, self.root)
        psutil.cpu_percent(None)  # starts the host CPU measurement
        return result

    def close(self) -> None:
        if self._event_set is not None:
            self.nvml.call("nvmlEventSetFree", self._event_set)
            self._event_set = None
        self.nvml.shutdown()

    # -- one metric, remembering what is unsupported -------------------------------------------
    def _ask(self, dev: DeviceState, metric: str, fn: str, *args: Any) -> Any:
        if dev.lost or metric in dev.unsupported:
            return None
        value = self.nvml.call(fn, dev.handle, *args)
        if isinstance(value, Missing):
            if value.reason == "unsupported":
                dev.unsupported.add(metric)
            elif value.reason == "gpu_lost":
                dev.lost = True
            return None
        return value

    def _throttle(self, dev: DeviceState) -> int | None:
        if dev.lost or "throttle" in dev.unsupported:
            return None
        # The probe's fallback from the new call name to the old one (drivers before 535);
        # the name that answered is the only one asked from then on.
        reader = DeviceReader(self.nvml, dev.handle)
        value, name = read_clock_event_reasons(reader, dev.throttle_calls)
        if name is not None:
            dev.throttle_calls = (name,)
        if isinstance(value, Missing):
            if value.reason == "unsupported":
                dev.unsupported.add("throttle")
            elif value.reason == "gpu_lost":
                dev.lost = True
            return None
        return value

    def read(self) -> list[dict[str, Any]]:
        """One reading per device, as GpuReading keyword arguments (index, state, metrics)."""
        xids = self._poll_xids()
        out = []
        for dev in self.devices:
            r: dict[str, Any] = {
                "index": dev.index,
                "name": dev.name,
                "uuid": dev.uuid,
                "mem_total": dev.mem_total,
                "power_limit": dev.power_limit,
            }
            if not dev.lost:
                util = self._ask(dev, "util", "nvmlDeviceGetUtilizationRates")
                if util is not None:
                    r["util"], r["mem_util"] = int(util.gpu), int(util.memory)
                mem = self._ask(dev, "mem", "nvmlDeviceGetMemoryInfo")
                if mem is not None:
                    r["mem_used"], r["mem_total"] = int(mem.used // MIB), int(mem.total // MIB)
                power = self._ask(dev, "power", "nvmlDeviceGetPowerUsage")
                r["power"] = None if power is None else round(power / 1000, 1)
                r["temp"] = self._ask(dev, "temp", "nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU)
                r["sm_clock"] = self._ask(dev, "sm_clock", "nvmlDeviceGetClockInfo", NVML_CLOCK_SM)
                # Each PCIe throughput call samples for ~20 ms inside NVML: this runs on the poll thread.
                rx = self._ask(dev, "pcie", "nvmlDeviceGetPcieThroughput", NVML_PCIE_UTIL_RX_BYTES)
                tx = self._ask(dev, "pcie", "nvmlDeviceGetPcieThroughput", NVML_PCIE_UTIL_TX_BYTES)
                r["pcie_rx"] = None if rx is None else int(rx) // 1024  # KB/s -> MB/s
                r["pcie_tx"] = None if tx is None else int(tx) // 1024
                r["throttle"] = self._throttle(dev)
                r["xids"] = tuple(xids.get(dev.index, ()))
            r["state"] = "lost" if dev.lost else "ok"
            out.append(r)
        return out

    def processes(self) -> dict[int, list[GpuProcess]]:
        """Compute processes per GPU index, resolved as the snapshot probe resolves them."""
        out: dict[int, list[GpuProcess]] = {}
        for dev in self.devices:
            raw = self._ask(dev, "procs", "nvmlDeviceGetComputeRunningProcesses")
            if raw is not None:
                out[dev.index] = from_nvml(raw, self.root, self.isolated)
        return out

    def usage(self, pids: Iterable[int]) -> dict[int, ProcessUsage]:
        """CPU% and RSS of local PIDs (GpuProcess.local_pid); a PID psutil cannot see is left out."""
        return self._usage.read(pids)

    def process_utilization(self) -> dict[int, dict[int, int]]:
        """Per GPU index: host PID -> mean SM utilization (%) over the samples NVML took since the last
        call. NVML returns a sample only for a process with non-zero utilization, and NOT_FOUND when
        there is no new sample at all: a GPU that answered lists its idle processes as absent (0%).
        A GPU without the call is asked once and has no entry, like one that did not answer."""
        out: dict[int, dict[int, int]] = {}
        for dev in self.devices:
            if dev.lost or "proc_util" in dev.unsupported:
                continue
            if not dev.util_seen_us:  # the first time: only the recent past, not the driver's whole buffer
                dev.util_seen_us = int((time.time() - 5.0) * 1e6)
            since = dev.util_seen_us
            raw = self.nvml.call("nvmlDeviceGetProcessUtilization", dev.handle, since)
            if isinstance(raw, Missing):
                if raw.reason == "unsupported":
                    dev.unsupported.add("proc_util")
                elif raw.reason == "gpu_lost":
                    dev.lost = True
                elif raw.reason == "error":  # NOT_FOUND: no process was busy since `since`
                    out[dev.index] = {}
                continue
            per_pid: dict[int, list[int]] = {}
            for sample in raw:
                stamp = int(sample.timeStamp)
                if stamp <= since:  # NVML returns only newer samples; an older one is not this interval's
                    continue
                per_pid.setdefault(int(sample.pid), []).append(int(sample.smUtil))
                dev.util_seen_us = max(dev.util_seen_us, stamp)
            out[dev.index] = {pid: round(sum(v) / len(v)) for pid, v in per_pid.items()}
        return out

    @staticmethod
    def host_cpu() -> float:
        """Host CPU busy, % of all cores, since the previous call (or open())."""
        return round(psutil.cpu_percent(None), 1)

    # -- XID events: live only, NVML keeps no history ------------------------------------------
    def _register_xid_events(self) -> None:
        event_set = self.nvml.call("nvmlEventSetCreate")
        if isinstance(event_set, Missing):
            return
        registered = False
        for dev in self.devices:
            if dev.handle is None or dev.lost:
                continue
            ok = self.nvml.call("nvmlDeviceRegisterEvents", dev.handle, NVML_EVENT_TYPE_XID, event_set)
            registered = registered or not isinstance(ok, Missing)
        if registered:
            self._event_set = event_set
        else:
            self.nvml.call("nvmlEventSetFree", event_set)

    def _poll_xids(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        if self._event_set is None:
            return out
        for _ in range(64):  # drain what is pending; a storm of events must not stall the poll
            data = self.nvml.call("nvmlEventSetWait_v2", self._event_set, 0)
            if isinstance(data, Missing):  # NVML_ERROR_TIMEOUT: nothing pending
                break
            index = self.nvml.call("nvmlDeviceGetIndex", data.device)
            if not isinstance(index, Missing):
                out.setdefault(int(index), []).append(int(data.eventData))
        return out


def _text(value: Any) -> str:
    return "" if isinstance(value, Missing) else str(value)


def host_reading() -> dict[str, Any]:
    """Load, RAM and swap (MiB) as HostReading keyword arguments; needs no NVML (watching ranks
    without a GPU). Used RAM is total - available: what the kernel could not hand out without
    swapping or reclaiming, which is what an OOM kill follows."""
    out: dict[str, Any] = {}
    try:
        out["load1"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    try:
        mem = psutil.virtual_memory()
        out["ram_total"] = mem.total // MIB
        out["ram_used"] = (mem.total - mem.available) // MIB
    except (OSError, psutil.Error):
        pass
    try:
        swap = psutil.swap_memory()
        out["swap_total"] = swap.total // MIB
        out["swap_used"] = swap.used // MIB
    except (OSError, psutil.Error):
        pass
    return out
