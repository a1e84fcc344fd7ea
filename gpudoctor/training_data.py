"""What each rank reads and its loss, for `gpudoctor watch`: `gpudoctor.watch_loader(loader)` and the
`samples=` / `loss=` of `gpudoctor.step()` (gpudoctor/training_step.py sends what this module collects).

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in gpudoctor.watch_loader(loader):      # indices, epochs, time inside next(loader)
            with gpudoctor.step() as step:
                loss = train_step(batch)
                step.loss(loss)                           # NaN/inf and ranks that disagree

When nothing watches, `watch_loader` returns the loader itself and `step()` ignores the data: no cost.

What is kept per rank, per loader role ("train", "eval") and per epoch, and why it is enough:
- the count of samples and batches (exact): uneven shards, DistributedSampler padding;
- the first PREFIX indices in order (exact): the same order every epoch (set_epoch never called),
  two ranks reading the same samples in the same order;
- a coordinated sample of the indices: index i is kept when its Fibonacci hash (i * MULT mod 2**64,
  Knuth) is below 2**(64 - shift); shift starts at 0 (every index kept) and grows by one, dropping
  about half, whenever more than KEEP are kept. Every rank uses the same hash, so an index two ranks
  both read is kept by both whenever it is kept at the smaller of their limits: an overlap found is
  real (never a false positive), and a shared fraction f of n samples is missed with probability
  about (1 - 2**-shift)**(f * n): none for data sets up to KEEP samples per rank and epoch (shift 0,
  exact), e**-(f * KEEP / 2) at worst above (KEEP/2 to KEEP indices are kept).
- for a `torch.utils.data.Subset` (random_split's result): indices are read through it into the
  base data set's, and the split itself is fingerprinted once (hash of its index list, and the same
  coordinated sample): ranks whose splits differ, and evaluation samples inside another rank's
  training split.

Cost: the DataLoader's sampler is wrapped (its BatchSampler's `sampler` attribute, a public one), so
each index costs one call, one multiply and a comparison (benchmarks/step_overhead.py). `step(samples=)`
only counts a step's indices and copies the list (C-level, a few ns an index): hashing an index costs
~100-300 ns in Python, so 64 of them would be most of a step's budget. The copies are digested when the
step records are flushed (every FLUSH_S at most), at most DIGEST_RATE indices a second (0.5-1.5% of a
core); a loop that gives more is counted exactly but digested in part (the earliest of each flush).
Losses: gpudoctor/training_loss.py.

Standard library only: torch's objects are used through their own methods, torch is never imported.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import sys
import time
from itertools import compress, islice
from typing import Any

from gpudoctor.training_loss import Losses

DATA_MAGIC = b"GDD1"
PREFIX = 32  # indices kept in order at the start of each epoch
KEEP = 1024  # indices kept at most per epoch (and per split), see the module docstring
CHUNK = 64  # indices a wrapped sampler draws at a time
# step(samples=): indices digested a second at most (~100-300 ns each: 0.5-1.5% of a core), and held
# between flushes at most (a bounded copy, 512 KiB of pointers); beyond either they are counted, not digested.
# Heuristics: a training loop reads thousands of samples a second per rank, rarely more than DIGEST_RATE.
DIGEST_RATE = 50_000
PENDING_MAX = 65_536
MULT = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, odd: Fibonacci hashing (Knuth, TAOCP 6.4)
M64 = (1 << 64) - 1
PARTIAL_S = 5.0  # an open epoch's digest is sent again at most this often (and when its prefix fills)
MAX_SPLIT = 50_000_000  # a split longer than this is not fingerprinted (O(n) once, at the first epoch)


def _hash(i: int) -> int:
    return (i * MULT) & M64


class CoordinatedSample:
    """The indices whose hash is below 2**(64 - shift), at most KEEP of them (see the module docstring)."""

    __slots__ = ("shift", "limit", "kept")

    def __init__(self) -> None:
        self.shift = 0
        self.limit = 1 << 64
        self.kept: set[int] = set()

    def add(self, i: int) -> None:
        if self.shift == 0 or (i * MULT) & M64 < self.limit:
            self.kept.add(i)
            if len(self.kept) > KEEP:
                self.halve()

    def add_many(self, seq: Any) -> None:
        """A batch of integers, filtered in C-level loops (map, compress): tens of ns an index. A value that
        is not an int passes the filter (int.__mul__ answers NotImplemented) and is caught when sent."""
        if self.shift == 0:
            self.kept.update(seq)
        else:
            self.kept.update(compress(seq, map(self.limit.__gt__, map(M64.__and__, map(MULT.__mul__, seq)))))
        if len(self.kept) > KEEP:
            self.halve()

    def halve(self) -> None:
        while len(self.kept) > KEEP:
            self.shift += 1
            self.limit = 1 << (64 - self.shift)
            self.kept = {i for i in self.kept if (i * MULT) & M64 < self.limit}


def _as_int(value: Any) -> int | None:
    """An index as a Python int (numpy and 0-d tensor integers have __index__), or None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


