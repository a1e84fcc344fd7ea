"""What the ranks say about their data, loss and loader (gpudoctor/training_data.py), as `watch` keeps it.

One strict reader for both places it comes from: a datagram of a rank of the followed job (the kernel
vouches for the sender, not for what it says) and a recorded sample. Every field has a type and bounds;
lists are capped at the sizes the ranks send (training_data.KEEP, PREFIX); names come from allow-lists
or a small alphabet; free text (CUDA_VISIBLE_DEVICES) is cut and made printable. Anything else makes
the whole datagram or line damaged (ValueError): never a traceback, never a partial reading.

`DataInbox` adds the datagrams up per rank between two samples; `take()` hands the interval's
DataReadings to the sample (`Sample.data`), which is recorded and replayed like every other reading.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from gpudoctor.safety.safe_text import printable
from gpudoctor.training_data import DATA_MAGIC, KEEP, PREFIX
from gpudoctor.watch.bounds import MAX_RANKS, MAX_STEP_S

MAX_INT = 2**63 - 1
MAX_COUNT = 2**53  # counts stay exact in a JSON number
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")
ROLE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
HEX = frozenset("0123456789abcdef")
ORDERS = ("PCI_BUS_ID", "FASTEST_FIRST")
BAD_KINDS = ("nan", "inf", "-inf")
MAX_PAYLOAD = 64 * 1024  # a rank's datagram is at most ~25 KB (an epoch digest of KEEP indices)


def _int(value: Any, what: str, low: int = 0, high: int = MAX_INT) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} is not an integer in [{low}, {high}]: {str(value)[:40]}")
    return value


def _float(value: Any, what: str, low: float = -math.inf, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} is not a finite number: {str(value)[:40]}")
    if not low <= value <= high:
        raise ValueError(f"{what} is not a number in [{low:g}, {high:g}]: {str(value)[:40]}")
    return float(value)


def _word(value: Any, what: str, chars: frozenset[str], limit: int) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= limit or not set(value) <= chars:
        raise ValueError(f"{what} is not a name: {str(value)[:40]!r}")
    return value


def _ints(value: Any, what: str, limit: int) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > limit:
        raise ValueError(f"{what} is not a list of at most {limit} indices")
    return tuple(_int(v, what) for v in value)


def _opt(data: dict[str, Any], name: str, read: Any, *args: Any) -> Any:
    value = data.get(name)
    return None if value is None else read(value, name, *args)


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} is not true or false")
    return value


def _object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not an object")
    return data


def _compact(obj: Any) -> dict[str, Any]:
    """`obj`'s fields as JSON, leaving out those at their default (what `parse` reads for a missing one): a
    False whose default is True or None is written (review 7: a shuffled epoch read back as ascending)."""
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is None or value == () or (f.default is not MISSING and value == f.default):
            continue
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


@dataclass(frozen=True)
class Hello:
    """Where a rank runs (sent once): what names its own GPU, and the CPUs it may use."""

    local_rank: int | None = None
    local_world: int | None = None
    world: int | None = None
    visible: str | None = None  # CUDA_VISIBLE_DEVICES as the rank saw it
    order: str | None = None  # CUDA_DEVICE_ORDER
    cpus: int | None = None

    @classmethod
    def parse(cls, data: Any) -> Hello:
        d = _object(data, "hello")
        order = d.get("order")
        if order is not None and order not in ORDERS:
            raise ValueError(f"hello order is not a CUDA_DEVICE_ORDER: {str(order)[:40]!r}")
        visible = d.get("visible")
        if visible is not None and not isinstance(visible, str):
            raise ValueError("hello visible is not text")
        return cls(
            _opt(d, "local_rank", _int, 0, 2**20),
            _opt(d, "local_world", _int, 0, 2**20),
            _opt(d, "world", _int, 0, 2**24),
            None if visible is None else printable(visible[:256]),
            order,
            _opt(d, "cpus", _int, 0, 2**20),
        )


@dataclass(frozen=True)
class LossStats:
    """The losses a rank gave in an interval: finite ones summed, non-finite ones counted."""

    n: int = 0  # finite losses
    bad: int = 0  # NaN or inf
    last: int = 0  # the number of the last loss (losses are numbered from 1 per rank)
    sum: float | None = None
    sq: float | None = None
    min: float | None = None
    max: float | None = None
    last_value: float | None = None
    first_bad: int | None = None  # the number of the first non-finite loss in the interval
    bad_kind: str | None = None

    @classmethod
    def parse(cls, data: Any) -> LossStats:
        d = _object(data, "loss")
        kind = d.get("bad_kind")
        if kind is not None and kind not in BAD_KINDS:
            raise ValueError(f"loss bad_kind is not nan or inf: {str(kind)[:20]!r}")
        first = _opt(d, "first_bad", _int, 1, MAX_COUNT)
        if (first is None) != (kind is None):
            raise ValueError("loss first_bad and bad_kind go together")
        return cls(
            _int(d.get("n", 0), "loss n", 0, MAX_COUNT),
            _int(d.get("bad", 0), "loss bad", 0, MAX_COUNT),
            _int(d.get("last", 0), "loss last", 0, MAX_COUNT),
            _opt(d, "sum", _float),
            _opt(d, "sq", _float, 0.0),
            _opt(d, "min", _float),
            _opt(d, "max", _float),
            _opt(d, "last_value", _float),
            first,
            kind,
        )

    def merge(self, other: LossStats) -> LossStats:
        """This interval's losses and a later datagram's."""

        def add(a: float | None, b: float | None) -> float | None:
            return b if a is None else a if b is None else a + b

        def pick(a: float | None, b: float | None, fn: Any) -> float | None:
            return b if a is None else a if b is None else fn(a, b)

        first, kind = (
            (self.first_bad, self.bad_kind) if self.first_bad is not None else (other.first_bad, other.bad_kind)
        )
        return LossStats(
            self.n + other.n,
            self.bad + other.bad,
            max(self.last, other.last),
            add(self.sum, other.sum),
            add(self.sq, other.sq),
            pick(self.min, other.min, min),
            pick(self.max, other.max, max),
            other.last_value if other.last >= self.last else self.last_value,  # None: the last one was not finite
            first,
            kind,
        )


@dataclass(frozen=True)
class LoaderTime:
    """Time a rank spent inside next(loader) in an interval, over how many batches; its loaders' workers."""

    s: float = 0.0
    batches: int = 0
    workers: int = 0

    @classmethod
    def parse(cls, data: Any) -> LoaderTime:
        d = _object(data, "loader")
        return cls(
            _float(d.get("s", 0.0), "loader s", 0.0, MAX_STEP_S),  # within one interval: never a day
            _int(d.get("batches", 0), "loader batches", 0, MAX_COUNT),
            _int(d.get("workers", 0), "loader workers", 0, 4096),
        )

    def merge(self, other: LoaderTime) -> LoaderTime:
        return LoaderTime(self.s + other.s, self.batches + other.batches, other.workers or self.workers)


