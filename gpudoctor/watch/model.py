"""What `watch` samples: one `Sample` per interval, with a `GpuReading` per GPU.

A metric that could not be read is None (shown as n/a). Values are rounded when they are
sampled, so a recording written as JSON reads back equal to what was recorded.

Reading a sample back (`Sample.parse`) is strict about shape: a field of the wrong type, a
non-finite number or a time that is not a time makes the whole line damaged (ValueError). A
well-formed reading outside its physical range (utilization -5000%, negative memory or power)
is not a reading: it is dropped (n/a) and said, so it can never skew a mean or a balance score.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cache
from typing import Any, TypeVar

from gpudoctor.safety.safe_text import needs_cleaning, printable
from gpudoctor.watch.arrival import JobProc
from gpudoctor.watch.bounds import (
    CPU_RANGE,
    HOST_INTEGERS,
    HOST_RANGES,
    LAST_TIME,
    LOST,
    MAX_ID,
    OK,
    PROC_INTEGERS,
    PROC_RANGES,
    RANGES,
    RANK_INTEGERS,
    RANK_RANGES,
    STATES,
    in_range,
    in_ranges,
    parse_numbers,
    physical,
    plain_gpu,
    plain_host,
    plain_proc,
    plain_rank,
)
from gpudoctor.watch.bounds import (
    STALE as STALE,
)
from gpudoctor.watch.bounds import check_index as _index
from gpudoctor.watch.bounds import check_number as _number
from gpudoctor.watch.bounds import check_text as _text
from gpudoctor.watch.bounds import short as _short
from gpudoctor.watch.bounds import whole as _whole
from gpudoctor.watch.data_model import DataReading


def plural(count: int, word: str, many: str | None = None) -> str:
    """'1 sample', '2 samples', '0 samples' (`many` for irregular plurals)."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


def clock(seconds: float) -> str:
    """A duration as m:ss, or h:mm:ss past an hour."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


_R = TypeVar("_R")


@cache
def field_names(cls: type) -> tuple[str, ...]:
    """A reading type's field names, in order, made once per type (parsing a day's recording asks
    for them per reading: dataclasses.fields() was a tenth of `report`'s time)."""
    return tuple(f.name for f in fields(cls))


@cache
def recorded_names(cls: type) -> tuple[str, ...]:
    """Its field names that recordings and reports carry: not those for the terminal only (the user's
    own command line, shown whole on their screen and never written)."""
    return tuple(f.name for f in fields(cls) if not f.metadata.get("terminal_only"))


@cache
def _known(cls: type) -> frozenset[str]:
    """The names a recorded reading of `cls` may set (bounds' plain checks keep only these)."""
    return frozenset(recorded_names(cls))


@cache
def _defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in fields(cls):
        assert f.default_factory is MISSING, f"{cls.__name__}.{f.name}: _build cannot share a factory's value"
        if f.default is not MISSING:
            out[f.name] = f.default
    return out


