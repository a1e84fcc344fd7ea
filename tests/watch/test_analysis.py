"""Balance verdicts over synthetic sample windows: each one triggered, and not triggered."""

from __future__ import annotations

import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from gpudoctor.knowledge.clock_reasons import (
    GPU_IDLE,
    HW_POWER_BRAKE_SLOWDOWN,
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    SW_POWER_CAP,
)
from gpudoctor.watch import analysis
from gpudoctor.watch.model import GpuReading, Sample
from gpudoctor.watch.summary import render_text, summarize
from gpudoctor.watch.synthetic import synthetic_run
from gpudoctor.watch.thresholds import Thresholds
from tests.paths import FIXTURES


def gpu(index: int, util: int = 97, power: float = 620.0, mem: int = 61000, **kw: object) -> GpuReading:
    return GpuReading(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        util=util,
        power=power,
        power_limit=700.0,
        mem_used=mem,
        mem_total=81559,
        **kw,
    )  # type: ignore[arg-type]


def run(n: int, make, cpu: float = 30.0) -> list[Sample]:  # type: ignore[no-untyped-def]
    """n samples 1 s apart; make(i, index) -> GpuReading for 8 GPUs."""
    return [Sample(1000.0 + i, tuple(make(i, g) for g in range(8)), cpu) for i in range(n)]


def codes(samples: list[Sample]) -> dict[str, tuple[int, ...]]:
    return {v.code: v.gpus for v in analysis.analyze(analysis.window(samples, 30)).verdicts}


def test_healthy_window_has_no_verdict() -> None:
    assert codes(synthetic_run("healthy", 40)) == {}


def test_straggler_low_gpu_is_named() -> None:
    samples = run(30, lambda i, g: gpu(g, util=60 if g == 3 else 97))
    assert codes(samples) == {"GD901": (3,)}
    verdict = analysis.stragglers(samples)[0]
    assert "below" in verdict.message and "GPU 3" in verdict.message


def test_straggler_high_gpu_is_named() -> None:
    samples = run(30, lambda i, g: gpu(g, util=95 if g == 0 else 70))
    v = analysis.stragglers(samples)
    assert [x.gpus for x in v] == [(0,)] and "above" in v[0].message


def test_small_gap_or_brief_dip_is_not_a_straggler() -> None:
    assert codes(run(30, lambda i, g: gpu(g, util=88 if g == 3 else 97))) == {}  # 9 points: noise
    # a dip in 5 of 30 samples is not "steadily" lower
    assert codes(run(30, lambda i, g: gpu(g, util=40 if (g == 3 and i % 6 == 0) else 97))) == {}


def test_straggler_needs_enough_samples_and_three_gpus() -> None:
    assert analysis.stragglers(run(3, lambda i, g: gpu(g, util=10 if g == 3 else 97))) == []
    two = [Sample(1000.0 + i, (gpu(0, util=97), gpu(1, util=20)), 30.0) for i in range(30)]
    assert analysis.stragglers(two) == []


def test_memory_imbalance_names_gpu0() -> None:
    samples = run(10, lambda i, g: gpu(g, mem=78000 if g == 0 else 52000))
    assert codes(samples) == {"GD902": (0,)}


def test_memory_within_margin_is_balanced() -> None:
    assert codes(run(10, lambda i, g: gpu(g, mem=64000 if g == 0 else 61000))) == {}


def test_input_starvation_needs_dips_on_all_gpus_and_busy_cpus() -> None:
    dipping = run(30, lambda i, g: gpu(g, util=20 if i % 2 else 97), cpu=96.0)
    assert codes(dipping) == {"GD903": tuple(range(8))}
    # same dips, idle CPUs: the GPUs wait on something else
    assert "GD903" not in codes(run(30, lambda i, g: gpu(g, util=20 if i % 2 else 97), cpu=30.0))
    # busy CPUs but the GPUs stay busy: no starvation
    assert codes(run(30, lambda i, g: gpu(g, util=97), cpu=99.0)) == {}


