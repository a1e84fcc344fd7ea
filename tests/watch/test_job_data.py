"""What a rank collects about its data and loss (gpudoctor/training_data.py, training_loss.py) and how the
watcher reads it (gpudoctor/watch/data_model.py): against torch's own DataLoader, samplers and
random_split as oracles, and against damaged or forged datagrams."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from gpudoctor.training_data import (
    DATA_MAGIC,
    KEEP,
    M64,
    MULT,
    PARTIAL_S,
    PREFIX,
    CoordinatedSample,
    Data,
    WatchedLoader,
)
from gpudoctor.training_loss import Losses
from gpudoctor.training_step import ENV
from gpudoctor.watch.data import filtered
from gpudoctor.watch.data_model import DataReading, parse_datagram
from gpudoctor.watch.model import Sample
from gpudoctor.watch.steps import StepChannel

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset, random_split  # noqa: E402


class Indexed(Dataset):  # type: ignore[misc]
    """Each sample is its own index: what the loader yielded is what the rank read."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def collect() -> tuple[Data, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def send(payload: bytes) -> bool:
        assert payload.startswith(DATA_MAGIC)
        sent.append(json.loads(payload[len(DATA_MAGIC) :]))
        return True

    return Data(0, send), sent


def epochs_sent(sent: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The last digest sent of each (role, epoch)."""
    return {(d["epoch"]["role"], d["epoch"]["epoch"]): d["epoch"] for d in sent if "epoch" in d}


# -- the coordinated sample ------------------------------------------------------------------------------------


def test_coordinated_samples_find_exactly_the_shared_indices_below_the_common_limit() -> None:
    rng = random.Random(7)
    shared = rng.sample(range(10**6), 3000)
    a = shared + rng.sample(range(10**6, 2 * 10**6), 7000)
    b = shared + rng.sample(range(2 * 10**6, 3 * 10**6), 2000)
    rng.shuffle(a)
    rng.shuffle(b)
    sa, sb = CoordinatedSample(), CoordinatedSample()
    for i in a:
        sa.add(i)
    for i in b:
        sb.add(i)
    assert len(sa.kept) <= KEEP and len(sb.kept) <= KEEP and sa.shift > 0 and sb.shift > 0
    shift = max(sa.shift, sb.shift)
    limit = 1 << (64 - shift)
    truth = {i for i in shared if (i * MULT) & M64 < limit}  # brute force over the real intersection
    assert filtered(sa.kept, shift) & filtered(sb.kept, shift) == truth
    assert truth  # 3000 shared at shift <= 4 keeps about 190 of them
    small = CoordinatedSample()
    for i in range(KEEP):
        small.add(i)
    assert small.shift == 0 and small.kept == set(range(KEEP))  # exact up to KEEP


# -- the loader wrapper, against torch's DataLoader ------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_the_indices_recorded_are_the_ones_the_loader_gave(workers: int) -> None:
    data, sent = collect()
    loader = DataLoader(Indexed(100), batch_size=8, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    watched = WatchedLoader(loader, "train", data)
    seen = []
    for _ in range(2):
        seen.append([int(i) for batch in watched for i in batch])
    assert len(watched) == 13 and watched.batch_size == 8  # the loader's own attributes
    digests = epochs_sent(sent)
    for number, order in enumerate(seen):
        e = digests[("train", number)]
        assert e["final"] and e["n"] == 100 and e["batches"] == 13 and e["expected"] == 13
        assert e["prefix"] == order[:PREFIX] and e["kept"] == sorted(order) and e["shift"] == 0
        assert e["sampler"] == "RandomSampler" and e["workers"] == workers
    assert seen[0] != seen[1]  # RandomSampler reshuffles: two epochs, two orders, each recorded as read


def test_a_subset_is_read_through_to_the_base_data_set_and_fingerprinted() -> None:
    data, sent = collect()
    train, _ = random_split(Indexed(50), [40, 10], generator=torch.Generator().manual_seed(3))
    loader = DataLoader(train, batch_size=5, shuffle=False)
    read = [int(i) for batch in WatchedLoader(loader, "train", data) for i in batch]
    assert read == list(train.indices)  # the Subset's items are base indices here: the oracle
    (e,) = epochs_sent(sent).values()
    assert e["prefix"] == read[:PREFIX] and e["kept"] == sorted(read)
    (split,) = [d["split"] for d in sent if "split" in d]
    assert split["n"] == 40 and split["base"] == 50 and split["kept"] == sorted(train.indices)


def test_a_loader_iterated_outside_the_wrapper_records_nothing_and_a_break_leaves_the_epoch_open() -> None:
    data, sent = collect()
    loader = DataLoader(Indexed(40), batch_size=4, shuffle=True)
    watched = WatchedLoader(loader, "train", data)
    assert len(list(loader)) == 10  # the loader itself, not the wrapper: no epoch
    assert epochs_sent(sent) == {}
    for n, _ in enumerate(watched):
        if n == 2:
            break
    cut = epochs_sent(sent)[("train", 0)]
    assert not cut["final"] and cut["batches"] == 3
    list(watched)
    assert epochs_sent(sent)[("train", 1)]["final"]


def test_a_loader_that_cannot_begin_begins_no_epoch() -> None:
    """Hostile review 2, L8: a loader whose __iter__ raises (or None, or 5) counted an epoch begun, so
    "5 epochs begun" when 2 loaders yielded. The error is still the user's."""

    class Broken:
        def __iter__(self) -> Any:
            raise RuntimeError("no shards")

    data, sent = collect()
    for bad, error in ((Broken(), RuntimeError), (None, TypeError), (5, TypeError)):
        with pytest.raises(error):
            list(WatchedLoader(bad, "train", data))
    assert data.epochs == {"train": 0}
    assert len(list(WatchedLoader(DataLoader(Indexed(8), batch_size=4), "train", data))) == 2
    assert list(epochs_sent(sent)) == [("train", 0)] and data.epochs == {"train": 1}


def test_a_loader_without_a_batch_sampler_is_said_once_and_still_timed(capsys: pytest.CaptureFixture[str]) -> None:
    data, sent = collect()
    loader = DataLoader(Indexed(6), batch_size=None)
    assert len(list(WatchedLoader(loader, "train", data))) == 6
    assert capsys.readouterr().err.count("no BatchSampler to read indices from") == 1
    (timed,) = [d["loader"] for d in sent if "loader" in d]  # sent as the epoch ended
    assert timed["batches"] == 6 and timed["s"] > 0
    (e,) = epochs_sent(sent).values()
    assert e["batches"] == 6 and e["n"] == 0 and e["kept"] == []


def test_step_samples_are_digested_whole_when_the_loop_is_within_the_rate() -> None:
    """Issue 20: a step's indices were digested 16 at most; a loop under DIGEST_RATE now has all of them."""
    data, sent = collect()
    order = [random.Random(epoch).sample(range(1000), 600) for epoch in range(2)]
    for epoch in range(2):
        for start in range(0, 600, 300):
            data.on_step(None, torch.tensor(order[epoch][start : start + 300]), epoch)
    data.flush(time.monotonic(), final=True)
    digests = epochs_sent(sent)
    for epoch in range(2):
        e = digests[("train", epoch)]
        assert e["n"] == 600 and e["batches"] == 2 and e["shift"] == 0
        assert e["kept"] == sorted(order[epoch]) and e["prefix"] == order[epoch][:PREFIX]
    assert digests[("train", 0)]["final"] and not digests[("train", 1)]["final"]


def test_a_loop_faster_than_the_digest_rate_is_counted_exactly_and_digested_at_that_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cost bound: at most DIGEST_RATE indices a second are hashed (the earliest held at each flush),
    at most PENDING_MAX held between flushes; the counts stay exact; at exit what is held is digested."""
    import gpudoctor.training_data as td

    monkeypatch.setattr(td, "DIGEST_RATE", 100)
    monkeypatch.setattr(td, "PENDING_MAX", 256)
    data, sent = collect()
    start = data.allowed_at
    steps = [list(range(64 * k, 64 * k + 64)) for k in range(40)]  # 2,560 distinct indices, in order
    for batch in steps[:10]:
        data.on_step(None, batch, 0)
    (epoch,) = (s.epoch for s in data.streams.values())
    assert epoch is not None and len(epoch.pending) <= 256 + 64  # held, bounded
    data.flush(start + 0.5)  # a full allowance (1 s of DIGEST_RATE): 100 of the held digested
    first = epochs_sent(sent)[("train", 0)]
    assert first["n"] == 640 and first["kept"] == list(range(PREFIX + 100))  # the prefix at once, then 100
    for batch in steps[10:20]:
        data.on_step(None, batch, 0)
    data.flush(start + 0.5 + PARTIAL_S)  # 5 s later: the allowance is full again, not 5 s of it
    second = epochs_sent(sent)[("train", 0)]
    assert second["n"] == 1280 and second["kept"] == first["kept"] + list(range(640, 740))
    for batch in steps[20:]:
        data.on_step(None, batch, 0)
    data.flush(start + 0.5 + PARTIAL_S, final=True)  # at exit: everything held (PENDING_MAX at most)
    last = epochs_sent(sent)[("train", 0)]
    assert last["n"] == 2560 and last["kept"] == second["kept"] + list(range(1280, 1280 + 256))


def test_step_samples_as_lists_digest_as_tensors_do_and_a_loader_takes_over() -> None:
    """Lists of ints take a shorter path than tensors: the digests the watcher gets must not differ."""
    rng = random.Random(3)
    order = [rng.sample(range(5000), 5000) for _ in range(3)]
    by_list, sent_list = collect()
    by_tensor, sent_tensor = collect()
    for epoch in range(3):
        for start in range(0, 5000, 100):
            batch = order[epoch][start : start + 100]
            by_list.on_step(None, batch, epoch)
            by_tensor.on_step(None, torch.tensor(batch), epoch)
    for data in (by_list, by_tensor):
        data.flush(time.monotonic(), final=True)
    assert epochs_sent(sent_list) == epochs_sent(sent_tensor)
    assert [epochs_sent(sent_list)[("train", e)]["n"] for e in range(3)] == [5000, 5000, 5000]
    WatchedLoader(DataLoader(Indexed(8), batch_size=4), "train", by_list)  # now the loader reads the indices
    by_list.on_step(None, [1, 2, 3], 2)
    by_list.flush(time.monotonic(), final=True)
    assert epochs_sent(sent_list)[("train", 2)]["n"] == 5000


# -- unwatched ---------------------------------------------------------------------------------------------------


def test_unwatched_the_loader_is_returned_itself_and_nothing_is_imported() -> None:
    code = (
        "import sys, gpudoctor\n"
        "loader = object()\n"
        "assert gpudoctor.watch_loader(loader, role='eval') is loader\n"
        "with gpudoctor.step(samples=[1, 2], epoch=0) as s:\n"
        "    s.loss(float('nan'))\n"
        "gpudoctor.step(loss=1.0)\n"
        "try:\n"
        "    gpudoctor.watch_loader(loader, role='Eval set')\n"
        "except ValueError as exc:\n"
        "    print('refused', 'role' in str(exc))\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpudoctor.training_') or m in ('json', 'torch')))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != ENV}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["refused True", "['gpudoctor.training_step']"]


# -- losses ------------------------------------------------------------------------------------------------------


class FakeEvent:
    done = False

    def record(self) -> None: ...

    def query(self) -> bool:
        return FakeEvent.done

    def synchronize(self) -> None:
        FakeEvent.done = True


class FakeCudaLoss:
    """A CUDA loss as the loss code sees it: reading it at once (item, float) would synchronize."""

    device = SimpleNamespace(type="cuda")

    def __init__(self, value: float) -> None:
        self.value = value

    def detach(self) -> FakeCudaLoss:
        return self

    def numel(self) -> int:
        return 1

    def float(self) -> FakeCudaLoss:
        return self

    def item(self) -> float:
        raise AssertionError("a synchronizing read")

    __float__ = item


class FakeStacked:
    def __init__(self, values: list[float]) -> None:
        self.values = values
        self.copies: list[dict[str, Any]] = []

    def to(self, device: str, non_blocking: bool = False) -> Any:
        FAKE_TORCH.copies.append(non_blocking)
        return SimpleNamespace(tolist=lambda: list(self.values))


FAKE_TORCH = SimpleNamespace(
    stack=lambda ts: FakeStacked([t.value for t in ts]), cuda=SimpleNamespace(Event=FakeEvent), copies=[]
)


def test_device_losses_are_copied_without_blocking_and_read_when_their_event_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", FAKE_TORCH)
    FakeEvent.done = False
    losses = Losses()
    for value in (0.5, float("nan"), 0.25):
        losses.add(FakeCudaLoss(value), note=print)
    losses.launch()
    losses.collect()
    assert FAKE_TORCH.copies == [True] and losses.to_json() is None  # copied asynchronously, not read yet
    FakeEvent.done = True
    losses.collect()
    doc = losses.to_json()
    assert doc is not None and doc["n"] == 2 and doc["bad"] == 1 and doc["first_bad"] == 2 and doc["bad_kind"] == "nan"
    losses.reset()
    FakeEvent.done = False
    losses.add(FakeCudaLoss(1.0), note=print)
    losses.launch()
    losses.collect(wait=True)  # at exit: waits on the event
    assert losses.to_json() == {
        "n": 1,
        "bad": 0,
        "last": 4,
        "sum": 1.0,
        "sq": 1.0,
        "min": 1.0,
        "max": 1.0,
        "last_value": 1.0,
    }


def test_cpu_losses_are_read_at_once_and_what_is_not_a_loss_is_said_once() -> None:
    notes: list[str] = []
    losses = Losses()
    losses.add(torch.tensor(2.0, requires_grad=True) * 1.0, notes.append)
    losses.add(3, notes.append)
    losses.add(float("-inf"), notes.append)
    losses.add("0.1", notes.append)
    losses.add(torch.ones(3), notes.append)
    doc = losses.to_json()
    assert doc is not None and (doc["n"], doc["sum"], doc["first_bad"], doc["bad_kind"]) == (2, 5.0, 3, "-inf")
    assert len(notes) == 2 and "not str" in notes[0] and "larger tensor" in notes[1]


# -- the watcher's reader ----------------------------------------------------------------------------------------


GOOD = {"rank": 1, "epoch": {"role": "train", "epoch": 0, "n": 3, "prefix": [5, 1, 2], "kept": [1, 2, 5]}}


@pytest.mark.parametrize(
    "damage",
    [
        {"epoch": {**GOOD["epoch"], "kept": list(range(KEEP + 1))}},  # longer than a rank sends
        {"epoch": {**GOOD["epoch"], "prefix": [-1]}},
        {"epoch": {**GOOD["epoch"], "role": "Train!"}},
        {"epoch": {**GOOD["epoch"], "n": "3"}},
        {"epoch": {**GOOD["epoch"], "sampler": "a b\x1b[2J"}},
        {"loss": {"n": 1, "sum": "NaN"}},
        {"loss": {"n": 1, "first_bad": 3}},  # a first bad loss without its kind
        {"loss": {"n": 1, "bad_kind": "boom", "first_bad": 1}},
        {"split": {"role": "train", "n": 1, "base": 2, "hash": "not hex"}},
        {"hello": {"order": "RANDOM"}},
        {"rank": "0"},
    ],
)
def test_a_damaged_datagram_is_refused_whole(damage: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        parse_datagram(123, json.dumps({**GOOD, **damage}).encode())


def test_non_json_constants_and_oversized_datagrams_are_refused() -> None:
    with pytest.raises(ValueError):
        parse_datagram(1, b'{"rank": 0, "loss": {"n": 1, "sum": NaN}}')
    with pytest.raises(ValueError):
        parse_datagram(1, b"{" + b" " * 70000 + b"}")
    with pytest.raises(ValueError):
        parse_datagram(1, b"[" * 100000)
    reading = parse_datagram(9, json.dumps(GOOD).encode())
    assert reading.key == (1, 9) and reading.epochs[0].prefix == (5, 1, 2)


def test_the_channel_counts_damaged_and_foreign_data_datagrams_and_keeps_good_ones() -> None:
    channel = StepChannel()
    try:
        me = __import__("os").getpid()
        channel.accept = lambda pid: pid == me
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(DATA_MAGIC + json.dumps(GOOD).encode(), channel.path)
            s.sendto(DATA_MAGIC + b"{not json", channel.path)
            s.sendto(DATA_MAGIC + json.dumps({**GOOD, "rank": 5}).encode(), channel.path)  # one process, one rank
        deadline = time.monotonic() + 10
        while channel.rejected < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        # Another process, not the job's, sends good data (a process the job's once stays so while it lives:
        # a rank whose launcher died is still the job's; fc2555e).
        foreign = (
            "import json, socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
            "s.sendto(sys.argv[1].encode('latin-1'), sys.argv[2])"
        )
        good = (DATA_MAGIC + json.dumps(GOOD).encode()).decode("latin-1")
        subprocess.run([sys.executable, "-c", foreign, good, channel.path], check=True, timeout=60)
        while channel.rejected < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert channel.rejected == 3
        (reading,) = channel.take_data()
        assert reading.pid == me and reading.rank == 1 and reading.epochs[0].n == 3
    finally:
        channel.close()


def test_data_readings_round_trip_through_a_recorded_sample() -> None:
    reading = parse_datagram(
        7,
        json.dumps(
            {
                **GOOD,
                "loss": {
                    "n": 2,
                    "bad": 1,
                    "last": 3,
                    "sum": 1.5,
                    "sq": 1.25,
                    "min": 0.5,
                    "max": 1.0,
                    "first_bad": 2,
                    "bad_kind": "nan",
                },
                "hello": {"local_rank": 1, "visible": "0,1", "cpus": 8},
            }
        ).encode(),
    )
    sample = Sample(1_700_000_000.0, (), data=(reading,))
    again = Sample.parse(json.loads(json.dumps(sample.to_json())), [])
    assert again.data == (reading,)
    assert DataReading.parse(reading.to_json()) == reading


@pytest.mark.parametrize("ascending", [True, False])
@pytest.mark.parametrize("flag", [None, True, False])
def test_an_epoch_reads_back_from_a_recording_as_it_was_sent(ascending: bool, flag: bool | None) -> None:
    """Review 7: a recording left out every False, and a missing `ascending` reads as True: a shuffled epoch
    came back ordered (GD941, same order every epoch, was lost in `report` and `--replay`), and shuffle=False or
    drop_last=False came back unknown. Each field reads back as written, through the recording's JSON."""
    from gpudoctor.watch.data_model import DataReading, EpochDigest

    epoch = EpochDigest(
        role="train", epoch=3, n=64, batches=8, prefix=(5, 1, 9), ascending=ascending, final=bool(flag),
        shift=0, unreadable=False, shuffle=flag, drop_last=flag,
    )  # fmt: skip
    reading = DataReading(100, 0, epochs=(epoch,))
    assert DataReading.parse(json.loads(json.dumps(reading.to_json()))) == reading