def _build(cls: type[_R], kwargs: dict[str, Any]) -> _R:
    """`cls(**kwargs)` for a reading its plain check took (every required field there): the same
    object, its defaults then `kwargs` set at once, and its __post_init__, without the frozen
    __init__'s call per field (two thirds of a reading's cost when a day's recording is read)."""
    obj = object.__new__(cls)
    obj.__dict__.update(_defaults(cls))
    obj.__dict__.update(kwargs)
    post = getattr(obj, "__post_init__", None)
    if post is not None:
        post()
    return obj


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
    throttle: int | None = None  # NVML clock event reasons bitmask (bits: gpudoctor.knowledge.clock_reasons)
    xids: tuple[int, ...] = ()  # XID events since the previous sample

    def __post_init__(self) -> None:
        _clean_texts(self, ("name", "uuid"))

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
        """A recorded reading: taken as it is when plainly sound (gpudoctor.watch.bounds), else the
        strict way, which says what is wrong (ValueError) or drops what is out of range."""
        plain = plain_gpu(data, _known(cls))
        return cls.parse_strict(data, dropped) if plain is None else _build(cls, plain)

    @classmethod
    def parse_strict(cls, data: Any, dropped: list[str]) -> GpuReading:
        """A recorded reading: wrong shapes raise ValueError, out-of-range values go to `dropped`."""
        if not isinstance(data, dict):
            raise ValueError(f"a GPU reading is not an object: {data!r}")
        kwargs = {k: data[k] for k in field_names(cls) if k in data}
        index = kwargs["index"] = _index(kwargs.get("index"), "GPU index")
        for name in ("name", "uuid"):
            if name in kwargs:
                _text(kwargs[name], name)
        if kwargs.get("state", OK) not in STATES:
            raise ValueError(f"GPU {index}: unknown state {kwargs['state']!r}")
        parse_numbers(kwargs, RANGES, f"GPU {index} ")
        if "xids" in kwargs:
            xids = kwargs["xids"]
            if not isinstance(xids, list):
                raise ValueError(f"GPU {index}: xids is not a list of integers: {_short(xids)}")
            kwargs["xids"] = tuple(_index(x, f"GPU {index} XID") for x in xids)
        return cls(**physical(kwargs, dropped, f"GPU {index} "))

    def checked(self, dropped: list[str] | None = None) -> GpuReading:
        """This reading with out-of-range values dropped (a live reading gone wrong is n/a too)."""
        kwargs = {name: getattr(self, name) for name in field_names(type(self))}
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
    gpu: int | None  # None: a process of the followed job that uses no GPU (a CPU rank, `watch -- CMD` without one)
    gpu_mem: int | None = None  # MiB
    user: str = ""
    cpu: float | None = None  # % of one core
    rss: int | None = None  # MiB
    command: str = ""
    note: str = ""  # why the rest is unknown, e.g. a PID from outside this container
    sm: int | None = None  # % of the GPU's SM time this process used (nvmlDeviceGetProcessUtilization)
    started: float | None = None  # its start time (epoch s): a signal goes to this process, not a reused PID
    # The user's own process's command line whole, for the dashboard only: never written to a file
    # (to_json leaves it out, a recording cannot set it); `command`, as the allow-list shows it, is.
    own_command: str = field(default="", metadata={"terminal_only": True}, compare=False)

    def __post_init__(self) -> None:
        _clean_texts(self, ("user", "command", "note", "own_command"))

    def to_json(self) -> dict[str, Any]:
        return _compact(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcReading:
        return cls.parse(data, [])

    @classmethod
    def parse(cls, data: Any, dropped: list[str]) -> ProcReading:
        """A recorded reading: taken as it is when plainly sound (gpudoctor.watch.bounds), else the
        strict way, which says what is wrong (ValueError) or drops what is out of range."""
        plain = plain_proc(data, _known(cls))
        return cls.parse_strict(data, dropped) if plain is None else _build(cls, plain)

    @classmethod
    def parse_strict(cls, data: Any, dropped: list[str]) -> ProcReading:
        if not isinstance(data, dict):
            raise ValueError(f"a process reading is not an object: {data!r}")
        kwargs = {k: data[k] for k in recorded_names(cls) if k in data}
        pid = kwargs["pid"] = _whole(kwargs.get("pid"))
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < MAX_ID:
            raise ValueError(f"a process PID is not a PID: {_short(pid)}")
        gpu = kwargs.get("gpu")
        kwargs["gpu"] = None if gpu is None else _index(gpu, f"PID {pid} GPU")
        for name in ("user", "command", "note"):
            if name in kwargs:
                _text(kwargs[name], f"PID {pid} {name}")
        parse_numbers(kwargs, PROC_RANGES, f"PID {pid} ")
        return cls(**in_ranges(kwargs, PROC_RANGES, PROC_INTEGERS, dropped, f"PID {pid} "))


def _clean_texts(reading: Any, names: tuple[str, ...]) -> None:
    """Another user's command line or a recorded GPU name, made one printable line (no escape
    sequence reaches the terminal, no newline starts a line of its own), whatever the source."""
    for name in names:
        value = getattr(reading, name)
        if isinstance(value, str) and needs_cleaning(value):
            object.__setattr__(reading, name, printable(value))


def _compact(obj: Any) -> dict[str, Any]:
    """A reading's fields without the absent ones (keeps recordings small: absent means n/a), and
    without those for the terminal only."""
    values = ((name, getattr(obj, name)) for name in recorded_names(type(obj)))
    return {name: value for name, value in values if value not in (None, "")}


def _object(data: Any, what: str, cls: type) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not an object: {_short(data)}")
    return {k: data[k] for k in field_names(cls) if k in data}


@dataclass(frozen=True)
class HostReading:
    """What starves GPUs or kills ranks starts on the host: load, memory, swap (MiB)."""

    load1: float | None = None  # 1-minute load average
    ram_used: int | None = None  # total - available: what the kernel could not hand out without swapping
    ram_total: int | None = None
    swap_used: int | None = None
    swap_total: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _compact(self)

    @classmethod
    def parse(cls, data: Any, dropped: list[str]) -> HostReading:
        """A recorded reading: taken as it is when plainly sound (gpudoctor.watch.bounds), else the
        strict way, which says what is wrong (ValueError) or drops what is out of range."""
        plain = plain_host(data, _known(cls))
        return cls.parse_strict(data, dropped) if plain is None else _build(cls, plain)

    @classmethod
    def parse_strict(cls, data: Any, dropped: list[str]) -> HostReading:
        kwargs = _object(data, "host", cls)
        parse_numbers(kwargs, HOST_RANGES, "host ")
        return cls(**in_ranges(kwargs, HOST_RANGES, HOST_INTEGERS, dropped, "host "))


def _mean2(a: float | None, n: int, b: float | None, m: int) -> float | None:
    """The mean of two means of n and m values (either unknown: the other)."""
    if a is None or b is None:
        return b if a is None else a
    return (a * n + b * m) / (n + m)


@dataclass(frozen=True)
class RankReading:
    """One training process's steps in one interval, as `gpudoctor.step()` reported them."""

    pid: int
    rank: int | None = None  # global rank (RANK, or torch.distributed's); None: not known
    steps: int = 0  # steps finished in this interval
    step_s: float | None = None  # their mean duration (s)
    step_max: float | None = None  # the longest of them (s)
    wait_s: float | None = None  # mean input wait of the steps that measured one (s); None: not measured
    waited: int | None = None  # how many steps measured an input wait (None, older recordings: all of them)
    wait_step_s: float | None = None  # their mean step time (s) (None, older recordings: step_s)
    last_step: int | None = None  # the number of the last step finished (counted from 1 per process)
    last_end: float | None = None  # when it finished (epoch s); carried over while no step finishes

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"PID {self.pid}"

    def wait_totals(self) -> tuple[int, float, float]:
        """(steps that measured an input wait, their input wait, their step time), in seconds: the
        input-wait share is the second over the third, never over the time of steps that measured none."""
        if self.wait_s is None or not self.steps:
            return 0, 0.0, 0.0
        n = self.steps if self.waited is None else min(self.waited, self.steps)
        step_s = self.step_s if self.wait_step_s is None else self.wait_step_s
        return n, self.wait_s * n, (step_s or 0.0) * n

    @property
    def key(self) -> tuple[int, int]:
        return (self.rank if self.rank is not None else -1, self.pid)

    def then(self, later: RankReading) -> RankReading:
        """This interval's reading and the `later` one of the same process, as one reading of both."""
        n, m = self.steps, later.steps
        if not m:
            return replace(
                later,
                steps=n,
                step_s=self.step_s,
                step_max=self.step_max,
                wait_s=self.wait_s,
                waited=self.waited,
                wait_step_s=self.wait_step_s,
                last_step=later.last_step if later.last_step is not None else self.last_step,
                last_end=later.last_end if later.last_end is not None else self.last_end,
            )
        if not n:
            return later
        w1, w2 = self.wait_totals(), later.wait_totals()
        waited = w1[0] + w2[0]
        return replace(
            later,
            steps=n + m,
            step_s=_mean2(self.step_s, n, later.step_s, m),
            step_max=max((x for x in (self.step_max, later.step_max) if x is not None), default=None),
            wait_s=(w1[1] + w2[1]) / waited if waited else None,
            waited=waited if waited else None,
            wait_step_s=(w1[2] + w2[2]) / waited if waited else None,
        )

    def to_json(self) -> dict[str, Any]:
        return _compact(self)

    @classmethod
    def parse(cls, data: Any, dropped: list[str]) -> RankReading:
        """A recorded reading: taken as it is when plainly sound (gpudoctor.watch.bounds), else the
        strict way, which says what is wrong (ValueError) or drops what is out of range."""
        plain = plain_rank(data, _known(cls))
        return cls.parse_strict(data, dropped) if plain is None else _build(cls, plain)

    @classmethod
    def parse_strict(cls, data: Any, dropped: list[str]) -> RankReading:
        kwargs = _object(data, "a rank reading", cls)
        pid = kwargs["pid"] = _whole(kwargs.get("pid"))
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < MAX_ID:
            raise ValueError(f"a rank's PID is not a PID: {_short(pid)}")
        if kwargs.get("rank") is not None:
            kwargs["rank"] = _index(kwargs["rank"], f"PID {pid} rank")
        parse_numbers(kwargs, RANK_RANGES, f"PID {pid} ")
        kwargs = in_ranges(kwargs, RANK_RANGES, RANK_INTEGERS, dropped, f"PID {pid} ")
        if kwargs.get("steps") is None:
            kwargs["steps"] = 0
        return cls(**kwargs)


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the epoch
    gpus: tuple[GpuReading, ...]
    cpu: float | None = None  # host CPU busy, % of all cores
    procs: tuple[ProcReading, ...] | None = None  # None: processes not read this time
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    host: HostReading | None = None  # load, RAM, swap; None: not read
    ranks: tuple[RankReading, ...] | None = None  # training steps (gpudoctor.step()); None: no step channel
    job: tuple[JobProc, ...] | None = None  # the followed job's processes (watch/arrival.py); None: no job

    data: tuple[DataReading, ...] | None = None  # the ranks' samples, loss, loader time (watch/data_model.py)
    # The recording's last line: what the job sent as it ended, after the last sample (its ranks and data
    # only, no readings): a report counts it as `watch` did live, not as a sample (recording.RecordingStream).
    end: bool = False

    def gpu(self, index: int) -> GpuReading | None:
        """The reading of GPU `index` (O(1): an index map made on first use)."""
        by_index = self.__dict__.get("_by_index")
        if by_index is None:
            by_index = self.__dict__["_by_index"] = {g.index: g for g in reversed(self.gpus)}  # the first; not a field
        return by_index.get(index)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.t, "gpus": [g.to_json() for g in self.gpus]}
        if self.cpu is not None:
            out["cpu"] = self.cpu
        if self.procs is not None:
            out["procs"] = [p.to_json() for p in self.procs]
        if self.host is not None:
            out["host"] = self.host.to_json()
        if self.ranks is not None:
            out["ranks"] = [r.to_json() for r in self.ranks]
        if self.job is not None:
            out["job"] = [p.to_json() for p in self.job]

        if self.data:
            out["data"] = [d.to_json() for d in self.data]
        if self.end:
            out["end"] = True
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
        if t is None or t < 0 or t > LAST_TIME:
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
        procs = _list(data, "procs")
        ranks = _list(data, "ranks")
        job = _list(data, "job")

        job_data = _list(data, "data")
        host = data.get("host")
        return cls(
            t=float(t),
            gpus=gpus,
            cpu=cpu,
            procs=None if procs is None else tuple(ProcReading.parse(p, dropped) for p in procs),
            host=None if host is None else HostReading.parse(host, dropped),
            ranks=None if ranks is None else tuple(RankReading.parse(r, dropped) for r in ranks),
            job=None if job is None else tuple(JobProc.parse(p, dropped) for p in job),
            data=None if job_data is None else tuple(DataReading.parse(d) for d in job_data),
            end=data.get("end") is True,
        )

    def only(self, indices: set[int] | frozenset[int]) -> Sample:
        """This sample restricted to some GPUs (and their processes)."""
        procs = None if self.procs is None else tuple(p for p in self.procs if p.gpu in indices)
        gpus = tuple(g for g in self.gpus if g.index in indices)
        return replace(self, gpus=gpus, procs=procs)


def _list(data: dict[str, Any], name: str) -> list[Any] | None:
    value = data.get(name)
    if value is not None and not isinstance(value, list):
        raise ValueError(f"{name} is not a list")
    return value
