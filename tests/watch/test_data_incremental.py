"""Issue 22: DataBook judges only what changed (watch/data.py, data_overlap.py) and gives the verdicts of judging
everything every time: the DataBook of 5552faf (tests/watch/_databook_oracle.py) is the oracle, fed the same
seeded random runs (ranks joining late, restarting, ranks without a rank number, train and eval roles, shards,
whole reads, shared and repeated orders, partial then final digests, late partials, unreadable digests,
forged sample indices, epochs leaving KEEP_EPOCHS, splits that differ, leak or come and go)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from gpudoctor.watch import data_overlap
from gpudoctor.watch.data import DataBook, filtered
from gpudoctor.watch.data_model import DataReading, EpochDigest, SplitDigest
from gpudoctor.watch.thresholds import Thresholds
from tests.watch._databook_oracle import DataBook as OracleBook

TH = Thresholds(warmup_s=0)
MODES = ("shard", "shard", "all", "same", "repeat")


class Rank:
    """One rank of a random run: its mode of reading, its epochs per role, what it read of the current one."""

    def __init__(self, rng: random.Random, rank: int | None, pid: int, world: int, size: int, mode: str) -> None:
        self.rng, self.rank, self.pid, self.world, self.size = rng, rank, pid, world, size
        self.mode = mode if rng.random() < 0.8 else rng.choice(MODES)  # the run's, or its own mistake
        # what a rank's loader says of itself stays (a mistake in it stays too)
        self.facts = {
            "sampler": rng.choice((None, "DistributedSampler", "RandomSampler")),
            "replicas": rng.choice((None, world, 1)),
            "drop_last": rng.choice((None, False, False, True)) if rng.random() < 0.5 else None,
            "len": size if rng.random() < 0.9 else None,
        }
        self.longer = rng.random() < 0.1  # its loader gives one batch more
        self.epoch = {"train": 0, "eval": 0, "val": 0}
        self.read: dict[str, int] = {}
        self.sent: list[EpochDigest] = []

    def order(self, role: str, epoch: int) -> list[int]:
        slot = self.rank if self.rank is not None else self.pid % self.world
        if role != "train":  # DistributedSampler(shuffle=False) over an evaluation set: padded shards
            padded = list(range(self.size)) + list(range(self.size))[: -self.size % self.world or 0]
            return padded[slot :: self.world]
        seed = {"shard": epoch, "all": (slot, epoch), "same": epoch, "repeat": slot}[self.mode]
        perm = list(range(self.size))
        random.Random(str(seed)).shuffle(perm)
        return perm[slot :: self.world] if self.mode == "shard" else perm

    def digest(self, role: str) -> EpochDigest:
        rng, epoch = self.rng, self.epoch[role]
        order = self.order(role, epoch)
        got = min(len(order), self.read.get(role, 0) + rng.randint(1, max(1, len(order) // 2)))
        self.read[role] = got
        final = got == len(order)
        shift = rng.choice((0, 0, 1, 2, 3))
        kept = set(filtered(order[:got], shift))
        if rng.random() < 0.05:  # forged: indices above the shift's limit, which the judge must filter out
            kept |= set(rng.sample(range(self.size), 3))
        e = EpochDigest(
            role,
            epoch,
            n=got,
            batches=(got + 3) // 4 + (final and rng.random() < 0.05),
            prefix=tuple(order[: min(got, 32)]),
            ascending=role != "train",
            final=final,
            kept=tuple(sorted(kept)),
            shift=shift,
            unreadable=rng.random() < 0.05,
            sampler_epoch=rng.choice((None, 0, epoch)),
            sampler_rank=rng.choice((None, 0, self.rank)),
            shuffle=rng.choice((None, True, False)) if rng.random() < 0.3 else None,
            expected=None if rng.random() < 0.3 else (len(order) + 3) // 4 + self.longer,
            **self.facts,
        )
        if final:
            self.epoch[role] += 1
            self.read[role] = 0
        self.sent.append(e)
        return e

    def reading(self) -> DataReading:
        rng = self.rng
        roles = ["train"] + [r for r in ("eval", "val") if rng.random() < 0.3]
        epochs = [self.digest(role) for role in roles]
        if self.sent and rng.random() < 0.08:  # a late partial digest of an earlier epoch, or an old one again
            late = rng.choice(self.sent)
            epochs.append(EpochDigest(**{**late.__dict__, "final": rng.random() < 0.1}))
        splits = [split(rng, self.rank) for _ in range(rng.random() < 0.12)]
        return DataReading(self.pid, self.rank, epochs=tuple(epochs), splits=tuple(splits))


def split(rng: random.Random, rank: int | None) -> SplitDigest:
    """A Subset digest: most ranks seeded alike (one split between them), some not, of one base data set or two."""
    seed = rng.choice((0, 0, rank or 0, rng.randint(1, 3)))
    part = random.Random(seed)
    order = list(range(300))
    part.shuffle(order)
    cut = 60 + seed % 3
    role = rng.choice(("train", "train", "eval"))
    indices = order[cut:] if role == "train" else order[:cut]
    shift = rng.choice((0, 0, 1))
    kept = tuple(sorted(filtered(indices, shift)))
    base = 300 if rng.random() < 0.9 else 301
    return SplitDigest(role, len(indices), base, f"{seed * 7 + (role == 'eval'):x}", kept, shift)


def run(seed: int) -> list[list[DataReading]]:
    rng = random.Random(seed)
    world = rng.randint(2, 6)
    size, mode = rng.choice((41, 122, 601)), rng.choice(MODES)  # sizes no world divides: evaluation padding
    ranks = [Rank(rng, r, 1000 + r, world, size, mode) for r in range(world)]
    late = {r: rng.randint(0, 12) if rng.random() < 0.3 else 0 for r in range(world)}
    if rng.random() < 0.2:  # processes that never said their rank
        ranks.append(Rank(rng, None, 5000 + seed, world, size, mode))
        late[len(ranks) - 1] = 0
    steps = []
    for step in range(rng.randint(8, 40)):
        readings = []
        for i, r in enumerate(ranks):
            if step < late[i] or rng.random() < 0.25:
                continue
            if r.rank is not None and rng.random() < 0.03:  # restarted: a new process for the rank, from epoch 0
                ranks[i] = r = Rank(rng, r.rank, r.pid + 100, world, size, mode)
                if rng.random() < 0.5:
                    readings.append(DataReading(r.pid, r.rank))  # its first reading says nothing yet
                    continue
            readings.append(r.reading())
        steps.append(readings)
    return steps


def same_verdicts(seed: int) -> Counter[str]:
    """Feed both books the run of `seed`; the verdicts agree after every sample judged. The codes found."""
    new, old = DataBook(TH), OracleBook(TH)
    rng = random.Random(-seed)
    for i, readings in enumerate(run(seed)):
        new.add(readings)
        old.add(readings)
        if rng.random() < 0.7:  # samples judged later see several samples' digests at once
            assert new.verdicts() == old.verdicts(), f"seed {seed}, sample {i}"
    final = new.verdicts()
    assert final == old.verdicts(), f"seed {seed}, at the end"
    return Counter(v.code for v in final)


def test_the_verdicts_are_those_of_judging_everything_every_time() -> None:
    found: Counter[str] = Counter()
    for seed in range(150):
        found += same_verdicts(seed)
    # the runs reach every verdict, more than once: agreeing on silence alone would prove nothing
    assert all(found[code] >= 5 for code in ("GD940", "GD941", "GD942", "GD943", "GD944")), found


def book(readings: list[DataReading]) -> DataBook:
    b = DataBook(TH)
    b.add(readings)
    b.verdicts()
    return b


def digest(rank: int, n: int, final: bool = False, **kw: Any) -> EpochDigest:
    """Rank `rank`'s shard of 64 x 2048 indices, `n` read."""
    order = list(range(rank, 64 * 2048, 64))[:n]
    return EpochDigest("train", 0, n, n // 8, tuple(order[:32]), True, final, tuple(order[:1024]), **kw)


def test_a_new_digest_recounts_its_own_rank_not_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a sample costs: one rank's new digest of the epoch 64 ranks read filters that rank's new sample, not
    the 64 (the book of 5552faf filtered every rank's every kept epoch, every sample: 64 calls here)."""
    b = book([DataReading(1000 + r, r, epochs=(digest(r, 500),)) for r in range(64)])
    calls = []
    real = data_overlap.filtered
    monkeypatch.setattr(data_overlap, "filtered", lambda kept, shift: calls.append(shift) or real(kept, shift))
    b.add([DataReading(1003, 3, epochs=(digest(3, 900),))])
    assert b.verdicts() == []
    assert len(calls) == 1
    calls.clear()
    b.add([DataReading(1003, 3, epochs=(digest(3, 1000, final=True),))])  # then final: still one
    b.verdicts()
    assert len(calls) == 1


def test_the_leak_search_compares_identical_splits_once_and_at_most_leak_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """GD942's leak: one rank with its own split and 64 ranks with one split between them compare 4 pairs of
    splits, not 65 x 65; past LEAK_PAIRS the count named is still a true one (the largest of the pairs compared)."""
    order = list(range(300))
    random.Random(1).shuffle(order)
    alike = [("train", order[60:]), ("eval", order[:60])]
    own = [("train", order[:250]), ("eval", order[250:])]

    def splits(parts: list[tuple[str, list[int]]], tag: str) -> tuple[SplitDigest, ...]:
        return tuple(SplitDigest(role, len(i), 300, f"{tag}{role == 'eval':d}", tuple(sorted(i))) for role, i in parts)

    readings = [DataReading(2000, 64, splits=splits(own, "b"))]
    readings += [DataReading(1000 + r, r, splits=splits(alike, "a")) for r in range(64)]
    compared = []
    real = data_overlap._first_pair
    monkeypatch.setattr(data_overlap, "_first_pair", lambda e, t: compared.append(1) or real(e, t))
    (v,) = book(readings).verdicts()
    assert len(compared) == 4  # 2 distinct evaluation splits x 2 distinct training splits
    oracle = OracleBook(TH)
    oracle.add(readings)
    assert [v] == oracle.verdicts()  # it compared 65 x 65 pairs
    assert v.message.endswith("; 60 of rank 0's 60 evaluation samples are in rank 64's training split")
    monkeypatch.setattr(data_overlap, "LEAK_PAIRS", 2)
    compared.clear()
    (v,) = book(readings).verdicts()
    assert len(compared) == 2
    assert v.message.endswith("; 50 of rank 64's 50 evaluation samples are in rank 0's training split")