def test_hung_collective_names_the_idle_gpu() -> None:
    def hung(i: int, g: int) -> GpuReading:
        if i < 10:
            return gpu(g)
        return gpu(g, util=0, power=70.0) if g == 5 else gpu(g, util=100, power=80.0)

    samples = run(35, hung)
    found = codes(samples)
    assert found == {"GD904": (5,)}  # the straggler rule is silenced by the hang
    v = analysis.hung_collective(samples)[0]
    assert v.severity == "fail" and "GPU(s) 5" in v.message


def test_hung_collective_needs_sustained_idle_power() -> None:
    # 100% utilization at full power is just busy training
    assert "GD904" not in codes(run(35, lambda i, g: gpu(g, util=100, power=650.0)))
    # spinning for 15 s only: not yet
    samples = run(35, lambda i, g: gpu(g, util=100, power=80.0) if i >= 20 else gpu(g))
    assert "GD904" not in codes(samples)


def test_hung_collective_with_every_gpu_spinning() -> None:
    v = analysis.hung_collective(run(30, lambda i, g: gpu(g, util=100, power=80.0)))
    assert v and v[0].gpus == tuple(range(8)) and "every GPU" in v[0].message


def test_thermal_and_power_throttle() -> None:
    samples = run(10, lambda i, g: gpu(g, throttle=HW_THERMAL_SLOWDOWN, temp=89) if g == 2 else gpu(g, throttle=0))
    assert codes(samples) == {"GD905": (2,)}
    braked = run(10, lambda i, g: gpu(g, throttle=HW_POWER_BRAKE_SLOWDOWN) if g == 6 else gpu(g))
    v = analysis.throttling(braked)
    assert [(x.code, x.gpus) for x in v] == [("GD906", (6,))] and "power brake" in v[0].message


def test_idle_reason_or_brief_throttle_is_not_throttling() -> None:
    assert codes(run(10, lambda i, g: gpu(g, throttle=GPU_IDLE))) == {}
    brief = run(10, lambda i, g: gpu(g, throttle=SW_POWER_CAP if (g == 1 and i < 3) else 0))
    assert codes(brief) == {}


def test_xid_event_and_its_severity() -> None:
    samples = run(10, lambda i, g: gpu(g, xids=(79,) if (g == 4 and i == 7) else ()))
    v = analysis.xid_events(samples)
    assert [(x.gpus, x.severity) for x in v] == [((4,), "fail")] and "79" in v[0].message
    app = analysis.xid_events(run(10, lambda i, g: gpu(g, xids=(13,) if g == 1 and i == 2 else ())))
    assert app[0].severity == "warn"
    assert analysis.xid_events(synthetic_run("healthy", 10)) == []


def test_xid_classes_are_those_of_gpudoctor_check() -> None:
    from gpudoctor.knowledge.xid import classify, contained

    def verdict(xids: tuple[int, ...]) -> analysis.Verdict:
        (v,) = analysis.xid_events(run(10, lambda i, g: gpu(g, xids=xids if (g == 4 and i == 3) else ())))
        return v

    for xid in (13, 31, 43, 45, 48, 61, 63, 74, 79, 94, 109, 119, 120, 999):
        v = verdict((xid,))
        assert v.severity == ("fail" if classify(xid) == "hardware" and not contained(xid) else "warn"), xid
        assert classify(xid) in v.message and f"XID {xid}" in v.message
    # an XID NVIDIA's catalog does not list is not hardware for `check`, so not for watch either
    unknown = verdict((999,))
    assert "catalogue" in unknown.hint and "drain" not in unknown.hint
    assert "CUDA_LAUNCH_BLOCKING" in verdict((13,)).hint
    assert verdict((94,)).severity == "warn" and "contained" in verdict((94,)).hint  # as GD810 warns
    assert verdict((94, 95)).severity == "fail"  # the uncontained one decides
    mixed = verdict((13, 79))  # an application fault next to a hardware one: the hardware decides
    assert mixed.severity == "fail" and "drain" in mixed.hint