@dataclass(frozen=True)
class EpochDigest:
    """One pass of one loader role on one rank (training_data.Epoch): counts, ordered prefix, sample."""

    role: str
    epoch: int
    n: int = 0
    batches: int = 0
    prefix: tuple[int, ...] = ()
    ascending: bool = True
    final: bool = False
    kept: tuple[int, ...] = ()  # the coordinated sample, sorted
    shift: int = 0
    unreadable: bool = False
    sampler: str | None = None  # the DataLoader's sampler class
    sampler_epoch: int | None = None  # its `epoch` attribute (DistributedSampler.set_epoch sets it)
    replicas: int | None = None
    sampler_rank: int | None = None
    shuffle: bool | None = None
    drop_last: bool | None = None
    len: int | None = None  # len(loader.dataset)
    workers: int | None = None
    expected: int | None = None  # len(loader): the batches the epoch will give

    @classmethod
    def parse(cls, data: Any) -> EpochDigest:
        d = _object(data, "epoch")
        kept = _ints(d.get("kept", []), "epoch kept", KEEP)
        return cls(
            _word(d.get("role"), "epoch role", ROLE_CHARS, 16),
            _int(d.get("epoch"), "epoch number", 0, 10**7),
            _int(d.get("n", 0), "epoch n", 0, MAX_COUNT),
            _int(d.get("batches", 0), "epoch batches", 0, MAX_COUNT),
            _ints(d.get("prefix", []), "epoch prefix", PREFIX),
            _bool(d.get("ascending", True), "epoch ascending"),
            _bool(d.get("final", False), "epoch final"),
            tuple(sorted(set(kept))),
            _int(d.get("shift", 0), "epoch shift", 0, 64),
            _bool(d.get("unreadable", False), "epoch unreadable"),
            _opt(d, "sampler", _word, NAME_CHARS, 64),
            _opt(d, "sampler_epoch", _int, 0, 2**31),
            _opt(d, "replicas", _int, 0, 2**31),
            _opt(d, "sampler_rank", _int, 0, 2**31),
            _opt(d, "shuffle", _bool),
            _opt(d, "drop_last", _bool),
            _opt(d, "len", _int, 0, MAX_COUNT),
            _opt(d, "workers", _int, 0, 4096),
            _opt(d, "expected", _int, 0, MAX_COUNT),
        )


