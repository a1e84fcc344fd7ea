"""The analysis window kept sample by sample (gpudoctor.watch.window): what enters is added, what leaves is
subtracted, and the result is the analysis of the same samples judged afresh."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import fields
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudoctor.watch import analysis
from gpudoctor.watch.data_model import DataReading, LoaderTime
from gpudoctor.watch.model import GpuReading, RankReading, Sample
from gpudoctor.watch.summary import SummaryBuilder
from gpudoctor.watch.synthetic import SCENARIOS, synthetic_run
from gpudoctor.watch.thresholds import Thresholds
from gpudoctor.watch.window import Window, exact, exact_mean, median_sorted, median_without

# Small windows and deadlines, so a short generated run crosses them.
TH = Thresholds(warmup_s=0, window_s=6, min_samples=3, hung_min_s=3)

readings = st.builds(
    dict,
    util=st.sampled_from([None, 0, 20, 55, 97, 100]),
    mem_used=st.sampled_from([None, 1000, 60000, 78000]),
    mem_total=st.sampled_from([None, 81559]),
    power=st.sampled_from([None, 80.0, 620.5]),
    power_limit=st.sampled_from([None, 700.0]),
    throttle=st.sampled_from([None, 0, 0x4, 0x8, 0x20, 0x40, 0x24]),
    temp=st.sampled_from([None, 50, 88]),
    xids=st.sampled_from([(), (), (48,), (13, 79)]),
    state=st.sampled_from(["ok"] * 12 + ["lost"]),
    present=st.sampled_from([True] * 15 + [False]),
)


@st.composite
def runs(draw: st.DrawFn, ranks: bool) -> list[Sample]:
    n_gpus = draw(st.integers(2, 6))
    n = draw(st.integers(1, 40))
    t, out, done = 1e9, [], [0] * n_gpus
    for _ in range(n):
        t += draw(st.sampled_from([0.5, 1.0, 1.0, 3.0]))
        gpus = []
        for g in range(n_gpus):
            r = draw(readings)
            if r.pop("present"):
                gpus.append(GpuReading(index=g, **r))
        rank_readings = None
        if ranks and draw(st.booleans()):
            rank_readings = []
            for g in range(n_gpus):
                steps = draw(st.integers(0, 3))
                done[g] += steps
                rank_readings.append(
                    RankReading(
                        pid=100 + g + 1000 * draw(st.sampled_from([0] * 9 + [1])),  # now and then a restart
                        rank=g,
                        steps=steps,
                        step_s=draw(st.sampled_from([0.5, 0.51, 0.7])) if steps else None,
                        wait_s=draw(st.sampled_from([None, 0.01, 0.3])) if steps else None,
                        last_step=done[g] or None,
                        last_end=t - draw(st.sampled_from([0.0, 0.1, 0.35])) if done[g] else None,
                    )
                )
        out.append(Sample(t, tuple(gpus), draw(st.sampled_from([None, 30.0, 90.5])), ranks=rank_readings))
    return out


def judged(b: analysis.Balance, lateness: bool = True) -> tuple[object, ...]:
    ranks = {
        k: (r.steps, r.step_s, r.wait_share, r.last_step, r.last_end, *((r.late_s, r.late_n) if lateness else ()))
        for k, r in b.ranks.items()
    }
    verdicts = [(v.code, v.gpus, v.ranks, v.message) for v in b.verdicts]
    if not lateness:  # a slow rank can be named for its lateness, which is the one figure with a history
        verdicts = [v for v in verdicts if v[0] != "GD909"]
    return (b.samples, verdicts, b.mean_util, b.mem_mean, b.util_spread, b.idle, b.warming, ranks)


@settings(max_examples=150, deadline=None)
@given(runs(ranks=False))
def test_the_window_kept_sample_by_sample_judges_as_the_same_samples_judged_afresh(samples: list[Sample]) -> None:
    builder = SummaryBuilder("x", TH)
    for i, s in enumerate(samples):
        builder.add(s)
        fresh = analysis.analyze(analysis.window(samples[: i + 1], TH.window_s), TH, elapsed=s.t - samples[0].t)
        assert judged(builder.balance) == judged(fresh)


@settings(max_examples=150, deadline=None)
@given(runs(ranks=True))
def test_rank_totals_leave_with_their_samples(samples: list[Sample]) -> None:
    """Step counts and times of a rank leave the window with the samples that brought them, and a rank
    whose every reading left is gone. Lateness is the exception: a rank's end of a step is interpolated
    from its previous report even when that report has just left the window."""
    builder = SummaryBuilder("x", TH)
    for i, s in enumerate(samples):
        builder.add(s)
        fresh = analysis.analyze(analysis.window(samples[: i + 1], TH.window_s), TH, elapsed=s.t - samples[0].t)
        assert judged(builder.balance, lateness=False) == judged(fresh, lateness=False)


def test_every_scenario_judges_the_same_kept_or_afresh() -> None:
    th = Thresholds(warmup_s=0)
    for scenario in SCENARIOS:
        samples = synthetic_run(scenario, 80, seed=4, ranks=True)
        builder = SummaryBuilder("x", th)
        for s in samples:
            builder.add(s)
        fresh = analysis.analyze(analysis.window(samples, th.window_s), th, elapsed=samples[-1].t - samples[0].t)
        assert judged(builder.balance) == judged(fresh), scenario


class Counted(tuple):  # type: ignore[type-arg]
    """A sample's readings (GPUs, ranks, data) that count how often they are read."""

    reads = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        Counted.reads += 1
        return super().__iter__()


