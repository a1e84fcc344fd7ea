"""What `watch` samples: one `Sample` per interval, with a `GpuReading` per GPU.

A metric that could not be read is None (shown as n/a). Values are rounded when they are
sampled, so a recording written as JSON reads back equal to what was recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

OK = "ok"
STALE = "stale"  # no fresh reading arrived in time (NVML stalled)
LOST = "lost"  # NVML says GPU_IS_LOST; not asked again


@dataclass(frozen=True)
class GpuReading:
    index: int  # NVML index
    name: str = ""
    uuid: str = ""
    state: str = OK
    util: int | None = None  # % of time a kernel ran
    mem_util: int | None = None  # % of time memory was read or written
    mem_used: int | None = None  # MiB
    mem_total: int | None = None  # MiB
    power: float | None = None  # W
    power_limit: float | None = None  # W
    temp: int | None = None  # C
    sm_clock: int | None = None  # MHz
    pcie_rx: int | None = None  # MB/s
    pcie_tx: int | None = None  # MB/s
    throttle: int | None = None  # NVML clock event reasons bitmask (bits: gpudoctor.clock_reasons)
    xids: tuple[int, ...] = ()  # XID events since the previous sample

    @property
    def alive(self) -> bool:
        return self.state != LOST

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == () or (f.name == "state" and value == OK):
                continue  # keep recordings small: absent means n/a (or ok)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuReading:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if "xids" in kwargs:
            kwargs["xids"] = tuple(kwargs["xids"])
        return cls(**kwargs)


@dataclass(frozen=True)
class ProcReading:
    pid: int
    gpu: int
    gpu_mem: int | None = None  # MiB
    user: str = ""
    cpu: float | None = None  # % of one core
    rss: int | None = None  # MiB
    command: str = ""
    note: str = ""  # why the rest is unknown, e.g. a PID from outside this container

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) not in (None, "")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcReading:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the epoch
    gpus: tuple[GpuReading, ...]
    cpu: float | None = None  # host CPU busy, % of all cores
    procs: tuple[ProcReading, ...] | None = None  # None: processes not read this time
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def gpu(self, index: int) -> GpuReading | None:
        return next((g for g in self.gpus if g.index == index), None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.t, "gpus": [g.to_json() for g in self.gpus]}
        if self.cpu is not None:
            out["cpu"] = self.cpu
        if self.procs is not None:
            out["procs"] = [p.to_json() for p in self.procs]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sample:
        procs = data.get("procs")
        return cls(
            t=float(data["t"]),
            gpus=tuple(GpuReading.from_json(g) for g in data["gpus"]),
            cpu=data.get("cpu"),
            procs=None if procs is None else tuple(ProcReading.from_json(p) for p in procs),
        )

    def only(self, indices: set[int] | frozenset[int]) -> Sample:
        """This sample restricted to some GPUs (and their processes)."""
        procs = None if self.procs is None else tuple(p for p in self.procs if p.gpu in indices)
        return Sample(self.t, tuple(g for g in self.gpus if g.index in indices), self.cpu, procs)