class Epoch:
    """One pass of one role on this rank: counts, the ordered prefix, the coordinated sample."""

    def __init__(self, role: str, number: int, facts: dict[str, Any], base: list[int] | None) -> None:
        self.role = role
        self.number = number
        self.facts = facts  # sampler, sampler_epoch, replicas, shuffle, drop_last, len, workers
        self.base = base  # index -> base data set index (through Subsets), or None
        self.n = 0
        self.batches = 0
        self.prefix: list[int] = []
        self.ascending = True
        self.sample = CoordinatedSample()
        self.final = False  # a complete pass (the loader ran out)
        self.unreadable = False  # an index that is not an integer: nothing more is recorded
        self.sent_prefix = False
        self.dirty = True
        self.pending: list[Any] = []  # step(samples=) indices counted, not yet digested (Data.digest)

    def take(self, samples: list[Any], beyond: int = 0) -> None:
        """One step's indices (a list, and `beyond` more counted but not given): counted now; the epoch's
        first PREFIX recorded at once, in order (the prefix must be exact), the rest copied, up to
        PENDING_MAX held, and digested at the next flush (Data.digest)."""
        self.batches += 1
        self.dirty = True
        if len(self.prefix) < PREFIX and not self.unreadable:
            self.record(samples[:PREFIX])
            samples = samples[PREFIX:]
        self.n += len(samples) + beyond
        room = PENDING_MAX - len(self.pending)
        if room > 0:
            self.pending += samples if len(samples) <= room else samples[:room]  # bounded, whatever a batch holds

    def digest(self, budget: int) -> int:
        """Digest up to `budget` of the held indices (already counted), drop the rest; the number digested."""
        held, self.pending = self.pending, []
        if len(held) > budget:
            held = held[:budget]
        n = self.n
        self.record(held)
        self.n = n  # counted when taken
        return len(held)

    def record(self, seq: Any) -> None:
        """Indices the sampler gave, a batch at a time (a list, tuple or range), in bulk: C-level loops, no
        Python code per index. Whatever is not an integer index ends the epoch's record (unreadable)."""
        if self.unreadable or not seq:
            return
        try:
            if type(seq[0]) is not int:  # numpy or tensor integers: as Python ints (the slow path)
                seq = [_as_int(i) for i in seq]
                if None in seq:
                    raise TypeError("not an index")
            base = self.base
            if base is not None:
                if min(seq) < 0:
                    raise IndexError("a negative index")
                seq = list(map(base.__getitem__, seq))
            self.n += len(seq)
            prefix = self.prefix
            room = PREFIX - len(prefix)
            if room > 0:
                run = prefix[-1:] + list(seq[:room])
                if any(b < a for a, b in zip(run, run[1:], strict=False)):
                    self.ascending = False
                prefix.extend(run[1:] if prefix else run)
            self.sample.add_many(seq)
        except Exception:  # noqa: BLE001  (a str * MULT raises, never allocates; a user's __index__ may raise anything)
            self.unreadable = True
            self.sample.kept.clear()
        self.dirty = True

    def to_json(self) -> dict[str, Any]:
        if not all(type(i) is int for i in self.sample.kept) or not all(type(i) is int for i in self.prefix):
            self.unreadable = True  # a mixed batch got in unfiltered: send nothing of it
            self.sample.kept.clear()
            self.prefix.clear()
        doc: dict[str, Any] = {"role": self.role, "epoch": self.number, "n": self.n, "batches": self.batches}
        doc.update(prefix=list(self.prefix), ascending=self.ascending, final=self.final)
        doc.update(kept=sorted(self.sample.kept), shift=self.sample.shift)
        if self.unreadable:
            doc["unreadable"] = True
        doc.update({k: v for k, v in self.facts.items() if v is not None})
        return doc


