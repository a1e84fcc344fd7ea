"""What `watch` samples: one `Sample` per interval, with a `GpuReading` per GPU.

A metric that could not be read is None (shown as n/a). Values are rounded when they are
sampled, so a recording written as JSON reads back equal to what was recorded.

Reading a sample back (`Sample.parse`) is strict about shape: a field of the wrong type, a
non-finite number or a time that is not a time makes the whole line damaged (ValueError). A
well-formed reading outside its physical range (utilization -5000%, negative memory or power)
is not a reading: it is dropped (n/a) and said, so it can never skew a mean or a balance score.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, fields
from typing import Any


def plural(count: int, word: str, many: str | None = None) -> str:
    """'1 sample', '2 samples', '0 samples' (`many` for irregular plurals)."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


def clock(seconds: float) -> str:
    """A duration as m:ss, or h:mm:ss past an hour."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


OK = "ok"
STALE = "stale"  # no fresh reading arrived in time (NVML stalled)
LOST = "lost"  # NVML says GPU_IS_LOST; not asked again
STATES = (OK, STALE, LOST)

# What a reading can physically be (inclusive bounds; None: unbounded). Outside: dropped as n/a.
RANGES: dict[str, tuple[float | None, float | None]] = {
    "util": (0, 100),
    "mem_util": (0, 100),
    "mem_used": (0, None),
    "mem_total": (0, None),
    "power": (0, None),
    "power_limit": (0, None),
    "temp": (-50, 200),
    "sm_clock": (0, None),
    "pcie_rx": (0, None),
    "pcie_tx": (0, None),
    "throttle": (0, None),
}
PROC_RANGES: dict[str, tuple[float | None, float | None]] = {"gpu_mem": (0, None), "cpu": (0, None), "rss": (0, None)}
PROC_INTEGERS = {"gpu_mem", "rss"}
CPU_RANGE = (0, 100)  # host CPU busy, % of all cores
# Whole-number readings: a recorded 4.0 reads as 4; a fraction (util 96.5, a bitmask 4.5) is not a reading.
INTEGERS = {"util", "mem_util", "mem_used", "mem_total", "temp", "sm_clock", "pcie_rx", "pcie_tx", "throttle"}


def _number(value: Any, what: str) -> float | int | None:
    """None, or a finite int/float (never a bool); anything else is a damaged value (ValueError)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is not a number: {value!r}")
    if isinstance(value, int) and abs(value) > sys.float_info.max:
        raise ValueError(f"{what} is too large for a number: {str(value)[:12]}... ({len(str(value))} digits)")
    if not math.isfinite(value):
        raise ValueError(f"{what} is not finite: {value!r}")
    return value


