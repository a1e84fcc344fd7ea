"""Live NVML readings for `gpudoctor watch`, through `Nvml.call` (the one pynvml importer).

Per GPU, a metric that answers NOT_SUPPORTED (or another "not there" code: probe/nvml.py) is
remembered and never asked again (shown as n/a); a GPU that answers GPU_IS_LOST is marked lost and
skipped from then on, while the other GPUs go on being read. A metric that keeps failing with an
error (UNKNOWN: a container that lost its device, nvidia-container-toolkit #48) is asked less and
less often (`Backoff`), so a broken reading does not cost every sample its NVML time.

What one sample costs matters (the watch loop and the level-3 checks sample once a second): the
calls on the sampling thread are the sub-millisecond ones (H200, driver 580.159.04:
/work/gpurun1/nvml_calls.json); PCIe traffic comes from byte counters or a thread of its own
(probe/pcie_rates.py); process readings are asked only when the caller wants them (watch: every
`--process-interval`), since nvmlDeviceGetProcessUtilization costs ~3 ms per GPU.
benchmarks/sampler_cost.py measures it against the fake NVML's modelled latency.

Processes are resolved the way the snapshot probe resolves them (`probe.processes`). Each process's
share of the GPU's SM time comes from nvmlDeviceGetProcessUtilization (Maxwell and newer; samples
newer than the last one seen). CPU% and RSS of the processes we can see, and the host's CPU use,
load, RAM and swap (`host_reading`, which needs no NVML), come from psutil here too, so `watch`
itself reads neither /proc nor the environment.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpudoctor.probe.device import DeviceReader
from gpudoctor.probe.gpus import CLOCK_EVENT_CALLS, TEMPERATURE_CALLS, read_first
from gpudoctor.probe.host import guarded, pid_namespace_isolated
from gpudoctor.probe.nvml import NVML_ERROR_NOT_FOUND, NVML_ERROR_TIMEOUT, InitResult, Nvml
from gpudoctor.probe.pcie_rates import PcieRates, handles_of
from gpudoctor.probe.pids import PidView, pid_view
from gpudoctor.probe.processes import from_nvml
from gpudoctor.snapshot import NOT_COLLECTED, GpuProcess, Missing

# NVML enum values (nvml.h), kept here so a fake library need not define them.
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_EVENT_TYPE_XID = 0x8
MIB = 1024 * 1024
# A metric that failed this many times in a row is asked again after BACKOFF_FIRST_S, then twice as
# long each time up to BACKOFF_MAX_S (a heuristic: a transient error clears within seconds; one that
# persists is a state, and once a few minutes keeps the reading from staying stale for good).
BACKOFF_AFTER = 3
BACKOFF_FIRST_S = 30.0
BACKOFF_MAX_S = 300.0


@dataclass
class Backoff:
    failures: int = 0
    next_at: float = 0.0  # monotonic seconds: not asked before


@dataclass
class DeviceState:
    index: int
    handle: Any
    name: str = ""
    uuid: str = ""
    mem_total: int | None = None
    power_limit: float | None = None
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)  # metrics that are not there (NOT_SUPPORTED, ...)
    failing: dict[str, Backoff] = field(default_factory=dict)  # metrics that answered errors lately
    # The calls still to try for a reading with a current and a deprecated call, narrowed to the one
    # that answered; the memory struct version likewise.
    throttle_calls: tuple[str, ...] = CLOCK_EVENT_CALLS
    temperature_calls: tuple[str, ...] = TEMPERATURE_CALLS
    memory_v2: bool = True
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

    def __init__(
        self,
        nvml: Nvml | None = None,
        indices: list[int] | None = None,
        root: Path | str = "/",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml = nvml or Nvml()
        self.indices = indices
        self.root = Path(root)  # relocates the /proc reads, for tests
        self.clock = clock  # when a failing metric may be asked again
        self.devices: list[DeviceState] = []
        self.count = 0  # GPUs the driver reports (indices 0..count-1), whatever `indices` selected
        self.isolated: bool | Missing = NOT_COLLECTED
        self.pids: PidView | None = None
        self.pcie = PcieRates(self.nvml, lambda: int(time.time() * 1e6))
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
            mem = self.nvml.memory_info(handle)
            if not isinstance(mem, Missing):
                dev.mem_total, dev.memory_v2 = int(mem[0].total // MIB), mem[1]
            limit = self.nvml.call("nvmlDeviceGetEnforcedPowerLimit", handle)
            dev.power_limit = None if isinstance(limit, Missing) else round(limit / 1000, 1)
            self.devices.append(dev)
        self._register_xid_events()
        self.pcie.open(handles_of(self.devices))
        self.isolated = guarded(pid_namespace_isolated, self.root)
        self.pids = pid_view(self.root, self.isolated)
        psutil.cpu_percent(None)  # starts the host CPU measurement
        return result

    def close(self) -> None:
        self.pcie.close()
        if self._event_set is not None:
            self.nvml.call("nvmlEventSetFree", self._event_set)
            self._event_set = None
        self.nvml.shutdown()

    # -- one metric: remembering what is not there, backing off what keeps failing --------------------
    def _due(self, dev: DeviceState, metric: str) -> bool:
        if dev.lost or metric in dev.unsupported:
            return False
        backoff = dev.failing.get(metric)
        return backoff is None or backoff.failures < BACKOFF_AFTER or self.clock() >= backoff.next_at

    def _noted(self, dev: DeviceState, metric: str, value: Any) -> Any:
        """The value, or None after noting why there is none."""
        if not isinstance(value, Missing):
            dev.failing.pop(metric, None)
            return value
        if value.reason in ("unsupported", "no_permission"):
            dev.unsupported.add(metric)  # neither changes while we watch
        elif value.reason == "gpu_lost":
            dev.lost = True
        else:
            backoff = dev.failing.setdefault(metric, Backoff())
            backoff.failures += 1
            if backoff.failures >= BACKOFF_AFTER:
                wait = min(BACKOFF_FIRST_S * 2 ** (backoff.failures - BACKOFF_AFTER), BACKOFF_MAX_S)
                backoff.next_at = self.clock() + wait
        return None

    def _ask(self, dev: DeviceState, metric: str, fn: str, *args: Any) -> Any:
        if not self._due(dev, metric):
            return None
        return self._noted(dev, metric, self.nvml.call(fn, dev.handle, *args))

    def _first_of(self, dev: DeviceState, metric: str, calls: str, *args: Any) -> int | None:
        """A reading with a current and a deprecated call (probe.gpus.read_first): the name that
        answered is the only one asked from then on."""
        if not self._due(dev, metric):
            return None
        value, name = read_first(DeviceReader(self.nvml, dev.handle), getattr(dev, calls), *args)
        if name is not None:
            setattr(dev, calls, (name,))
        return self._noted(dev, metric, value)  # type: ignore[no-any-return]

    def _memory(self, dev: DeviceState) -> tuple[int, int] | None:
        if not self._due(dev, "mem"):
            return None
        answer = self._noted(dev, "mem", self.nvml.memory_info(dev.handle, dev.memory_v2))
        if answer is None:
            return None
        mem, dev.memory_v2 = answer
        return int(mem.used // MIB), int(mem.total // MIB)

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
                mem = self._memory(dev)  # v2: allocated, as nvidia-smi prints it
                if mem is not None:
                    r["mem_used"], r["mem_total"] = mem
                power = self._ask(dev, "power", "nvmlDeviceGetPowerUsage")
                r["power"] = None if power is None else round(power / 1000, 1)
                r["temp"] = self._first_of(dev, "temp", "temperature_calls", NVML_TEMPERATURE_GPU)
                r["sm_clock"] = self._ask(dev, "sm_clock", "nvmlDeviceGetClockInfo", NVML_CLOCK_SM)
                r["pcie_rx"], r["pcie_tx"] = self.pcie.read(dev.index)
                r["throttle"] = self._first_of(dev, "throttle", "throttle_calls")
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
                out[dev.index] = from_nvml(raw, self.root, self.pids or pid_view(self.root, self.isolated))
        return out

    def usage(self, pids: Iterable[int]) -> dict[int, ProcessUsage]:
        """CPU% and RSS of local PIDs (GpuProcess.local_pid); a PID psutil cannot see is left out."""
        return self._usage.read(pids)

    def process_utilization(self) -> dict[int, dict[int, int]]:
        """Per GPU index: NVML PID -> mean SM utilization (%) over the samples NVML took since the last
        call. NVML returns a sample only for a process with non-zero utilization, and NOT_FOUND when
        there is no new sample at all (nvml.h 8496-8497): a GPU that answered lists its idle processes
        as absent (0%). A GPU without the call is asked once and has no entry, like one that did not
        answer (an error: backed off like any other metric)."""
        out: dict[int, dict[int, int]] = {}
        for dev in self.devices:
            if not self._due(dev, "proc_util"):
                continue
            if not dev.util_seen_us:  # the first time: only the recent past, not the driver's whole buffer
                dev.util_seen_us = int((time.time() - 5.0) * 1e6)
            since = dev.util_seen_us
            answer = self.nvml.attempt("nvmlDeviceGetProcessUtilization", dev.handle, since)
            if answer.code == NVML_ERROR_NOT_FOUND:  # no process was busy since `since`
                dev.failing.pop("proc_util", None)
                out[dev.index] = {}
                continue
            raw = self._noted(dev, "proc_util", answer.value)
            if raw is None:
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
            data = self.nvml.attempt("nvmlEventSetWait_v2", self._event_set, 0)
            if data.code == NVML_ERROR_TIMEOUT or isinstance(data.value, Missing):  # TIMEOUT: nothing pending
                break
            index = self.nvml.call("nvmlDeviceGetIndex", data.value.device)
            if not isinstance(index, Missing):
                out.setdefault(int(index), []).append(int(data.value.eventData))
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
