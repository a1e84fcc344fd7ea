"""The strict fake NVML (fake_nvml.py) set up for the watch sampler (tests/probe/test_sampler.py):
two H100s of the recorded HGX machine, busy, GPU 1 without PCIe throughput readings or process
utilization samples, an XID 79 pending on GPU 1, and knobs to lose a GPU or add samples."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpudoctor.snapshot import GpuProcess, Snapshot
from tests.fakes.fake_nvml import FakeNvml, LiveGpu
from tests.fakes.machines import h100_nvswitch_8x

NAME = "NVIDIA H100 80GB HBM3"


class Clock:
    """A wall clock for the fake's timestamps (PCIe byte counters) that moves only when told."""

    def __init__(self, start: float = 1_795_724_772.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def two_h100s(*pids: int, memory_mib: int = 60000) -> Snapshot:
    """GPUs 0 and 1 of the HGX H100, GPU `i` running `pids[i]` (1000 + i by default)."""
    source = h100_nvswitch_8x()
    pids = pids or (1000, 1001)
    gpus = [
        dataclasses.replace(
            source.gpu(i),
            memory_used_mib=61000,
            memory_reserved_mib=0,
            power_draw_w=[612.345, 330.0][i],
            temperature_c=65 + i,
            clock_event_reasons=[0, 0x40][i],  # GPU 1: software thermal slowdown
            processes=[GpuProcess(pid=pids[i], used_memory_mib=memory_mib)],
        )
        for i in (0, 1)
    ]
    return dataclasses.replace(source, gpus=gpus, pairs=[])


class LiveNvml(FakeNvml):
    """Two busy H100s: GPU 0 moves 2000 MB/s in, 1000 MB/s out over PCIe; GPU 1 answers NOT_SUPPORTED
    for PCIe throughput (and has no byte counters) and for process utilization."""

    def __init__(self, *pids: int, memory_mib: int = 60000, **options: Any) -> None:
        live = {
            0: LiveGpu(util=97, mem_util=40, pcie_rx_kbps=2048000, pcie_tx_kbps=1024000),
            1: LiveGpu(util=54, mem_util=40, pcie_rx_kbps=None, pcie_tx_kbps=None, util_samples=None, xids=[79]),
        }
        super().__init__(two_h100s(*pids, memory_mib=memory_mib), live=live, **options)

    def live(self, index: int) -> LiveGpu:
        return self.library.live[index]  # type: ignore[attr-defined,no-any-return]

    def lose(self, index: int) -> None:
        """GPU `index` falls off the bus: every later call to it answers GPU_IS_LOST."""
        self.devices[index].lost = True

    @property
    def util_asked(self) -> list[int]:
        return self.library.util_asked  # type: ignore[attr-defined,no-any-return]


def busy_h100s(n: int = 8, *, counters: bool = True, **options: Any) -> FakeNvml:
    """`n` busy H100s of the HGX machine (8 at most), each moving 1000 MB/s each way; without PCIe byte
    counters when `counters` is False (a driver before R555: the field answers NOT_SUPPORTED)."""
    source = h100_nvswitch_8x()
    gpus = [dataclasses.replace(g, memory_reserved_mib=529) for g in source.gpus[:n]]
    live = {
        g.index: LiveGpu(util=95, mem_util=40, pcie_rx_kbps=1024000, pcie_tx_kbps=1024000, pcie_counters=counters)
        for g in gpus
    }
    return FakeNvml(dataclasses.replace(source, gpus=gpus, pairs=[]), live=live, **options)


def ProcsOf(*pids: int) -> LiveNvml:  # noqa: N802  (reads as the fake it makes)
    """GPU 0 runs `pids[0]`, GPU 1 runs `pids[1]`, 512 MiB each."""
    return LiveNvml(*pids, memory_mib=512)