@dataclass(frozen=True)
class SplitDigest:
    """A role's Subset (random_split's result) on one rank: its length, its base's, a hash, a sample."""

    role: str
    n: int
    base: int
    hash: str
    kept: tuple[int, ...] = ()
    shift: int = 0

    @classmethod
    def parse(cls, data: Any) -> SplitDigest:
        d = _object(data, "split")
        return cls(
            _word(d.get("role"), "split role", ROLE_CHARS, 16),
            _int(d.get("n"), "split n", 0, MAX_COUNT),
            _int(d.get("base"), "split base", 0, MAX_COUNT),
            _word(d.get("hash"), "split hash", HEX, 16),
            tuple(sorted(set(_ints(d.get("kept", []), "split kept", KEEP)))),
            _int(d.get("shift", 0), "split shift", 0, 64),
        )


@dataclass(frozen=True)
class DataReading:
    """One rank's data in one interval (only what arrived in it)."""

    pid: int
    rank: int | None = None
    hello: Hello | None = None
    loss: LossStats | None = None
    loader: LoaderTime | None = None
    epochs: tuple[EpochDigest, ...] = ()
    splits: tuple[SplitDigest, ...] = ()

    @property
    def key(self) -> tuple[int | None, int]:
        return (self.rank, self.pid)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid}
        if self.rank is not None:
            out["rank"] = self.rank
        for name in ("hello", "loss", "loader"):
            part = getattr(self, name)
            if part is not None:
                out[name] = _compact(part)
        if self.epochs:
            out["epochs"] = [_compact(e) for e in self.epochs]
        if self.splits:
            out["splits"] = [_compact(s) for s in self.splits]
        return out

    @classmethod
    def parse(cls, data: Any) -> DataReading:
        d = _object(data, "a data reading")
        pid = _int(d.get("pid"), "data pid", 1, 2**32 - 1)
        epochs, splits = d.get("epochs", []), d.get("splits", [])
        if not isinstance(epochs, list) or not isinstance(splits, list) or len(epochs) > 64 or len(splits) > 16:
            raise ValueError(f"PID {pid}: epochs or splits is not a short list")
        return cls(
            pid,
            _opt(d, "rank", _int, 0, 2**24),
            None if d.get("hello") is None else Hello.parse(d["hello"]),
            None if d.get("loss") is None else LossStats.parse(d["loss"]),
            None if d.get("loader") is None else LoaderTime.parse(d["loader"]),
            tuple(EpochDigest.parse(e) for e in epochs),
            tuple(SplitDigest.parse(s) for s in splits),
        )