def test_clock_reason_bits_mean_what_they_mean_for_gpudoctor_check() -> None:
    from gpudoctor.knowledge import clock_reasons

    for reason in clock_reasons.REASONS:
        found = codes(run(10, lambda i, g, r=reason: gpu(g, throttle=r.bit if g == 2 else 0)))
        if reason.kind == clock_reasons.BENIGN:
            assert found == {}, reason.label
        else:
            expected = "GD906" if reason.kind == clock_reasons.POWER else "GD905"
            assert found == {expected: (2,)}, reason.label
            (v,) = analysis.throttling(run(10, lambda i, g, r=reason: gpu(g, throttle=r.bit if g == 2 else 0)))
            assert reason.label in v.message
    slowed = analysis.throttling(run(10, lambda i, g: gpu(g, throttle=HW_SLOWDOWN, temp=71)))
    assert [(v.code, v.message) for v in slowed] == [
        ("GD905", "hardware slowdown in 100% of the samples: " + ", ".join(f"GPU {g} 71 C" for g in range(8)))
    ]


def test_lost_gpu_is_reported_and_others_still_analysed() -> None:
    samples = run(30, lambda i, g: GpuReading(index=g, state="lost") if g == 7 else gpu(g, util=60 if g == 3 else 97))
    found = codes(samples)
    assert found["GD908"] == (7,) and found["GD901"] == (3,)


def test_summary_spans_and_balance_score() -> None:
    summary = summarize(synthetic_run("hung", 90), "hung")
    assert [sp.verdict.code for sp in summary.spans] == ["GD904"]
    span = summary.spans[0]
    assert 30 + 20 <= span.start - summary.start <= 52 and span.end == summary.end
    assert summary.balance_score is not None and summary.balance_score < 95
    doc = summary.to_json()
    assert doc["gpus"][5]["low_util"] == 0 and doc["gpus"][0]["low_util"] >= 95
    healthy = summarize(synthetic_run("healthy", 60), "healthy")
    assert healthy.balance_score is not None and healthy.balance_score >= 97 and not healthy.spans
    assert "verdicts: none" in render_text(healthy)


def test_a_flapping_verdict_is_one_span_and_spans_are_capped() -> None:
    from gpudoctor.watch.summary import MAX_SPANS_PER_VERDICT

    def xids_every(gap: int, count: int) -> list[Sample]:
        # An XID verdict holds while its event is in the 30 s window, then clears until the next one.
        return [
            Sample(1000.0 + i, tuple(gpu(g, xids=(13,) if (g == 1 and i % gap == 0) else ()) for g in range(3)), 30.0)
            for i in range(gap * count)
        ]

    # Back within a window of clearing: the same trouble, one span (not one per flap).
    merged = summarize(xids_every(40, 5), "flap")
    assert [(sp.verdict.code, sp.verdict.gpus, sp.more) for sp in merged.spans] == [("GD907", (1,), 0)]
    assert (merged.spans[0].start, merged.spans[0].end) == (1000.0, 1000.0 + 40 * 4 + 30)  # first XID to last + window
    # Clear for longer than a window: separate spans, at most MAX_SPANS_PER_VERDICT of them.
    flapping = summarize(xids_every(62, MAX_SPANS_PER_VERDICT + 15), "flap")
    assert len(flapping.spans) == MAX_SPANS_PER_VERDICT
    last = flapping.spans[-1]
    assert last.more == 15 and last.end == 1000.0 + 62 * (MAX_SPANS_PER_VERDICT + 14) + 30
    doc = flapping.to_json()
    assert doc["verdicts"][-1]["more_spans"] == 15 and "more_spans" not in doc["verdicts"][0]
    assert "+15 more times" in render_text(flapping)


def test_one_straggler_pulls_the_balance_score_down_to_its_own_level() -> None:
    """8 GPUs near 98% and one near 58%: every DDP step waits for that one."""

    from gpudoctor.watch.summary import summarize_recording

    summary = summarize_recording(str(FIXTURES / "recordings" / "straggler.jsonl"))
    assert summary.balance_score is not None and 50 <= summary.balance_score <= 65


