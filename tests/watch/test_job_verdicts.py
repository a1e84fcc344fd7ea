"""The job's verdicts (watch/data.py, numerics.py, resources.py) on digests made by the ranks' own code from
index lists that torch's samplers and random_split produce: large data sets (the sampled regime), the
edge of DistributedSampler's padding, and what must stay silent."""

from __future__ import annotations

import json
import random
import statistics
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudoctor.training_data import DATA_MAGIC, Data, Epoch, split_of
from gpudoctor.watch.analysis import RankRef, Verdict
from gpudoctor.watch.data import DataBook
from gpudoctor.watch.data_model import DataReading, EpochDigest, Hello, LoaderTime, LossStats, SplitDigest
from gpudoctor.watch.model import GpuReading, ProcReading, Sample
from gpudoctor.watch.numerics import LossBook, divergence
from gpudoctor.watch.resources import advise_input_wait, foreign_memory, outside_step, oversubscribed, own_gpu
from gpudoctor.watch.summary import SummaryBuilder, summarize
from gpudoctor.watch.thresholds import Thresholds

torch = pytest.importorskip("torch")
from torch.utils.data import DistributedSampler, RandomSampler, Subset, random_split  # noqa: E402

TH = Thresholds(warmup_s=0)


def digest(indices: list[int], role: str = "train", number: int = 0, final: bool = True, **facts: Any) -> EpochDigest:
    """What a rank sends for an epoch that read `indices` (training_data.Epoch, through the JSON it sends)."""
    e = Epoch(role, number, facts, None)
    for start in range(0, len(indices), 64):  # as the wrapped sampler draws them
        e.record(indices[start : start + 64])
    e.batches = facts.pop("batches", (len(indices) + 31) // 32)
    e.final = final
    return EpochDigest.parse(json.loads(json.dumps(e.to_json())))


def book_of(
    per_rank: dict[int, list[EpochDigest]], splits: dict[int, list[SplitDigest]] | None = None
) -> list[Verdict]:
    book = DataBook(TH)
    for rank, epochs in per_rank.items():
        book.add([DataReading(1000 + rank, rank, epochs=tuple(epochs), splits=tuple((splits or {}).get(rank, ())))])
    return book.verdicts()


def codes(verdicts: list[Verdict]) -> dict[str, list[int | None]]:
    return {v.code: [r.rank for r in v.ranks] for v in verdicts}


def distributed(n: int, world: int, rank: int, epoch: int = 0, **kw: Any) -> list[int]:
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, **kw)
    sampler.set_epoch(epoch)
    return list(sampler)


# -- data across ranks -------------------------------------------------------------------------------------------


def test_distributed_shards_of_a_large_data_set_are_never_called_overlapping_even_with_padding() -> None:
    n, world = 100_003, 4  # 4 x 25001 - 100003 = 1 padded index, read by two ranks
    per_rank = {r: [digest(distributed(n, world, r), sampler="DistributedSampler")] for r in range(world)}
    assert codes(book_of(per_rank)) == {}
    assert all(e.shift > 0 and len(e.kept) <= 1024 for es in per_rank.values() for e in es)  # the sampled regime


