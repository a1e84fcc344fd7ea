"""What one `watch` sample costs in NVML time, at 8 and 32 GPUs, against the fake NVML's modelled latency.

    PYTHONPATH=. .venv/bin/python benchmarks/sampler_cost.py [--reads 20]

Target (issue 19): under 20 ms a sample for 8 GPUs. The fake NVML (tests/fakes/nvml_c.py) sleeps each
C call for what it cost on an H200 (driver 580.159.04, /work/gpurun1/nvml_calls.json medians: the
20 ms-window nvmlDeviceGetPcieThroughput 21.1 ms, ProcessUtilization 2.8 ms, the per-sample reads
0.006-0.12 ms). Figures, each the median of `--reads` samples on the sampling thread:

- floor: the bare pynvml calls a sample cannot do without, made in a loop on the same fake: per GPU
  utilization, memory (v2), power, temperature (V), SM clock, clock event reasons, the PCIe byte
  counters (one field-values call); one event-set poll;
- sampler: `NvmlSampler.read()` on a driver with the PCIe byte counters (R555+), and on one without
  (the 20 ms call then runs on the sampler's PCIe thread, not here);
- before: the floor plus the two 20 ms PCIe calls per GPU the sampler used to make in every sample;
- process readings (`processes()` + `process_utilization()`), which `watch` takes every
  `--process-interval` (5 s by default), not every sample: their cost and its share of a second.

time.sleep has a floor of its own (timer slack, ~0.05-0.1 ms on Linux), paid alike by the floor and
the sampler: the ratio is the figure that travels, the milliseconds are this machine's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.fakes: the fake NVML

from gpudoctor.probe.nvml import Nvml  # noqa: E402
from gpudoctor.probe.sampler import NvmlSampler  # noqa: E402
from gpudoctor.snapshot import GpuProcess, Snapshot  # noqa: E402
from tests.fakes.fake_nvml import FakeNvml, LiveGpu  # noqa: E402
from tests.fakes.machines import h100_nvswitch_8x  # noqa: E402

TARGET_MS = 20.0


def machine(n: int) -> Snapshot:
    """`n` H100s: the recorded HGX's GPU 0 copied, each busy with one process."""
    source = h100_nvswitch_8x()
    gpus = [
        dataclasses.replace(
            source.gpu(0),
            index=i,
            uuid=f"GPU-00002330-0001-1eef-9919-{i:012x}",
            pci_bus_id=f"00000000:{0x10 + i:02X}:00.0",
            memory_reserved_mib=529,
            processes=[GpuProcess(pid=100_000 + i, used_memory_mib=60000)],
        )
        for i in range(n)
    ]
    return dataclasses.replace(source, gpus=gpus, pairs=[])


def fake(n: int, counters: bool) -> FakeNvml:
    now = time.time()
    live = {
        i: LiveGpu(
            util=95,
            pcie_rx_kbps=1024000,
            pcie_tx_kbps=1024000,
            pcie_counters=counters,
            util_samples=[(100_000 + i, int(now * 1e6) + 10**9, 90)],
        )
        for i in range(n)
    }
    return FakeNvml(machine(n), live=live, sleep=True)


def median_ms(fn: Any, reads: int, library: Any) -> tuple[float, float]:
    """Median wall ms of `fn` and the modelled NVML ms it spent on this thread (exact)."""
    fn()  # the first call of each kind pays once (handles, the PCIe baseline)
    times, nvml = [], []
    for _ in range(reads):
        before = library.modelled_s()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
        nvml.append((library.modelled_s() - before) * 1e3)
    return statistics.median(times), statistics.median(nvml)


def floor_ms(n: int, reads: int, pcie_calls: bool = False) -> tuple[float, float]:
    """The bare calls of one sample, made straight on pynvml (the fake's), no sampler around them."""
    lib = fake(n, counters=True)
    lib.nvmlInit()
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    event_set = lib.nvmlEventSetCreate()
    for h in handles:
        lib.nvmlDeviceRegisterEvents(h, 0x8, event_set)

    def sample() -> None:
        for h in handles:
            lib.nvmlDeviceGetUtilizationRates(h)
            lib.nvmlDeviceGetMemoryInfo(h, version=lib.nvmlMemory_v2)
            lib.nvmlDeviceGetPowerUsage(h)
            lib.nvmlDeviceGetTemperatureV(h, 0)
            lib.nvmlDeviceGetClockInfo(h, 1)
            lib.nvmlDeviceGetCurrentClocksEventReasons(h)
            lib.nvmlDeviceGetFieldValues(h, [198, 197])
            if pcie_calls:  # what every sample used to wait for: two 20 ms windows per GPU
                lib.nvmlDeviceGetPcieThroughput(h, 1)
                lib.nvmlDeviceGetPcieThroughput(h, 0)
        try:
            lib.nvmlEventSetWait_v2(event_set, 0)
        except lib.NVMLError_Timeout:
            pass

    try:
        return median_ms(sample, reads, lib.library)
    finally:
        lib.nvmlShutdown()


def sampler_ms(n: int, reads: int, counters: bool) -> tuple[tuple[float, float], tuple[float, float]]:
    """(wall, NVML) ms of read(), and of the process readings, on the sampling thread."""
    lib = fake(n, counters)
    sampler = NvmlSampler(Nvml(lib))
    assert sampler.open().ok
    try:
        sample = median_ms(sampler.read, reads, lib.library)
        procs = median_ms(lambda: (sampler.processes(), sampler.process_utilization()), max(3, reads // 4), lib.library)
        return sample, procs
    finally:
        sampler.close()


def row(label: str, figures: tuple[float, float], floor: tuple[float, float], note: str = "") -> str:
    wall, nvml = figures
    return f"  {label:<46} {wall:9.2f} {nvml:10.2f} {wall / floor[0]:8.2f}x{note}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=20)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"median of {args.reads} samples each; load average {load:.2f} on {os.cpu_count()} CPUs")
    print("fake NVML latency: H200, driver 580.159.04 (PcieThroughput 21.1 ms, ProcessUtilization 2.8 ms)")
    print("wall: milliseconds on the sampling thread, the fake's own Python included (the same in the floor);")
    print("NVML: the modelled NVML milliseconds in it (exact); target: NVML + the sampler's wall above the floor")
    for n in (8, 32):
        floor = floor_ms(n, args.reads)
        counters, procs = sampler_ms(n, args.reads, counters=True)
        threaded, _ = sampler_ms(n, args.reads, counters=False)
        before = floor_ms(n, max(2, args.reads // 10), pcie_calls=True)
        cost = counters[1] + max(0.0, counters[0] - floor[0])
        verdict = f"  -> {cost:.2f} ms a sample: target < {TARGET_MS:g} ms {'met' if cost < TARGET_MS else 'NOT met'}"
        print(f"{n} GPUs:{'':<41}  wall ms    NVML ms  / floor")
        print(row("floor (the bare calls of a sample)", floor, floor))
        print(row("sampler, PCIe byte counters (R555+)", counters, floor, verdict if n == 8 else ""))
        print(row("sampler, no counters (20 ms call on a thread)", threaded, floor))
        print(row("before (two 20 ms PCIe calls per GPU inline)", before, floor))
        print(row("process readings (watch: every 5 s)", procs, floor, f"  = {procs[0] / 5000:.2%} of the 5 s"))


if __name__ == "__main__":
    main()