def test_a_sample_is_read_once_whatever_the_window_length() -> None:
    """What leaves is taken out from what was kept when it entered, never by reading the window again:
    a sample's readings are read when it enters, and a verdict reads only the latest sample."""
    for window_s in (5.0, 500.0):
        th = Thresholds(warmup_s=0, window_s=window_s)
        samples = synthetic_run("straggler", 200, seed=1)
        w = Window(th, window_s)
        Counted.reads = 0
        for s in samples:
            w.add(Sample(s.t, Counted(s.gpus), s.cpu))
        assert Counted.reads == len(samples), window_s


@given(st.lists(st.integers(-5, 5), min_size=2, max_size=12), st.data())
def test_median_without_is_the_median_of_the_others(values: list[int], data: st.DataObject) -> None:
    ordered = sorted(v / 2 for v in values)
    left_out = data.draw(st.sampled_from(ordered))
    others = list(ordered)
    others.remove(left_out)
    assert median_without(ordered, left_out) == statistics.median(others)
    assert median_sorted(others) == statistics.median(others)


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=30))
def test_exact_sums_come_back_to_where_they_were(values: list[float]) -> None:
    total = sum(exact(v) for v in values)
    assert exact_mean(total, len(values)) == float(sum(map(Fraction, values)) / len(values))  # correctly rounded
    assert total - sum(exact(v) for v in values[1:]) == exact(values[0])


def test_rank_stats_made_without_init_carry_every_field() -> None:
    """rank_stats makes its RankStats without the frozen __init__ (per rank per sample): every field is set."""
    w = Window.of(synthetic_run("straggler", 30, ranks=True), TH)
    made = analysis.rank_stats(w, TH)
    assert made and all(set(s.__dict__) == {f.name for f in fields(analysis.RankStats)} for s in made.values())
    assert all(s == analysis.RankStats(**s.__dict__) for s in made.values())


def test_the_judging_of_a_sample_reads_it_as_often_whatever_the_window_length() -> None:
    """The whole judging (SummaryBuilder: verdicts, rank stats, the loader share GD948 compares) reads a
    sample's ranks and data as often with a 5 s window as with a 500 s one: the loader share summed
    every sample of the window, every sample (the window-length cost of issue 22), and so did GD946's
    loss comparison, which still does when the ranks give losses (not here)."""
    reads = {}
    shares = {}
    for window_s in (5.0, 500.0):
        b = SummaryBuilder("t", Thresholds(warmup_s=0, window_s=window_s))
        Counted.reads = 0
        for s in synthetic_run("starved", 200, seed=1, ranks=True):
            assert s.ranks is not None
            data = (DataReading(r.pid, r.rank, loader=LoaderTime(0.1 * r.steps, r.steps)) for r in s.ranks)
            b.add(dataclasses.replace(s, ranks=Counted(s.ranks), data=Counted(data)))
        reads[window_s] = Counted.reads
        shares[window_s] = {k: r.loader_share for k, r in b.balance.ranks.items()}
    assert reads[5.0] == reads[500.0]
    assert all(v == pytest.approx(0.1 / 0.5) for v in shares[5.0].values()) and shares[5.0] == shares[500.0]


@settings(max_examples=150, deadline=None)
@given(runs(ranks=True), st.integers(2, 8), st.data())
def test_rank_stats_kept_sample_by_sample_are_those_made_afresh(
    samples: list[Sample], held: int, data: st.DataObject
) -> None:
    """rank_stats makes again only the ranks the latest sample changed (Window.touched): every rank's
    figures, lateness and loader share included, are those made from the window's totals afresh, with
    ranks that restart, wrap their loader now and then, and (a small MAX_RANKS) are pushed out."""
    kept, afresh = Window(TH, TH.window_s), Window(TH, TH.window_s)
    seen: set[RankReading] = set()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("gpudoctor.watch.window.MAX_RANKS", held)
        for s in samples:
            seen.update(s.ranks or ())
            if seen and data.draw(st.booleans()):  # a data reading may come without the rank's steps
                loaders = data.draw(st.lists(st.sampled_from(sorted(seen, key=lambda r: r.pid)), max_size=3))
                s = dataclasses.replace(
                    s, data=tuple(DataReading(r.pid, r.rank, loader=LoaderTime(0.05, 1)) for r in loaders)
                )
            kept.add(s)
            afresh.add(s)
            afresh.stats_seq = -1  # made again from every rank's totals
            assert analysis.rank_stats(kept, TH) == analysis.rank_stats(afresh, TH)
            assert list(analysis.rank_stats(kept, TH)) == list(kept.ranks)  # the window's order, asked twice
            assert kept.stats.keys() == kept.ranks.keys()  # none kept for a rank gone: bounded by the window's