def test_every_rank_reading_everything_is_called_from_a_partial_epoch_too() -> None:
    n = 100_000
    orders = {r: list(RandomSampler(range(n), generator=torch.Generator().manual_seed(r))) for r in range(2)}
    full = codes(book_of({r: [digest(o)] for r, o in orders.items()}))
    assert full == {"GD940": [0, 1]}
    partial = book_of({r: [digest(o[: n // 3], final=False)] for r, o in orders.items()})  # a third read each
    assert codes(partial) == {"GD940": [0, 1]}
    early = book_of({r: [digest(o[: n // 50], final=False)] for r, o in orders.items()})  # 2% read: 2% shared
    assert codes(early) == {}  # below the 5% floor: not called yet (and never wrongly)


def test_ranks_giving_large_batches_to_step_samples_in_their_own_orders_are_called() -> None:
    """Issue 20: step(samples=) digested 16 indices of a step, so two ranks reading everything in their own
    orders in batches of 512 shared ~3% of their digests, under GD940's 5% floor. A loop within the digest
    rate (here 512 samples a 50 ms step) now has every index digested, as watch_loader does."""
    n, batch = 20_480, 512
    per_rank = {}
    for rank in range(2):
        order = list(RandomSampler(range(n), generator=torch.Generator().manual_seed(rank)))
        sent: list[dict[str, Any]] = []
        data = Data(rank, lambda payload, out=sent: out.append(json.loads(payload[len(DATA_MAGIC) :])) or True)
        now = time.monotonic()
        for start in range(0, n, batch):
            data.on_step(None, order[start : start + batch], 0)
            now += 0.05
            data.flush(now)
        data.flush(now, final=True)
        last = [d["epoch"] for d in sent if "epoch" in d][-1]
        assert last["n"] == n and last["shift"] > 0  # the sampled regime
        per_rank[rank] = [EpochDigest.parse(last)]
    assert codes(book_of(per_rank)) == {"GD940": [0, 1]}


def test_ranks_reading_the_same_order_are_called_from_their_first_indices() -> None:
    same = list(RandomSampler(range(10_000), generator=torch.Generator().manual_seed(0)))  # every rank seeded alike
    verdicts = book_of({r: [digest(same[:32], final=False)] for r in range(3)})
    (v,) = verdicts
    assert codes(verdicts) == {"GD940": [0, 1, 2]} and "in the same order" in v.message


def test_a_missing_set_epoch_is_called_and_a_sampler_without_shuffle_is_not() -> None:
    for rank in range(2):
        assert distributed(1000, 2, rank, 0) != distributed(1000, 2, rank, 1)  # torch: set_epoch reshuffles
    stuck = {r: [digest(distributed(1000, 2, r, 0), number=e, sampler_epoch=0) for e in range(2)] for r in range(2)}
    verdicts = book_of(stuck)
    assert codes(verdicts) == {"GD941": [0, 1]} and "set_epoch() is not called" in verdicts[0].message
    moving = {r: [digest(distributed(1000, 2, r, e), number=e, sampler_epoch=e) for e in range(2)] for r in range(2)}
    assert codes(book_of(moving)) == {}
    ordered = {r: [digest(distributed(1000, 2, r, 0, shuffle=False), number=e) for e in range(2)] for r in range(2)}
    assert codes(book_of(ordered)) == {}  # shuffle=False reads in order every epoch on purpose


def test_a_missing_set_epoch_seen_on_one_rank_first_widens_to_the_other_in_the_same_span() -> None:
    """CI at stop 27: under load rank 0 reached its second epoch samples before rank 1, and GD941 was held
    naming rank 0 alone to the end of the run. It now widens as rank 1 repeats its order, in one span."""
    order = {r: distributed(1000, 2, r, 0) for r in range(2)}
    first = {r: digest(order[r], number=0, sampler_epoch=0) for r in range(2)}
    again = {r: digest(order[r][:64], number=1, final=False, sampler_epoch=0) for r in range(2)}
    steps = [{0: [first[0]], 1: [first[1]]}, {0: [again[0]]}, {}, {1: [again[1]]}, {}]
    live = SummaryBuilder("x", TH)
    named = []
    for i, per_rank in enumerate(steps):
        data = tuple(DataReading(1000 + r, r, epochs=tuple(es)) for r, es in per_rank.items())
        verdicts = live.add(Sample(1_700_000_000.0 + i, (), data=data))
        named.append(codes(list(verdicts)).get("GD941"))
    assert named == [None, [0], [0], [0, 1], [0, 1]]
    (span,) = [sp for sp in live.summary().spans if sp.verdict.code == "GD941"]
    assert [r.rank for r in span.verdict.ranks] == [0, 1]
    assert (span.start, span.end) == (1_700_000_001.0, 1_700_000_004.0)  # from when rank 0 showed it


def named_live(steps: list[dict[int, list[EpochDigest]]], code: str) -> tuple[list[Any], SummaryBuilder]:
    """Each step's digests, rank by rank, as the samples of a live run: whom `code` names at each sample."""
    live = SummaryBuilder("x", TH)
    named = []
    for i, per_rank in enumerate(steps):
        data = tuple(DataReading(1000 + r, r, epochs=tuple(es)) for r, es in per_rank.items())
        named.append(codes(list(live.add(Sample(1_700_000_000.0 + i, (), data=data)))).get(code))
    return named, live


def test_ranks_reading_everything_seen_two_first_then_the_third_are_all_named_in_one_span() -> None:
    """GD941's race (190fba1) in GD940: under load two of three ranks had read enough to be judged first, and
    the verdict was held naming them alone to the end of the run. It now widens as more ranks show it."""
    n = 10_000
    orders = {r: list(RandomSampler(range(n), generator=torch.Generator().manual_seed(r))) for r in range(3)}
    part = {r: digest(orders[r][: n // 3], final=False) for r in range(3)}
    named, live = named_live([{0: [part[0]], 1: [part[1]]}, {}, {2: [part[2]]}, {}], "GD940")
    assert named == [[0, 1], [0, 1], [0, 1, 2], [0, 1, 2]]
    (span,) = [sp for sp in live.summary().spans if sp.verdict.code == "GD940"]
    assert [r.rank for r in span.verdict.ranks] == [0, 1, 2] and span.start == 1_700_000_000.0
    assert span.message.startswith("ranks 0,1,2 read the same samples in train epoch 0")


def test_uneven_loaders_seen_two_first_then_the_third_are_all_named_in_one_span() -> None:
    """The same race in GD944: the third rank's loader length arrives a sample later."""
    planned = {r: digest([r], final=False, expected=9 if r == 0 else 8) for r in range(3)}
    named, live = named_live([{0: [planned[0]], 1: [planned[1]]}, {2: [planned[2]]}, {}], "GD944")
    assert named == [[0, 1], [0, 1, 2], [0, 1, 2]]
    (span,) = [sp for sp in live.summary().spans if sp.verdict.code == "GD944"]
    assert "(rank 0 9, rank 1 8, rank 2 8)" in span.message and span.start == 1_700_000_000.0


@pytest.mark.parametrize(("n", "extra"), [(33, 1), (35, 1), (64, 0)])
def test_evaluation_padding_is_counted_exactly(n: int, extra: int) -> None:
    world = 2
    shards = {r: [digest(distributed(n, world, r, shuffle=False), role="eval", len=n)] for r in range(world)}
    found = codes(book_of(shards))
    assert sum(len(distributed(n, world, r, shuffle=False)) for r in range(world)) - n == extra  # torch's own count
    assert found == ({"GD943": [0, 1]} if extra else {})
    everything = {r: [digest(list(range(n)), role="eval", len=n)] for r in range(world)}
    assert codes(book_of(everything)) == {}  # every rank evaluating everything is not padding


def test_a_split_that_differs_per_rank_is_called_with_its_leak_and_shards_by_hand_are_not() -> None:
    base = range(5000)
    per_rank = {r: random_split(base, [0.9, 0.1], generator=torch.Generator().manual_seed(r)) for r in range(2)}
    splits = {}
    for r, (train, held) in per_rank.items():
        splits[r] = [
            SplitDigest.parse({"role": role, **split_of(part)[1]}) for role, part in (("train", train), ("eval", held))
        ]
    verdicts = book_of({r: [] for r in range(2)}, splits)
    (v,) = verdicts
    assert v.code == "GD942" and "about" in v.message and "evaluation samples are in rank" in v.message
    true_leak = len(set(per_rank[0][1].indices) & set(per_rank[1][0].indices))
    estimate = int(v.message.split("; about ")[1].split(" of ")[0])
    assert abs(estimate - true_leak) <= 0.5 * true_leak  # sampled: the estimate's error is stated, not zero
    same = {r: random_split(base, [0.9, 0.1], generator=torch.Generator().manual_seed(42)) for r in range(2)}
    shared = {r: [SplitDigest.parse({"role": "train", **split_of(same[r][0])[1]})] for r in range(2)}
    assert book_of({r: [] for r in range(2)}, shared) == []
    by_hand = {
        r: [SplitDigest.parse({"role": "train", **split_of(Subset(base, range(r, 5000, 2)))[1]})] for r in range(2)
    }
    assert book_of({r: [] for r in range(2)}, by_hand) == []  # disjoint shards differ on purpose


def test_uneven_shards_from_the_loaders_lengths_and_from_the_counts() -> None:
    planned = {0: [digest([1], final=False, expected=9)], 1: [digest([2], final=False, expected=8)]}
    assert "(rank 0 9, rank 1 8)" in book_of(planned)[0].message
    counted = {
        0: [digest(list(range(0, 20, 2)), batches=9)],
        1: [digest(list(range(1, 20, 2)), batches=8, final=False)],
    }
    assert codes(book_of(counted)) == {}  # rank 1 may still run its ninth
    counted[1] = [digest(list(range(1, 20, 2)), batches=8)]
    assert codes(book_of(counted)) == {"GD944": [0, 1]}


# -- numerics ----------------------------------------------------------------------------------------------------


def loss_run(means: dict[int, list[float]], noise: float = 0.3, seed: int = 1) -> list[Sample]:
    """One sample a second; rank r reports 4 losses around means[r][i] in sample i."""
    rng = random.Random(seed)
    out = []
    for i in range(len(next(iter(means.values())))):
        data = []
        for rank, series in means.items():
            xs = [series[i] + rng.gauss(0, noise) for _ in range(4)]
            stats = LossStats(4, 0, 4 * (i + 1), sum(xs), sum(x * x for x in xs), min(xs), max(xs), xs[-1])
            data.append(DataReading(2000 + rank, rank, loss=stats))
        out.append(Sample(1_700_000_000.0 + i, (), data=tuple(data)))
    return out


def test_ranks_that_share_a_falling_loss_agree_and_one_that_stays_apart_is_named() -> None:
    trend = [3.0 - 0.08 * i for i in range(25)]
    assert divergence(loss_run({0: trend, 1: trend, 2: trend, 3: trend}), TH) == []
    (v,) = divergence(loss_run({0: trend, 1: [x * 1.6 for x in trend], 2: trend, 3: trend}), TH)
    assert [r.rank for r in v.ranks] == [1] and "rank 1's mean loss" in v.message
    (two,) = divergence(loss_run({0: trend, 1: [x * 0.5 for x in trend]}), TH)
    assert [r.rank for r in two.ranks] == [0, 1] and two.message.startswith("rank 0 and rank 1 disagree")
    assert divergence(loss_run({0: trend, 1: [x * 1.6 for x in trend]})[:8], TH) == []  # too few intervals


def test_the_first_non_finite_loss_is_named_by_rank_and_step() -> None:
    book = LossBook()
    book.add([DataReading(1, 0, loss=LossStats(3, 1, 9, 1.0, 1.0, 0.1, 0.5, None, 9, "nan"))])
    book.add([DataReading(2, 1, loss=LossStats(2, 1, 8, 1.0, 1.0, 0.1, 0.5, None, 8, "inf"))])
    (v,) = book.not_finite()
    assert (
        v.severity == "fail"
        and v.message == "rank 1's loss became infinite at step 8 (the first rank); then rank 0 at step 9"
    )


# -- resources ---------------------------------------------------------------------------------------------------

H200 = {0: ("NVIDIA H200", "GPU-aaaa"), 1: ("NVIDIA H200", "GPU-bbbb"), 2: ("NVIDIA H200", "GPU-cccc")}


@pytest.mark.parametrize(
    ("hello", "gpus", "own"),
    [
        (Hello(local_rank=1), H200, 1),
        (Hello(local_rank=1, visible="2,0"), H200, 0),
        (Hello(local_rank=0, visible="2"), H200, 2),  # one device per rank: cuda:0 is it
        (Hello(local_rank=1, visible="GPU-cccc,GPU-bbbb"), H200, 1),
        (Hello(local_rank=1, visible="MIG-1234"), H200, None),
        (Hello(local_rank=1), {**H200, 2: ("NVIDIA A100", "GPU-dddd")}, None),  # FASTEST_FIRST, mixed GPUs
        (Hello(local_rank=1, order="PCI_BUS_ID"), {**H200, 2: ("NVIDIA A100", "GPU-dddd")}, 1),
        (Hello(), H200, None),
    ],
)
def test_a_ranks_own_gpu(hello: Hello, gpus: dict[int, tuple[str, str]], own: int | None) -> None:
    assert own_gpu(hello, gpus) == own


def test_memory_on_another_ranks_gpu_is_named_at_a_contexts_size_and_not_below_the_floor() -> None:
    hellos = {(0, 100): Hello(local_rank=0), (1, 101): Hello(local_rank=1)}
    gpus = tuple(GpuReading(i, name, uuid) for i, (name, uuid) in H200.items())

    def sample(stray_mib: int | None) -> list[Sample]:
        procs = [ProcReading(100, 0, 30000), ProcReading(101, 1, 30000), ProcReading(101, 0, stray_mib)]
        return [Sample(1.0, gpus, procs=tuple(procs))]

    (v,) = foreign_memory(sample(518), hellos, TH)
    assert v.gpus == (0,) and v.message == "rank 1 (PID 101) holds 518 MiB on GPU 0 (rank 0's); its own GPU is GPU 1"
    assert foreign_memory(sample(40), hellos, TH) == []
    (unsized,) = foreign_memory(sample(None), hellos, TH)  # NVML without per-process memory: still a context
    assert "holds memory on GPU 0" in unsized.message


def test_ranks_that_use_no_gpu_hold_nothing_on_another_ranks_gpu() -> None:
    """Without a GPU (gloo ranks on the CPU) the job's processes are listed with no GPU: not strays."""
    hellos = {(0, 100): Hello(local_rank=0), (1, 101): Hello(local_rank=1)}
    cpu_only = (ProcReading(100, None), ProcReading(101, None))
    assert foreign_memory([Sample(1.0, (), procs=cpu_only)], hellos, TH) == []
    gpus = tuple(GpuReading(i, name, uuid) for i, (name, uuid) in H200.items())
    mixed = (ProcReading(100, 0, 30000), ProcReading(101, None), ProcReading(101, 0, 518))
    (v,) = foreign_memory([Sample(1.0, gpus, procs=mixed)], hellos, TH)  # the no-GPU row changes nothing
    assert (
        v.message
        == "rank 1 (PID 101) holds 518 MiB on GPU 0 (rank 0's); its own GPU is GPU 1, nothing on its own GPU 1"
    )


def test_workers_are_counted_against_the_cpus_before_more_are_advised() -> None:
    hellos = {(r, 10 + r): Hello(local_rank=r, cpus=16) for r in range(4)}
    (v,) = oversubscribed({k: 4 for k in hellos}, hellos)
    assert "16 DataLoader workers" in v.message and "20 busy processes on 16 CPUs" in v.message
    assert "num_workers=3 per rank" in v.hint
    assert oversubscribed({k: 2 for k in hellos}, hellos) == []
    wait = Verdict("GD910", "input-wait", (), "the ranks wait", "more workers")
    assert "will not help" in advise_input_wait(wait, {k: 3 for k in hellos}, hellos).hint
    assert "up to 3 per rank" in advise_input_wait(wait, {k: 1 for k in hellos}, hellos).hint


def test_time_outside_the_step_names_the_rank_that_works_between_steps() -> None:
    from gpudoctor.watch.analysis import RankStats

    def stats(rank: int, wait: float, loader: float) -> RankStats:
        return RankStats(RankRef(rank, rank), 50, 0.2, wait, None, 0.0, 0, 50, None, loader_share=loader)

    (v,) = outside_step({(0, 0): stats(0, 0.45, 0.02), (1, 1): stats(1, 0.03, 0.02)}, TH)
    assert [r.rank for r in v.ranks] == [0] and "43%" in v.message
    assert outside_step({(0, 0): stats(0, 0.45, 0.40), (1, 1): stats(1, 0.44, 0.40)}, TH) == []  # the loader's


# -- the summary -------------------------------------------------------------------------------------------------


def test_data_verdicts_come_back_the_same_from_a_recording() -> None:
    orders = {r: list(RandomSampler(range(300), generator=torch.Generator().manual_seed(r))) for r in range(2)}
    samples = [
        Sample(
            1_700_000_000.0 + i,
            (),
            data=tuple(
                DataReading(50 + r, r, epochs=(digest(o),), loader=LoaderTime(0.1, 3, 0)) for r, o in orders.items()
            ),
        )
        for i in range(3)
    ]
    live = SummaryBuilder("x", TH)
    for s in samples:
        live.add(s)
    replayed = summarize([Sample.parse(json.loads(json.dumps(s.to_json())), []) for s in samples], "x", TH)
    assert [sp.verdict.code for sp in live.summary().spans] == [sp.verdict.code for sp in replayed.spans] == ["GD940"]
    assert replayed.to_json()["job"]["data"][0]["last_epoch"] == {
        "epoch": 0,
        "samples": 300,
        "batches": 10,
        "complete": True,
    }


def _naive_divergence(samples: list[Sample], th: Thresholds) -> tuple[list[int], float] | None:
    """GD946 as it was: each rank's interval against the median of a copy of the others' (ranks squared a
    sample). The oracle for the sorted lists that replaced it: the ranks named and the figure."""
    series: dict[int, dict[float, float]] = {}
    counts: dict[int, int] = {}
    for s in samples:
        for r in s.data or ():
            series.setdefault(r.rank, {})[s.t] = r.loss.sum / r.loss.n
            counts[r.rank] = counts.get(r.rank, 0) + r.loss.n
    ready = {k: ms for k, ms in series.items() if counts[k] >= th.loss_min_steps}
    if len(ready) < 2:
        return None
    means = {k: statistics.mean(ms.values()) for k, ms in ready.items()}
    odd = []
    for k, ms in ready.items():
        sides = [
            m - statistics.median(others)
            for t, m in ms.items()
            if (others := [o[t] for j, o in ready.items() if j != k and t in o])
        ]
        if len(sides) < th.loss_min_intervals:
            continue
        median = statistics.median(m for j, m in means.items() if j != k)
        gap, larger = means[k] - median, max(abs(means[k]), abs(median))
        same_side = sum(1 for d in sides if d * gap > 0) / len(sides)
        if larger > 0 and abs(gap) >= th.loss_gap_share * larger and same_side >= th.loss_side_share:
            odd.append((k, abs(gap) / larger))
    if not odd:
        return None
    if len(ready) == 2:
        a, b = sorted(ready)
        return [a, b], abs(means[a] - means[b]) / max(abs(means[a]), abs(means[b]))
    return sorted(k for k, _ in odd), max(odd, key=lambda x: x[1])[1]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.one_of(st.none(), st.sampled_from([0.5, 1.0, 1.0, 1.2, 2.0, 3.0, -1.0])), min_size=12, max_size=12),
        min_size=2,
        max_size=6,
    )
)
def test_loss_divergence_from_sorted_lists_is_the_median_of_a_copy_of_the_others(
    rows: list[list[float | None]],
) -> None:
    """The scale review: GD946 took each rank's others' median, per interval, from a copy of the others (0.8 s a
    sample at 256 ranks, 3 s at 512). One sorted list per interval now; the old way is the oracle, on ties,
    ranks missing from some intervals, two ranks and negative losses."""
    samples = []
    for i in range(12):
        data = tuple(
            DataReading(2000 + r, r, loss=LossStats(4, 0, 4 * (i + 1), 4 * row[i], 0.0, 0.0, 0.0, None))
            for r, row in enumerate(rows)
            if row[i] is not None
        )
        samples.append(Sample(1_700_000_000.0 + i, (), data=data))
    th = Thresholds(warmup_s=0, loss_min_steps=8, loss_min_intervals=4)
    found = divergence(samples, th)
    expected = _naive_divergence(samples, th)
    if expected is None:
        assert found == []
    else:
        (v,) = found
        assert [r.rank for r in v.ranks] == expected[0] and v.figure is not None
        assert v.figure.value == pytest.approx(100 * expected[1], rel=1e-12)