class Stream:
    """One role's epochs on this rank (several loader objects of one role share it)."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.epoch: Epoch | None = None
        self.done: list[Epoch] = []  # closed epochs not yet sent
        self.loader_fed = False  # a watched loader feeds it (step(samples=) is then ignored)
        self.claimed = False  # the watched loader has just opened an epoch: its sampler may record

    def begin(self, number: int, facts: dict[str, Any], base: list[int] | None) -> Epoch:
        self.close()
        self.epoch = Epoch(self.role, number, facts, base)
        return self.epoch

    def close(self) -> None:
        if self.epoch is not None:
            self.epoch.dirty = True
            self.done.append(self.epoch)
            self.epoch = None


class RecordingSampler:
    """Wraps a DataLoader's sampler: yields what it yields, recording each index into the open epoch."""

    def __init__(self, inner: Any, stream: Stream) -> None:
        self._inner = inner
        self._stream = stream

    def __iter__(self) -> Any:
        stream = self._stream
        epoch = stream.epoch if stream.claimed else None
        stream.claimed = False  # a second iterator (the loader iterated outside the wrapper) records nothing
        if epoch is None:
            yield from self._inner
            return
        record = epoch.record
        it = iter(self._inner)
        while True:  # drawn a chunk ahead (a DataLoader with workers draws further ahead itself)
            chunk = list(islice(it, CHUNK))
            if not chunk:
                return
            record(chunk)
            yield from chunk

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:  # set_epoch, epoch, num_replicas...: the sampler's own
        return getattr(self._inner, name)