def test_a_verdict_about_thousands_of_ranks_names_a_few_and_counts_the_rest() -> None:
    """The review's churning job (64 new processes a line): GD911 named every rank behind, about 1,900, in
    its message and its ranks, so every sample made a span of its own and a report of 1,000 lines was
    31 MB. Its message names the 8 furthest behind and counts the others; its ranks are at most 64."""
    from gpudoctor.watch.model import RankReading

    t0 = 1.7e9
    behind = [RankReading(pid=5000 + r, rank=r, steps=1, step_s=0.5, last_step=2, last_end=t0) for r in range(1, 2000)]
    ahead = RankReading(pid=4999, rank=0, steps=1, step_s=0.5, last_step=62, last_end=t0 + 30)
    samples = [Sample(t0 + 30 + 10 * i, (GpuReading(index=0, util=0),), ranks=(ahead, *behind)) for i in range(10)]
    verdicts = analysis.analyze(samples, Thresholds(warmup_s=0)).verdicts
    stalled = [v for v in verdicts if v.code == "GD911"]
    assert len(stalled) == 1, verdicts
    v = stalled[0]
    assert v.message.startswith("no rank has finished a step for 90 s; behind the others (step 62): rank 1 at step 2,")
    assert v.message.endswith("rank 8 at step 2 and 1991 more"), v.message
    assert [r.rank for r in v.ranks] == list(range(1, 65))


def _stats(i: int, cycle: float | None, wait: float | None = None, loader: float | None = None) -> analysis.RankStats:
    ref = analysis.RankRef(i, 1000 + i)
    return analysis.RankStats(ref, 100, 0.1, wait, None, 0.0, 0, 1, 1.0, cycle_s=cycle, loader_share=loader)


CYCLES = [None, 0.0, -0.2, 0.1, 0.1, 0.13, 0.5, 2.0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(CYCLES), min_size=1, max_size=9), st.data())
def test_kept_waiting_from_one_sorted_list_is_the_median_of_a_copy_of_the_others(
    cycles: list[float | None], data: st.DataObject
) -> None:
    """The second review: GD909 copied the other ranks' cycles for every slow rank (0.35 s a sample at
    4,096 ranks). The others' median now comes from one sorted list; statistics.median of the copy is
    the oracle, with the cases the copy made its own (a zero cycle, a rank alone, no cycle yet)."""
    ranks = [_stats(i, c) for i, c in enumerate(cycles)]
    s = data.draw(st.sampled_from(ranks))
    others = [o.cycle_s for o in ranks if o is not s and o.cycle_s]
    old = True if s.cycle_s is None else (False if not others else s.cycle_s < 1.2 * statistics.median(others))
    th = Thresholds(rank_slow_ratio=1.2)
    assert analysis._kept_waiting(s, sorted(c for c in cycles if c), th) is old


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.31, 0.9]), min_size=1, max_size=9))
def test_time_outside_the_step_names_the_ranks_a_copy_of_the_others_median_names(shares: list[float]) -> None:
    """GD948 the same way (1.2 s a sample at 4,096 ranks); a job-wide GD948 names at most 64 ranks."""
    from gpudoctor.watch.resources import outside_step

    th = Thresholds()
    stats = {(i, 1000 + i): _stats(i, None, wait=share, loader=0.0) for i, share in enumerate(shares)}
    named = {r.rank for v in outside_step(stats, th) if not v.message.startswith("the ranks") for r in v.ranks}
    expected = set()
    for i, share in enumerate(shares):
        rest = shares[:i] + shares[i + 1 :]
        if rest and share >= th.outside_share and share >= th.outside_ratio * statistics.median(rest):
            expected.add(i)
    assert named == expected


def test_a_job_wide_verdict_on_thousands_of_ranks_names_at_most_64() -> None:
    from gpudoctor.watch.resources import outside_step

    stats = {(i, 1000 + i): _stats(i, None, wait=0.5, loader=0.05) for i in range(4096)}
    (verdict,) = outside_step(stats, Thresholds())
    assert [r.rank for r in verdict.ranks] == list(range(64)) and "median of 4096 ranks" in verdict.message
