"""PCIe traffic of each GPU for `watch`, without NVML's 20 ms sample on the sampling thread.

nvmlDeviceGetPcieThroughput "is querying a byte counter over a 20ms interval" (nvml.h 5571) and
reads one direction per call: two calls, 42 ms per GPU per sample on the H200 (driver 580.159.04),
0.34 s a sample on 8 GPUs. Drivers since R555 expose the byte counters themselves as field values
NVML_FI_DEV_PCIE_COUNT_TX_BYTES / RX_BYTES (197 / 198, nvml.h 2735-2736, "Value can be wrapped";
NVML change log v550 -> v555), which answer at once: the rate is the difference between two
readings over NVML's own timestamps, the mean over the sampling interval rather than a 20 ms
glimpse. A GPU whose driver lacks the counters is read with the 20 ms call on a thread of its own,
and a sample shows its latest answer (at most one pass over those GPUs old).

Rates are MiB/s, as the 20 ms call's KB/s divided by 1024 has always been shown.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpudoctor.probe.nvml import FieldValue, Nvml
from gpudoctor.snapshot import Missing

FI_PCIE_COUNT_TX_BYTES = 197
FI_PCIE_COUNT_RX_BYTES = 198
NVML_PCIE_UTIL_TX_BYTES = 0  # nvmlPcieUtilCounter_t
NVML_PCIE_UTIL_RX_BYTES = 1
MIB = 1 << 20
# A rate above this is a counter reset, not traffic: PCIe 6.0 x16 moves 64 GT/s x 16 lanes = 128 GB/s
# per direction before encoding (PCI-SIG PCIe 6.0 specification overview); twice that is impossible.
MAX_PLAUSIBLE_BYTES_PER_S = 256e9


@dataclass
class _Counters:
    """The last reading of one GPU's two byte counters."""

    rx: int
    tx: int
    at_us: int
    wraps_at: int


@dataclass
class PcieState:
    """One GPU's PCIe source: "counters" (fields 197/198), "throughput" (the 20 ms call, on the
    poller thread), or None once neither answers."""

    source: str | None = None
    last: _Counters | None = None
    rx: int | None = None  # MiB/s, the latest answer of the throughput poller
    tx: int | None = None
    lost: bool = False


def _delta(now: int, before: int, wraps_at: int) -> int:
    return (now - before) % wraps_at if wraps_at else now - before


class PcieRates:
    """`open(handles)` decides each GPU's source; `read(i)` gives (rx, tx) MiB/s or (None, None)."""

    def __init__(self, nvml: Nvml, now_us: Callable[[], int]) -> None:
        self.nvml = nvml
        self.now_us = now_us  # the clock to use when NVML gives no timestamp
        self.states: dict[int, PcieState] = {}
        self._handles: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self, handles: dict[int, Any]) -> None:
        self._handles = dict(handles)
        for index, handle in handles.items():
            state = self.states[index] = PcieState()
            reading = self._counters(handle)
            if isinstance(reading, _Counters):
                state.source, state.last = "counters", reading
            elif not (isinstance(reading, Missing) and reading.reason == "gpu_lost"):
                state.source = "throughput"
        if any(s.source == "throughput" for s in self.states.values()):
            self._thread = threading.Thread(target=self._poll, name="gpudoctor-pcie", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)  # at most one 20 ms call per direction is in flight
            self._thread = None

    def read(self, index: int) -> tuple[int | None, int | None]:
        state = self.states.get(index)
        if state is None or state.source is None:
            return None, None
        if state.source == "throughput":
            return state.rx, state.tx
        reading = self._counters(self._handles[index])
        if not isinstance(reading, _Counters):
            state.lost = isinstance(reading, Missing) and reading.reason == "gpu_lost"
            return None, None
        before, state.last = state.last, reading
        if before is None or reading.at_us <= before.at_us:
            return None, None
        seconds = (reading.at_us - before.at_us) / 1e6
        rx = _delta(reading.rx, before.rx, reading.wraps_at) / seconds
        tx = _delta(reading.tx, before.tx, reading.wraps_at) / seconds
        if rx > MAX_PLAUSIBLE_BYTES_PER_S or tx > MAX_PLAUSIBLE_BYTES_PER_S:
            return None, None  # the counters were reset (a driver reload) between the readings
        return int(rx) // MIB, int(tx) // MIB

    def _counters(self, handle: Any) -> _Counters | Missing:
        values = self.nvml.field_values(handle, [FI_PCIE_COUNT_RX_BYTES, FI_PCIE_COUNT_TX_BYTES])
        if isinstance(values, Missing):
            return values
        rx, tx = values
        for v in values:
            if isinstance(v.value, Missing):
                return v.value
        return _Counters(int(rx.value), int(tx.value), _stamp(rx, self.now_us), rx.wraps_at)

    def _poll(self) -> None:
        """The 20 ms calls of the GPUs without counters, one after another, about once a second."""
        while not self._stop.is_set():
            polled = [(i, s) for i, s in self.states.items() if s.source == "throughput" and not s.lost]
            if not polled:
                return  # every such GPU turned out unsupported or lost: nothing left to ask
            for index, state in polled:
                if self._stop.is_set():
                    return
                self._throughput(index, state)
            self._stop.wait(1.0)

    def _throughput(self, index: int, state: PcieState) -> None:
        handle = self._handles[index]
        answers: list[int | None] = []
        for counter in (NVML_PCIE_UTIL_RX_BYTES, NVML_PCIE_UTIL_TX_BYTES):
            kbps = self.nvml.call("nvmlDeviceGetPcieThroughput", handle, counter)
            if isinstance(kbps, Missing):
                if kbps.reason == "gpu_lost":
                    state.lost = True
                elif kbps.reason in ("unsupported", "no_permission"):
                    state.source = None  # vGPU (nvml.h 5576) and the like: not there
                answers.append(None)
            else:
                answers.append(int(kbps) // 1024)  # KB/s -> MiB/s
        state.rx, state.tx = answers


def _stamp(value: FieldValue, now_us: Callable[[], int]) -> int:
    return value.timestamp_us or now_us()


def handles_of(devices: Sequence[Any]) -> dict[int, Any]:
    """index -> handle of the devices a sampler can ask (a handle, not lost)."""
    return {d.index: d.handle for d in devices if d.handle is not None and not d.lost}