def split_of(dataset: Any) -> tuple[list[int] | None, dict[str, Any] | None]:
    """Through a chain of Subsets (random_split's result): the index list into the base data set, and
    the split's fingerprint (its length, the base's, a hash of the list, its coordinated sample)."""
    chain = []
    ds = dataset
    while hasattr(ds, "indices") and hasattr(ds, "dataset") and len(chain) < 8:
        chain.append(ds.indices)
        ds = ds.dataset
    if not chain:
        return None, None
    try:
        lists = [c.tolist() if hasattr(c, "tolist") else list(c) for c in chain]
        if any(len(c) > MAX_SPLIT for c in lists):
            return None, None
        base = lists[0]
        for outer in lists[1:]:
            base = [outer[i] for i in base]
        if not all(type(i) is int for i in base):
            base = [operator.index(i) for i in base]
        base_len = len(ds)
    except Exception:  # noqa: BLE001  (an odd data set: read its indices as they are, nothing more)
        return None, None
    sample = CoordinatedSample()
    if len(base) > KEEP:  # start near the final shift: one pass, then halve if still above
        sample.shift = max(0, (len(base) // KEEP).bit_length() - 1)
        sample.limit = 1 << (64 - sample.shift)
    for start in range(0, len(base), 65536):
        sample.add_many(base[start : start + 65536])
    digest = hash(tuple(base)) & M64
    split = {"n": len(base), "base": base_len, "hash": f"{digest:016x}"}
    split.update(kept=sorted(sample.kept), shift=sample.shift)
    return base, split


def loader_facts(loader: Any) -> dict[str, Any]:
    """What a DataLoader says about itself at the start of an epoch (attribute reads only)."""
    sampler = getattr(loader, "sampler", None)
    inner = getattr(sampler, "_inner", sampler)
    facts: dict[str, Any] = {"sampler": type(inner).__name__[:64] if inner is not None else None}
    for key, attr in (("sampler_epoch", "epoch"), ("replicas", "num_replicas"), ("sampler_rank", "rank")):
        value = getattr(inner, attr, None)
        facts[key] = value if type(value) is int and 0 <= value < 2**31 else None
    for key, attr in (("shuffle", "shuffle"), ("drop_last", "drop_last")):
        value = getattr(inner, attr, None)
        facts[key] = value if isinstance(value, bool) else None
    try:
        facts["len"] = len(loader.dataset)
    except Exception:  # noqa: BLE001  (an IterableDataset has no length)
        facts["len"] = None
    workers = getattr(loader, "num_workers", None)
    facts["workers"] = workers if type(workers) is int and 0 <= workers < 4096 else None
    try:  # the batches this epoch will give (map-style data sets): uneven shards show before the epoch ends
        facts["expected"] = len(loader)
    except Exception:  # noqa: BLE001  (an IterableDataset without __len__)
        facts["expected"] = None
    return facts


class WatchedLoader:
    """`gpudoctor.watch_loader(loader)` while watched: the loader, with its indices, epochs and the time
    spent inside next(loader) recorded. Every other attribute is the loader's own."""

    def __init__(self, loader: Any, role: str, data: Data) -> None:
        self._loader = loader
        self._role = role
        self._data = data
        self._base: tuple[int, list[int] | None] | None = None  # (id of the data set, its base list)
        stream = data.stream(role)
        stream.loader_fed = True
        if role == "train":
            data.fast = None  # step(samples=) no longer feeds this stream: its short path is closed
        batch_sampler = getattr(loader, "batch_sampler", None)
        inner = getattr(batch_sampler, "sampler", None)
        self.indexed = isinstance(inner, RecordingSampler)
        if inner is not None and not self.indexed:
            try:  # BatchSampler.sampler is a plain attribute: its __iter__ reads it at each epoch
                batch_sampler.sampler = RecordingSampler(inner, stream)
                self.indexed = True
            except (AttributeError, TypeError):
                pass
        if not self.indexed:
            data.note(
                f"watch_loader({role!r}): this loader has no BatchSampler to read indices from "
                "(batch_size=None or a custom batch_sampler); pass samples= to gpudoctor.step()"
            )

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __iter__(self) -> Any:
        data, loader = self._data, self._loader
        stream = data.stream(self._role)
        dataset = getattr(loader, "dataset", None)
        if self._base is None or self._base[0] != id(dataset):
            base, split = split_of(dataset)
            self._base = (id(dataset), base)
            if split is not None:
                data.splits[self._role] = {"role": self._role, **split}
        number = data.next_epoch(self._role)
        epoch = stream.begin(number, loader_facts(loader), self._base[1])
        data.workers[self._role] = epoch.facts.get("workers")
        stream.claimed = self.indexed
        clock = time.perf_counter
        try:  # begun first: a loader with workers takes its first indices from the sampler in iter()
            it = iter(loader)
        except BaseException:  # not a loader, or one that cannot begin: no epoch was read (the error is the user's)
            stream.claimed = False
            if stream.epoch is epoch:
                stream.epoch = None
                data.epochs[self._role] = number
            raise
        try:
            while True:
                t = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                data.loader_s += clock() - t
                data.loader_batches += 1
                epoch.batches += 1
                epoch.dirty = True
                yield batch
            epoch.final = True
        finally:
            stream.claimed = False
            if stream.epoch is epoch:
                stream.close()
            data.flush(time.monotonic())  # now: a rank that ends its epoch may crash in the next collective


def hello() -> dict[str, Any]:
    """Where this rank runs: its local rank and the devices it may see (what names its own GPU), its CPUs."""
    env = os.environ
    out: dict[str, Any] = {}
    for key, names in (
        ("local_rank", ("LOCAL_RANK", "SLURM_LOCALID")),
        ("local_world", ("LOCAL_WORLD_SIZE",)),
        ("world", ("WORLD_SIZE", "SLURM_NTASKS")),
    ):
        for name in names:
            value = env.get(name, "")
            if value.isdigit() and len(value) < 7:
                out[key] = int(value)
                break
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        out["visible"] = visible[:256]
    if env.get("CUDA_DEVICE_ORDER") in ("PCI_BUS_ID", "FASTEST_FIRST"):
        out["order"] = env["CUDA_DEVICE_ORDER"]
    try:
        out["cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        out["cpus"] = os.cpu_count()
    return out


class Data:
    """One per watched process: the loss, the loaders' epochs and time, sent beside the step records."""

    def __init__(self, rank: int, send: Any) -> None:
        self.rank = rank
        self._send = send  # bytes -> bool (sent); the publisher's non-blocking socket
        self.hello: dict[str, Any] | None = hello()
        self.losses = Losses()
        self.streams: dict[str, Stream] = {}
        self.epochs: dict[str, int] = {}  # role -> epochs begun
        self.splits: dict[str, dict[str, Any]] = {}  # role -> fingerprint not yet sent
        self.workers: dict[str, int | None] = {}  # role -> the loader's num_workers
        self.loader_s = 0.0
        self.loader_batches = 0
        self.noted: set[str] = set()
        self.partial_at = 0.0
        self.fast: Epoch | None = None  # the epoch step(samples=) last recorded into
        self.allowance = float(DIGEST_RATE)  # indices that may be digested now (refilled at DIGEST_RATE a second)
        self.allowed_at = time.monotonic()

    def refused(self, exc: BaseException) -> None:
        """step(loss=, samples=, epoch=) raised while read: said once, the step goes on."""
        with contextlib.suppress(Exception):
            self.note(f"step(loss=, samples=, epoch=) could not be read ({type(exc).__name__}): ignored this step")

    def note(self, text: str) -> None:
        if text not in self.noted:
            self.noted.add(text)
            print(f"gpudoctor: {text}", file=sys.stderr)

    def stream(self, role: str) -> Stream:
        stream = self.streams.get(role)
        if stream is None:
            stream = self.streams[role] = Stream(role)
        return stream

    def next_epoch(self, role: str) -> int:
        number = self.epochs.get(role, 0)
        self.epochs[role] = number + 1
        return number

    def on_step(self, loss: Any, samples: Any, epoch: Any) -> None:
        if loss is not None:
            self.losses.add(loss, self.note)
        if samples is not None:
            fast = self.fast  # the usual step: a list in the epoch already open (one call less per step)
            if (
                fast is not None
                and type(samples) is list
                and (type(epoch) is int and epoch == fast.number or epoch is None and fast.number == 0)
            ):
                fast.take(samples)
            else:
                self.samples(samples, epoch)

    def samples(self, samples: Any, epoch: Any) -> None:
        """step(samples=, epoch=) off the short path of on_step: the indices of this step's batch, into the
        "train" stream (a new epoch, a tensor, a tuple, ...)."""
        stream = self.stream("train")
        if stream.loader_fed:
            self.note("step(samples=) is ignored: watch_loader() already reads this rank's training indices")
            return
        if epoch is None:
            self.note(
                "step(samples=) without epoch=: every sample counts in one epoch (order across epochs "
                "and overlap after the first epoch cannot be judged)"
            )
            epoch = 0
        number = _as_int(epoch)
        if number is None or number < 0:
            self.note(f"step(epoch=) takes an epoch number >= 0, not {epoch!r}: samples ignored")
            return
        current = stream.epoch
        if current is None or current.number != number:
            if current is not None:
                current.final = True  # a new epoch number: the last one is over
            current = stream.begin(number, {}, None)
            self.epochs["train"] = number + 1
        self.fast = current
        cap = PREFIX + PENDING_MAX  # what one step's batch can add to what is held: copy no more of it
        if hasattr(samples, "tolist"):
            if getattr(getattr(samples, "device", None), "type", "cpu") != "cpu":
                self.note(
                    "step(samples=) takes the batch's indices on the CPU (reading a device tensor would "
                    "wait for the device): ignored"
                )
                return
        try:
            total = len(samples)  # a sequence (a list, tuple, range, array): not a set, a mapping or a generator
            head = samples[:cap]
            head = head.tolist() if hasattr(head, "tolist") else list(head)
        except TypeError:
            self.note(f"step(samples=) takes a sequence of sample indices, not {type(samples).__name__}: ignored")
            return
        if type(head) is not list:  # a 0-d array's tolist() is a number
            self.note(f"step(samples=) takes a sequence of sample indices, not {type(samples).__name__}: ignored")
            return
        current.take(head, max(0, total - len(head)))

    # -- sending ---------------------------------------------------------------------------------------
    def digest(self, now: float, final: bool = False) -> None:
        """Digest the indices step(samples=) held, within DIGEST_RATE (all of them at exit: PENDING_MAX at most)."""
        self.allowance = min(float(DIGEST_RATE), self.allowance + (now - self.allowed_at) * DIGEST_RATE)
        self.allowed_at = now
        for stream in self.streams.values():
            for epoch in (*stream.done, stream.epoch):
                if epoch is not None and epoch.pending:
                    budget = len(epoch.pending) if final else max(0, int(self.allowance))
                    self.allowance -= epoch.digest(budget)

    def flush(self, now: float, final: bool = False) -> None:
        """Send what changed: one datagram for the rank's facts, loss and loader time, one per epoch or split
        digest. What could not be sent (the watcher's queue was full) is sent at the next flush."""
        self.digest(now, final)
        self.losses.launch()
        self.losses.collect(wait=final)
        doc: dict[str, Any] = {"rank": self.rank}
        if self.hello is not None:
            doc["hello"] = self.hello
        loss = self.losses.to_json()
        if loss is not None:
            doc["loss"] = loss
        if self.loader_batches:
            workers = [w for w in self.workers.values() if w is not None]
            doc["loader"] = {"s": self.loader_s, "batches": self.loader_batches, "workers": max(workers, default=0)}
        if len(doc) > 1:
            if not self._post(doc):
                return
            if self.hello is not None:
                self.hello = None
            self.losses.reset()
            self.loader_s, self.loader_batches = 0.0, 0
        partial = final or now - self.partial_at >= PARTIAL_S
        for role, split in list(self.splits.items()):
            if not self._post({"rank": self.rank, "split": split}):
                return
            del self.splits[role]
        for stream in self.streams.values():
            for epoch in list(stream.done):
                if not self._post({"rank": self.rank, "epoch": epoch.to_json()}):
                    return
                stream.done.remove(epoch)
            epoch = stream.epoch
            if epoch is None or not epoch.dirty:
                continue
            filled = not epoch.sent_prefix and len(epoch.prefix) >= PREFIX
            if partial or filled:
                if not self._post({"rank": self.rank, "epoch": epoch.to_json()}):
                    return
                epoch.dirty = False
                epoch.sent_prefix = epoch.sent_prefix or filled
        if partial:
            self.partial_at = now

    def _post(self, doc: dict[str, Any]) -> bool:
        return bool(self._send(DATA_MAGIC + json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()))
