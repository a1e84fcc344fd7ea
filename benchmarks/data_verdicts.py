"""What the data verdicts (GD940-GD944, watch/data.py DataBook) cost a sample, by ranks: today's book against
the book of 5552faf that judged every kept epoch of every rank each time (tests/watch/_databook_oracle.py).

    .venv/bin/python benchmarks/data_verdicts.py [--repeat 3] [--samples 6]

Target (issue 22): the per-sample cost linear in ranks, so the cost per rank stays flat from 64 to 2,048 ranks.
Two measures: the index operations per rank a sample (what data_overlap counts in and out, and filters: a count,
not a time, so load cannot move it; linear means the same count at every size, checked: exit 1 otherwise), and
the CPU time per rank at the largest size over the smallest (about 1; the old book, itself linear, is timed beside
it: both rise above 1 as the book's dicts outgrow the CPU's caches, ~1.5 million indices at 2,048 ranks).
The run: every rank has read 4 whole epochs of a sharded data set
(DistributedSampler-like shards of 3,000 samples a rank, the sampled regime: ~750 kept at shift 2) and is 70%
through its fifth (at shift 2 to its end: the shift grows about log2(samples / KEEP) times an epoch, each a
recount of that epoch, not timed here). The timed samples each bring a new partial digest of that epoch from
every rank ("all"), or from one rank in 16 ("1/16": a rank sends an open epoch's digest every
training_data.PARTIAL_S, not every sample); the first also moves each rank's oldest later epoch out of
KEEP_EPOCHS (in "1/16", one rank in 16 a sample), and that epoch, settled until then, is counted again once, its
other ranks' digests with it (linear in ranks, and timed: a sample of "1/16" that starts an epoch leaving costs
all ranks). Each figure is the CPU time of the process
(time.process_time) per sample, the median of --repeat runs with the spread (min..max); the floor, measured in
the same run on the same samples: writing the sample's data readings as the recording does
(DataReading.to_json and json.dumps). The load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.watch: the book of 5552faf

from gpudoctor.training_data import KEEP  # noqa: E402
from gpudoctor.watch import data_overlap  # noqa: E402
from gpudoctor.watch.data import DataBook, filtered  # noqa: E402
from gpudoctor.watch.data_model import DataReading, EpochDigest  # noqa: E402
from gpudoctor.watch.thresholds import Thresholds  # noqa: E402
from tests.watch._databook_oracle import DataBook as OracleBook  # noqa: E402

PER_RANK = 3_000  # samples a rank reads an epoch
EPOCHS = 4  # whole epochs read before the timed ones (the book keeps the first and KEEP_EPOCHS latest)
TH = Thresholds(warmup_s=0)


def digest(rank: int, world: int, epoch: int, read: int, final: bool) -> EpochDigest:
    """Rank `rank`'s shard (every world-th index) after `read` samples: its first indices and its coordinated
    sample at the smallest shift that keeps at most KEEP of them (training_data.CoordinatedSample's rule)."""
    shard = range(rank, world * PER_RANK, world)[:read]
    shift = max(0, (read - 1) // KEEP).bit_length()
    kept = filtered(shard, shift)
    while len(kept) > KEEP:
        shift += 1
        kept = filtered(kept, shift)
    return EpochDigest("train", epoch, read, read // 32, tuple(shard[:32]), True, final, tuple(sorted(kept)), shift)


def run_of(world: int, samples: int) -> tuple[list[DataReading], list[list[DataReading]]]:
    """The readings that fill the book (whole epochs) and the timed samples' readings (all ranks each)."""
    whole = [digest(r, world, 0, PER_RANK, True) for r in range(world)]
    fill = [
        DataReading(1000 + r, r, epochs=tuple(EpochDigest(**{**whole[r].__dict__, "epoch": n}) for n in range(EPOCHS)))
        for r in range(world)
    ]
    timed = []
    for s in range(1, samples + 1):
        read = PER_RANK * (7 * (samples + 1) + 3 * s) // (10 * (samples + 1))  # 70-100% read: at shift 2
        timed.append([DataReading(1000 + r, r, epochs=(digest(r, world, EPOCHS, read, False),)) for r in range(world)])
    return fill, timed


def index_ops(fill: list[DataReading], timed: list[list[DataReading]], every: int) -> float:
    """Indices data_overlap counts in, counts out and filters per sample (DataBook's work, as a count)."""
    counted = [0]
    saved = data_overlap.filtered, data_overlap._Counts._give, data_overlap._Counts._take

    def filtered_(kept: Iterable[int], shift: int) -> set[int]:
        kept = list(kept)
        counted[0] += len(kept)
        return saved[0](kept, shift)

    def give(self: Any, x: int, indices: Iterable[int]) -> None:
        indices = list(indices)
        counted[0] += len(indices)
        saved[1](self, x, indices)

    def take(self: Any, x: int, indices: Iterable[int]) -> None:
        indices = list(indices)
        counted[0] += len(indices)
        saved[2](self, x, indices)

    book = DataBook(TH)
    book.add(fill)
    book.verdicts()
    data_overlap.filtered, data_overlap._Counts._give, data_overlap._Counts._take = filtered_, give, take
    try:
        for i, readings in enumerate(timed):
            book.add(readings[i % every :: every])
            book.verdicts()
    finally:
        data_overlap.filtered, data_overlap._Counts._give, data_overlap._Counts._take = saved
    return counted[0] / len(timed)


def dict_ns(world: int, repeat: int) -> float:
    """The machine's floor for the book's kind of work at `world` ranks: nanoseconds per get and set in a dict
    of as many indices as the book counts (PER_RANK // 4 a rank at shift 2), the best of `repeat`."""
    keys = range(world * PER_RANK // 4)
    held = dict.fromkeys(keys, 1)
    probe = keys[::7]
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        for k in probe:
            held[k] = held.get(k, 0) + 1
        best = min(best, time.process_time() - t)
    return 1e9 * best / len(probe)


def per_sample_ms(run: Callable[[], float], n: int, repeat: int) -> tuple[float, float, float]:
    """Median, min and max over `repeat` runs of the CPU milliseconds per sample that `run` reports spending."""
    times = [1000 * run() / n for _ in range(repeat)]
    return statistics.median(times), min(times), max(times)


def judge(book_type: type, fill: list[DataReading], timed: list[list[DataReading]], every: int) -> Callable[[], float]:
    """The CPU seconds the samples cost a book filled beforehand (each sample: every `every`-th rank's reading)."""

    def run() -> float:
        book = book_type(TH)
        book.add(fill)
        book.verdicts()
        samples = [readings[i % every :: every] for i, readings in enumerate(timed)]
        t = time.process_time()
        for readings in samples:
            book.add(readings)
            book.verdicts()
        spent = time.process_time() - t
        assert book.verdicts() == []  # sharded: nothing to say
        return spent

    return run


def floor(timed: list[list[DataReading]], every: int) -> Callable[[], float]:
    def run() -> float:
        t = time.process_time()
        for i, readings in enumerate(timed):
            json.dumps([r.to_json() for r in readings[i % every :: every]])
        return time.process_time() - t

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--samples", type=int, default=6, help="timed samples a run")
    ap.add_argument("--ranks", default="64,512,2048")
    args = ap.parse_args()
    sizes = [int(n) for n in args.ranks.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; median of {args.repeat} (min..max)")
    head = f"{'ranks':>5} {'sent':>4} {'book':>5} {'ms/sample':>10} {'spread':>17} {'floor ms':>9} {'ratio':>6}"
    print(head + f" {'us/rank':>8}")
    per_rank: dict[tuple[str, int, int], float] = {}
    ops: dict[tuple[int, int], float] = {}
    for world in sizes:
        fill, timed = run_of(world, args.samples)
        for every in (1, 16):
            n = len(timed)
            ops[every, world] = index_ops(fill, timed, every) / world
            base, _, _ = per_sample_ms(floor(timed, every), n, args.repeat)
            for name, book_type in (("new", DataBook), ("old", OracleBook)):
                ms, lo, hi = per_sample_ms(judge(book_type, fill, timed, every), n, args.repeat)
                per_rank[name, every, world] = 1000 * ms / world
                sent = "all" if every == 1 else f"1/{every}"
                print(
                    f"{world:>5} {sent:>4} {name:>5} {ms:>10.2f} {lo:>8.2f}..{hi:<8.2f} {base:>9.3f} {ms / base:>6.1f}"
                    f" {per_rank[name, every, world]:>8.1f}"
                )
    lo_n, hi_n = sizes[0], sizes[-1]
    linear = True
    for every in (1, 16):
        counts = [ops[every, world] for world in sizes]
        same = max(counts) <= 1.01 * min(counts)
        linear &= same
        sent = "all" if every == 1 else f"1/{every}"
        each = ", ".join(f"{c:.1f} at {w}" for c, w in zip(counts, sizes, strict=True))
        print(f"index operations per rank a sample, {sent} ranks a sample: {each} {'LINEAR' if same else 'NOT LINEAR'}")
    for every in (1, 16):
        for name in ("new", "old"):
            ratio = per_rank[name, every, hi_n] / per_rank[name, every, lo_n]
            sent = "all" if every == 1 else f"1/{every}"
            print(f"{name} book, {sent} ranks a sample: cost per rank at {hi_n} / at {lo_n} ranks = {ratio:.2f}")
    floor_lo, floor_hi = dict_ns(lo_n, args.repeat), dict_ns(hi_n, args.repeat)
    print(
        f"floor: a dict get+set among the indices of {hi_n} ranks {floor_hi:.0f} ns / of {lo_n} ranks {floor_lo:.0f} ns"
        f" = {floor_hi / floor_lo:.2f} (the same work costs more as the working set outgrows the caches)"
    )
    sys.exit(0 if linear else 1)


if __name__ == "__main__":
    main()
