"""The summary of a watched run: per-GPU utilization, a balance score, verdicts with when they held.

Built incrementally (`SummaryBuilder.add` per sample, constant memory per GPU) so a live
run and `gpudoctor report FILE` produce the same numbers, and `report` reads its file as a
stream. Verdict spans stay bounded too: a verdict that comes back within one analysis window
of its last sample continues its span (it never really went away: the window still held the
trouble), and after MAX_SPANS_PER_VERDICT spans of the same verdict on the same GPUs the
later ones are folded into the last, which says how many it holds ("+N more").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.watch.analysis import DEFAULT, Thresholds, Verdict, analyze
from gpudoctor.watch.model import Sample, clock, plural
from gpudoctor.watch.recording import RecordingStream

SUMMARY_SCHEMA_VERSION = 1
MAX_SPANS_PER_VERDICT = 10  # listed spans of one verdict (code and GPUs); later ones fold into the last


@dataclass
class _GpuStats:
    name: str = ""
    n: int = 0
    util_sum: float = 0.0
    hist: list[int] = field(default_factory=lambda: [0] * 101)  # utilization histogram, for the low percentile
    mem_sum: float = 0.0
    mem_n: int = 0
    mem_peak: int = 0
    mem_total: int | None = None
    lost: bool = False

    def low(self, share: float = 0.1) -> int | None:
        """The utilization that the GPU stayed under for `share` of the samples (p10)."""
        if not self.n:
            return None
        need = share * self.n
        seen = 0
        for value, count in enumerate(self.hist):
            seen += count
            if seen >= need:
                return value
        return 100


@dataclass
class VerdictSpan:
    verdict: Verdict  # the first time it was seen
    start: float
    end: float
    samples: int = 1
    more: int = 0  # later spans of the same verdict folded into this one (the cap)


@dataclass
class Summary:
    source: str
    samples: int
    start: float | None
    end: float | None
    gpus: dict[int, _GpuStats]
    spans: list[VerdictSpan]
    damage: str | None = None
    exit_code: int | None = None  # the followed command's

    @property
    def duration_s(self) -> float:
        return 0.0 if self.start is None or self.end is None else max(0.0, self.end - self.start)

    @property
    def balance_score(self) -> int | None:
        """The least busy GPU's mean utilization over the busiest GPU's, in percent (100 = even).

        The least busy GPU, not the average: in synchronous data parallel every step waits for
        the slowest rank, so one straggler costs the whole job, however even the rest are.
        """
        means = [g.util_sum / g.n for g in self.gpus.values() if g.n]
        if len(means) < 2 or max(means) <= 0:
            return None
        return round(100 * min(means) / max(means))

    def to_json(self) -> dict[str, Any]:
        start = self.start or 0.0
        return {
            "schema_version": SUMMARY_SCHEMA_VERSION,
            "command": "watch",
            "source": self.source,
            "samples": self.samples,
            "duration_s": round(self.duration_s, 3),
            "damage": self.damage,
            "exit_code": self.exit_code,
            "balance_score": self.balance_score,
            "gpus": [
                {
                    "index": idx,
                    "name": g.name,
                    "mean_util": round(g.util_sum / g.n, 1) if g.n else None,
                    "low_util": g.low(),
                    "mean_mem_mib": round(g.mem_sum / g.mem_n) if g.mem_n else None,
                    "peak_mem_mib": g.mem_peak if g.mem_n else None,
                    "mem_total_mib": g.mem_total,
                    "lost": g.lost,
                }
                for idx, g in sorted(self.gpus.items())
            ],
            "verdicts": [
                {
                    "code": sp.verdict.code,
                    "name": sp.verdict.name,
                    "severity": sp.verdict.severity,
                    "gpus": list(sp.verdict.gpus),
                    "message": sp.verdict.message,
                    "hint": sp.verdict.hint,
                    "start_s": round(sp.start - start, 3),
                    "end_s": round(sp.end - start, 3),
                    "samples": sp.samples,
                    **({"more_spans": sp.more} if sp.more else {}),
                }
                for sp in self.spans
            ],
        }


class SummaryBuilder:
    """Feed samples in order; `verdicts` are those of the window ending at the latest sample."""

    def __init__(self, source: str = "live", th: Thresholds = DEFAULT) -> None:
        self.source = source
        self.th = th
        self._window: deque[Sample] = deque()
        self._gpus: dict[int, _GpuStats] = {}
        self._open: dict[tuple[str, tuple[int, ...]], VerdictSpan] = {}
        self._last: dict[tuple[str, tuple[int, ...]], VerdictSpan] = {}  # each verdict's latest span
        self._count: dict[tuple[str, tuple[int, ...]], int] = {}  # spans listed per verdict
        self._spans: list[VerdictSpan] = []
        self.samples = 0
        self.start: float | None = None
        self.end: float | None = None
        self.verdicts: tuple[Verdict, ...] = ()
        self.balance = analyze([], th)

    def add(self, s: Sample) -> tuple[Verdict, ...]:
        self.samples += 1
        self.start = s.t if self.start is None else self.start
        self.end = s.t
        for g in s.gpus:
            st = self._gpus.setdefault(g.index, _GpuStats(name=g.name))
            st.name = g.name or st.name
            st.lost = st.lost or not g.alive
            if g.alive and g.util is not None:
                st.n += 1
                st.util_sum += g.util
                st.hist[max(0, min(100, int(g.util)))] += 1
            if g.alive and g.mem_used is not None:
                st.mem_n += 1
                st.mem_sum += g.mem_used
                st.mem_peak = max(st.mem_peak, g.mem_used)
                st.mem_total = g.mem_total or st.mem_total
        self._window.append(s)
        while self._window and s.t - self._window[0].t > self.th.window_s:
            self._window.popleft()
        self.balance = analyze(self._window, self.th)
        self.verdicts = self.balance.verdicts
        self._track(s.t)
        return self.verdicts

    def _track(self, t: float) -> None:
        current = {v.key: v for v in self.verdicts}
        for key in list(self._open):
            if key not in current:
                del self._open[key]  # the span ended at its last sample
        for key, v in current.items():
            span = self._open.get(key)
            if span is None:
                span = self._last.get(key)
                if span is not None and t - span.end <= self.th.window_s:
                    pass  # back within a window: the same trouble, the same span
                elif span is not None and self._count[key] >= MAX_SPANS_PER_VERDICT:
                    span.more += 1  # flapping for the whole run: fold into the last listed span
                else:
                    span = VerdictSpan(v, t, t, samples=0)
                    self._spans.append(span)
                    self._last[key] = span
                    self._count[key] = self._count.get(key, 0) + 1
                self._open[key] = span
            span.end = t
            span.samples += 1

    def summary(self, *, damage: str | None = None, exit_code: int | None = None) -> Summary:
        return Summary(
            self.source, self.samples, self.start, self.end, dict(self._gpus), list(self._spans), damage, exit_code
        )


def summarize(samples: Iterable[Sample], source: str, th: Thresholds = DEFAULT, damage: str | None = None) -> Summary:
    builder = SummaryBuilder(source, th)
    for s in samples:
        builder.add(s)
    return builder.summary(damage=damage)


def summarize_recording(path: str, th: Thresholds = DEFAULT) -> Summary:
    """`gpudoctor report FILE`: the recording is read as a stream, never held in memory whole."""
    with RecordingStream(path) as stream:
        summary = summarize(stream, path, th)
    summary.damage = stream.damage
    return summary


def render_text(summary: Summary) -> str:
    lines = [
        f"gpudoctor watch summary: {plural(len(summary.gpus), 'GPU')}, {plural(summary.samples, 'sample')} over "
        f"{clock(summary.duration_s)} ({summary.source})"
    ]
    if summary.damage:
        lines.append(f"note: {summary.damage}")
    if summary.exit_code is not None:
        lines.append(f"command exit code: {summary.exit_code}")
    lines.append("")
    lines.append(f"{'GPU':>3}  {'name':<26} {'mean util':>9} {'low util':>9} {'mean mem':>10} {'peak mem':>10}")
    for idx, g in sorted(summary.gpus.items()):
        mean = f"{g.util_sum / g.n:.0f}%" if g.n else "n/a"
        low = f"{g.low()}%" if g.n else "n/a"
        mem = f"{g.mem_sum / g.mem_n / 1024:.1f} GiB" if g.mem_n else "n/a"
        peak = f"{g.mem_peak / 1024:.1f} GiB" if g.mem_n else "n/a"
        name = (g.name or "?")[:26] + (" (lost)" if g.lost else "")
        lines.append(f"{idx:>3}  {name:<26} {mean:>9} {low:>9} {mem:>10} {peak:>10}")
    score = summary.balance_score
    lines.append("")
    lines.append(
        f"balance score: {score}/100 (the least busy GPU's utilization relative to the busiest)"
        if score is not None
        else "balance score: n/a (needs two GPUs with utilization readings)"
    )
    lines.append("")
    if not summary.spans:
        lines.append("verdicts: none (the GPUs stayed balanced)")
    else:
        lines.append("verdicts:")
        start = summary.start or 0.0
        for sp in summary.spans:
            v = sp.verdict
            when = f"{clock(sp.start - start)}-{clock(sp.end - start)}"
            lines.append(f"  {v.code} {v.name:<17} {when:<13} {v.message}")
            if sp.more:
                lines.append(f"  {'':<23}{'':<13} +{plural(sp.more, 'more time')} in this span (it kept coming back)")
            lines.append(f"  {'':<23}{'':<13} hint: {v.hint} (gpudoctor explain {v.code})")
    return "\n".join(lines) + "\n"
