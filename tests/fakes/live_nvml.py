"""A fake pynvml answering the live readings `watch` samples (tests/probe/test_sampler.py): two H100s,
GPU 1 without a PCIe throughput counter, and knobs to lose a GPU or queue XID events. For the
probe's one-off readings of a whole machine, see fake_nvml.py (driven by a snapshot)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from gpudoctor.probe.nvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
)


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class LiveNvml:
    """Two H100s: GPU 1 has no PCIe throughput counter; `lose(0)` makes GPU 0 fall off the bus."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.lost: set[int] = set()
        self.pending_xids = [(1, 79)]
        self.util_asked: list[int] = []
        self.util_samples: list[tuple[int, int, int]] | None = None

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml"):
            object.__getattribute__(self, "calls")[name] += 1
        return object.__getattribute__(self, name)

    def _dev(self, h: int) -> int:
        if h in self.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return h

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700000

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        self._dev(h)
        return SimpleNamespace(used=61000 * 2**20, total=81559 * 2**20)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=[97, 54][self._dev(h)], memory=40)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return [612345, 330000][self._dev(h)]

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 65 + self._dev(h)

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return 1980

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        if self._dev(h) == 1:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return 2048000 if counter == 1 else 1024000  # KB/s

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0x40 if self._dev(h) == 1 else 0

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=1000 + self._dev(h), usedGpuMemory=60000 * 2**20)]

    def nvmlDeviceGetProcessUtilization(self, h: int, since_us: int) -> list[Any]:
        """GPU 0: two samples of PID 1000 newer than `since_us` (and one older, which NVML would not
        return, to check it is ignored); NOT_FOUND when there is nothing new. GPU 1: not supported."""
        if self._dev(h) == 1:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self.util_asked.append(since_us)
        if self.util_samples is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm) for pid, ts, sm in self.util_samples]

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, s: str) -> None: ...
    def nvmlEventSetFree(self, s: str) -> None: ...

    def nvmlEventSetWait_v2(self, s: str, timeout_ms: int) -> Any:
        if not self.pending_xids:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        dev, xid = self.pending_xids.pop(0)
        return SimpleNamespace(device=dev, eventData=xid)


class ProcsOf(LiveNvml):
    """GPU 0 runs `pids[0]`, GPU 1 runs `pids[1]` (host PIDs, as NVML reports them)."""

    def __init__(self, *pids: int) -> None:
        super().__init__()
        self.pids = pids

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=self.pids[h], usedGpuMemory=512 * 2**20)]