def _whole(value: Any) -> Any:
    """4.0 -> 4 (a JSON writer may write a whole number as a float); anything else unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


MAX_ID = 2**32  # GPU indices and PIDs are 32-bit numbers


def _index(value: Any, what: str) -> int:
    value = _whole(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_ID:
        raise ValueError(f"{what} is not an index: {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not text: {value!r}")
    return value


def in_range(value: float | int | None, bounds: tuple[float | None, float | None]) -> bool:
    low, high = bounds
    return value is None or ((low is None or value >= low) and (high is None or value <= high))


def physical(kwargs: dict[str, Any], dropped: list[str], where: str = "") -> dict[str, Any]:
    """`kwargs` (GpuReading fields) with out-of-range readings set to None, each said in `dropped`."""
    for name, bounds in RANGES.items():
        value = kwargs.get(name)
        if name in INTEGERS:
            value = kwargs[name] = _whole(value) if name in kwargs else None
        bad = value is not None and (not in_range(value, bounds) or (name in INTEGERS and not isinstance(value, int)))
        if bad:
            dropped.append(f"{where}{name} {value!r}")
            kwargs[name] = None
    used, total = kwargs.get("mem_used"), kwargs.get("mem_total")
    if used is not None and total and used > total:
        dropped.append(f"{where}mem_used {used!r} > mem_total {total!r}")
        kwargs["mem_used"] = None
    return kwargs


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
        return cls.parse(data, [])

    @classmethod
    def parse(cls, data: Any, dropped: list[str]) -> GpuReading:
        """A recorded reading: wrong shapes raise ValueError, out-of-range values go to `dropped`."""
        if not isinstance(data, dict):
            raise ValueError(f"a GPU reading is not an object: {data!r}")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        index = kwargs["index"] = _index(kwargs.get("index"), "GPU index")
        for name in ("name", "uuid"):
            if name in kwargs:
                _text(kwargs[name], name)
        if kwargs.get("state", OK) not in STATES:
            raise ValueError(f"GPU {index}: unknown state {kwargs['state']!r}")
        for name in RANGES:
            _number(kwargs.get(name), f"GPU {index} {name}")
        if "xids" in kwargs:
            xids = kwargs["xids"]
            if not isinstance(xids, list):
                raise ValueError(f"GPU {index}: xids is not a list of integers: {_short(xids)}")
            kwargs["xids"] = tuple(_index(x, f"GPU {index} XID") for x in xids)
        return cls(**physical(kwargs, dropped, f"GPU {index} "))

    def checked(self, dropped: list[str] | None = None) -> GpuReading:
        """This reading with out-of-range values dropped (a live reading gone wrong is n/a too)."""
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        found: list[str] = []
        physical(kwargs, found, f"GPU {self.index} ")
        if not found:
            return self
        if dropped is not None:
            dropped.extend(found)
        return GpuReading(**kwargs)


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
        return cls.parse(data, [])

    @classmethod
    def parse(cls, data: Any, dropped: list[str]) -> ProcReading:
        if not isinstance(data, dict):
            raise ValueError(f"a process reading is not an object: {data!r}")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        pid = kwargs["pid"] = _whole(kwargs.get("pid"))
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < MAX_ID:
            raise ValueError(f"a process PID is not a PID: {_short(pid)}")
        kwargs["gpu"] = _index(kwargs.get("gpu"), f"PID {pid} GPU")
        for name in ("user", "command", "note"):
            if name in kwargs:
                _text(kwargs[name], f"PID {pid} {name}")
        for name, bounds in PROC_RANGES.items():
            value = _number(kwargs.get(name), f"PID {pid} {name}")
            if name in PROC_INTEGERS:
                value = kwargs[name] = _whole(value)
            fraction = name in PROC_INTEGERS and value is not None and not isinstance(value, int)
            if fraction or not in_range(value, bounds):
                dropped.append(f"PID {pid} {name} {value!r}")
                kwargs[name] = None
        return cls(**kwargs)


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
        return cls.parse(data, [])

    @classmethod
    def parse(cls, data: Any, dropped: list[str]) -> Sample:
        """A recorded sample. A damaged one raises ValueError (the whole line is not used); readings
        outside their physical range are dropped (n/a) and said in `dropped`."""
        if not isinstance(data, dict):
            raise ValueError("a sample is not an object")
        t = _number(data.get("t"), "t")
        if t is None or t < 0:
            raise ValueError(f"t is not a time: {data.get('t')!r}")
        raw_gpus = data.get("gpus")
        if not isinstance(raw_gpus, list):
            raise ValueError("gpus is not a list")
        gpus = tuple(GpuReading.parse(g, dropped) for g in raw_gpus)
        indices = [g.index for g in gpus]
        if len(set(indices)) != len(indices):
            raise ValueError(f"a GPU appears twice: {indices}")
        cpu = _number(data.get("cpu"), "cpu")
        if not in_range(cpu, CPU_RANGE):
            dropped.append(f"cpu {cpu!r}")
            cpu = None
        procs = data.get("procs")
        if procs is not None and not isinstance(procs, list):
            raise ValueError("procs is not a list")
        return cls(
            t=float(t),
            gpus=gpus,
            cpu=cpu,
            procs=None if procs is None else tuple(ProcReading.parse(p, dropped) for p in procs),
        )

    def only(self, indices: set[int] | frozenset[int]) -> Sample:
        """This sample restricted to some GPUs (and their processes)."""
        procs = None if self.procs is None else tuple(p for p in self.procs if p.gpu in indices)
        return Sample(self.t, tuple(g for g in self.gpus if g.index in indices), self.cpu, procs)