def parse_datagram(pid: int, payload: bytes) -> DataReading:
    """A rank's datagram (after DATA_MAGIC): rank plus one part. ValueError when damaged."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError("data datagram too large")
    try:
        doc = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"data datagram is not JSON: {type(exc).__name__}") from None
    d = _object(doc, "data datagram")
    rank = _int(d.get("rank", -1), "data rank", -1, 2**24)
    reading = DataReading(pid, None if rank < 0 else rank)
    if d.get("epoch") is not None:
        reading = replace(reading, epochs=(EpochDigest.parse(d["epoch"]),))
    if d.get("split") is not None:
        reading = replace(reading, splits=(SplitDigest.parse(d["split"]),))
    parts = {name: d.get(name) for name in ("hello", "loss", "loader")}
    return replace(
        reading,
        hello=None if parts["hello"] is None else Hello.parse(parts["hello"]),
        loss=None if parts["loss"] is None else LossStats.parse(parts["loss"]),
        loader=None if parts["loader"] is None else LoaderTime.parse(parts["loader"]),
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


@dataclass
class _Acc:
    pid: int
    rank: int | None
    hello: Hello | None = None
    loss: LossStats | None = None
    loader: LoaderTime | None = None
    epochs: dict[tuple[str, int], EpochDigest] = field(default_factory=dict)
    splits: dict[str, SplitDigest] = field(default_factory=dict)

    def add(self, r: DataReading) -> None:
        self.hello = r.hello or self.hello
        if r.loss is not None:
            self.loss = r.loss if self.loss is None else self.loss.merge(r.loss)
        if r.loader is not None:
            self.loader = r.loader if self.loader is None else self.loader.merge(r.loader)
        for e in r.epochs:
            self.epochs[(e.role, e.epoch)] = e  # a later digest of an epoch supersedes the earlier one
        for s in r.splits:
            self.splits[s.role] = s

    def reading(self) -> DataReading:
        epochs = tuple(self.epochs[k] for k in sorted(self.epochs))
        splits = tuple(self.splits[k] for k in sorted(self.splits))
        return DataReading(self.pid, self.rank, self.hello, self.loss, self.loader, epochs, splits)


class DataInbox:
    """The interval's data per rank, filled by the step channel's thread, taken with each sample."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accs: dict[tuple[int | None, int], _Acc] = {}
        # A process has one rank (training_step reads it once): held while it lives (forget() at its exit),
        # at most MAX_RANKS processes, the least recently heard forgotten first (one killed without a word).
        self._rank_of: OrderedDict[int, int | None] = OrderedDict()
        self.crowded = 0  # datagrams not taken: MAX_RANKS processes had sent data in the interval already

    def add(self, pid: int, payload: bytes) -> None:
        """A datagram from the job's process `pid` (raises ValueError when damaged, or when the process
        claims another rank than before: one process cannot fill the watcher with made-up ranks)."""
        reading = parse_datagram(pid, payload)
        with self._lock:
            rank = self._rank_of.get(pid, reading.rank)
            if rank != reading.rank:
                raise ValueError(f"PID {pid} changed its rank")
            acc = self._accs.get(reading.key)
            if acc is None:
                if len(self._accs) >= MAX_RANKS:
                    self.crowded += 1
                    return
                acc = self._accs[reading.key] = _Acc(pid, reading.rank)
            self._rank_of[pid] = rank
            self._rank_of.move_to_end(pid)
            if len(self._rank_of) > MAX_RANKS:
                self._rank_of.popitem(last=False)
            acc.add(reading)

    def forget(self, pid: int) -> None:
        """Process `pid` exited: its number may be another process's next."""
        with self._lock:
            self._rank_of.pop(pid, None)

    def held(self) -> int:
        """Processes held now (their rank), at most MAX_RANKS."""
        with self._lock:
            return len(self._rank_of)

    def take(self) -> tuple[DataReading, ...]:
        with self._lock:
            accs, self._accs = self._accs, {}
        return tuple(acc.reading() for _, acc in sorted(accs.items(), key=lambda kv: _order(kv[0])))


def _order(key: tuple[int | None, int]) -> tuple[bool, int, int]:
    return (key[0] is None, key[0] or 0, key[1])


def is_data(datagram: bytes) -> bool:
    return datagram[: len(DATA_MAGIC)] == DATA_MAGIC
