"""The summary of a watched run: per-GPU utilization, a balance score, verdicts with when they held.

Built incrementally (`SummaryBuilder.add` per sample, constant memory per GPU) so a live
run and `gpudoctor report FILE` produce the same numbers, and `report` reads its file as a
stream. Verdict spans stay bounded too: a verdict that comes back within one analysis window
of its last sample continues its span (it never really went away: the window still held the
trouble), and after MAX_SPANS_PER_VERDICT spans of the same verdict on the same GPUs the
later ones are folded into the last, which says how many it holds ("+N more"). One code lists at
most MAX_SUBJECTS_PER_CODE subjects (the GPUs and ranks a verdict names): a job whose processes
churn names a new set of ranks nearly every sample, and a span each made memory grow with the file;
the samples of the subjects beyond are counted per code and said.

A span quotes its verdict's figure over the whole span (the mean, or the worst where a mean means
nothing, like how long a hang lasted), not the figure of the window where it first fired. The
event log (`SummaryBuilder.events`) is the same spans grouped per verdict: first and last seen, how
many times, the worst figure. The dashboard's log, the `--no-tui` summary and `report` all read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.safety.safe_text import printable
from gpudoctor.watch.analysis import Balance, RankStats, Verdict, balance, judge, rank_stats
from gpudoctor.watch.codes import STEPS_STALLED
from gpudoctor.watch.data_model import DataReading
from gpudoctor.watch.job import job_verdicts
from gpudoctor.watch.jobbook import JobBook, seen
from gpudoctor.watch.model import LOST, RankReading, Sample, clock, plural
from gpudoctor.watch.rank_rows import Earlier, RankRow, RankRows
from gpudoctor.watch.recording import RecordingStream
from gpudoctor.watch.thresholds import DEFAULT, Thresholds
from gpudoctor.watch.window import Window

SUMMARY_SCHEMA_VERSION = 1
MAX_SPANS_PER_VERDICT = 10  # listed spans of one verdict (code and GPUs); later ones fold into the last
# Subjects (the GPUs and ranks one verdict names) listed per code (a heuristic: one machine's GPUs and a
# job's ranks fit; beyond, a job's ranks churn, and each span held about 5 KB): later ones are counted.
MAX_SUBJECTS_PER_CODE = 256
SEVERITY = {"warn": 1, "fail": 2}


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
    xids: set[int] = field(default_factory=set)  # every XID it reported: the row stays marked

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
    verdict: Verdict  # the worst (then latest) seen in the span: its message, hint and severity
    start: float
    end: float
    samples: int = 1
    more: int = 0  # later spans of the same verdict folded into this one (the cap)
    fig_sum: float = 0.0
    fig_n: int = 0
    worst: float | None = None
    first: float | None = None  # the figure when the span began

    def observe(self, v: Verdict) -> None:
        if SEVERITY.get(v.severity, 0) >= SEVERITY.get(self.verdict.severity, 0):
            self.verdict = v
        if v.figure is not None:
            self.first = v.figure.value if self.first is None else self.first
            self.fig_sum += v.figure.value
            self.fig_n += 1
            if self.worst is None:
                self.worst = v.figure.value
            else:
                pick = max if v.figure.higher_is_worse else min
                self.worst = pick(self.worst, v.figure.value)

    @property
    def mean(self) -> float | None:
        return self.fig_sum / self.fig_n if self.fig_n else None

    @property
    def value(self) -> float | None:
        """The figure the span quotes: its mean, its worst, or (for a duration the window caps, like a
        hung collective's) the duration at the start plus the span's own length."""
        f = self.verdict.figure
        if f is None:
            return None
        if f.span == "elapsed":
            return None if self.first is None else self.first + (self.end - self.start)
        return self.mean if f.span == "mean" else self.worst

    @property
    def message(self) -> str:
        """The verdict told with its figure over the whole span."""
        f, value = self.verdict.figure, self.value
        return self.verdict.message if f is None or value is None else f.message(value)

    @property
    def worst_text(self) -> str | None:
        f = self.verdict.figure
        worst = self.value if f is not None and f.span == "elapsed" else self.worst
        return None if f is None or worst is None else f.text(worst) + f.unit


@dataclass
class Event:
    """One verdict (code and subject) over the whole run: a row of the event log."""

    span: VerdictSpan  # the latest span: its message is told over the span
    first: float
    last: float
    times: int  # spans (how many times it fired), folded ones included
    samples: int
    worst: float | None
    active: bool = False  # held at the latest sample

    @property
    def verdict(self) -> Verdict:
        return self.span.verdict

    @property
    def message(self) -> str:
        return self.span.message

    @property
    def worst_text(self) -> str | None:
        f = self.verdict.figure
        return None if f is None or self.worst is None else f.text(self.worst) + f.unit


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
    ranks: dict[tuple[int | None, int], RankRow] = field(default_factory=dict)
    warmup_s: float = 0.0
    idle_util: float = DEFAULT.idle_util
    unreadable: bool = False  # bad input: the bytes stopped reading (corrupt), or lines refused: `report` exits 2
    failure: dict[str, Any] | None = None  # how the followed command failed: the first rank, why (crash.Failure)
    job: dict[str, Any] | None = None  # the job's data, losses, GPU placement (watch/jobbook.py)
    earlier: Earlier | None = None  # ranks folded into one row (more than MAX_RANKS held at once)
    # code -> samples in which it held for a subject beyond the first MAX_SUBJECTS_PER_CODE (not listed)
    unlisted: dict[str, int] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return 0.0 if self.start is None or self.end is None else max(0.0, self.end - self.start)

    @property
    def idle(self) -> bool:
        """Every GPU stayed idle: nothing ran on them, so "balanced" would say nothing."""
        means = [g.util_sum / g.n for g in self.gpus.values() if g.n]
        return bool(means) and max(means) < self.idle_util

    @property
    def balance_score(self) -> int | None:
        """The least busy GPU's mean utilization over the busiest GPU's, in percent (100 = even).

        The least busy GPU, not the average: in synchronous data parallel every step waits for
        the slowest rank, so one straggler costs the whole job, however even the rest are. Idle GPUs
        have no balance to score (None)."""
        means = [g.util_sum / g.n for g in self.gpus.values() if g.n]
        if len(means) < 2 or max(means) <= 0 or self.idle:
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
            "idle": self.idle,
            "warmup_s": self.warmup_s,
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
                    "xids": sorted(g.xids),
                }
                for idx, g in sorted(self.gpus.items())
            ],
            "ranks": [r.to_json() for _, r in sorted(self.ranks.items(), key=lambda kv: _rank_order(kv[0]))],
            "earlier_ranks": self.earlier.to_json() if self.earlier is not None else None,
            "failure": self.failure,
            "job": self.job,
            **({"unlisted_verdicts": dict(sorted(self.unlisted.items()))} if self.unlisted else {}),
            "verdicts": [
                {
                    "code": sp.verdict.code,
                    "name": sp.verdict.name,
                    "severity": sp.verdict.severity,
                    "gpus": list(sp.verdict.gpus),
                    "ranks": [{"rank": r.rank, "pid": r.pid} for r in sp.verdict.ranks],
                    "message": sp.message,
                    "hint": sp.verdict.hint,
                    "start_s": round(sp.start - start, 3),
                    "end_s": round(sp.end - start, 3),
                    "samples": sp.samples,
                    "figure": _figure_json(sp),
                    **({"more_spans": sp.more} if sp.more else {}),
                }
                for sp in self.spans
            ],
        }


def _figure_json(sp: VerdictSpan) -> dict[str, Any] | None:
    f = sp.verdict.figure
    if f is None or sp.mean is None or sp.worst is None:
        return None
    worst = sp.value if f.span == "elapsed" and sp.value is not None else sp.worst
    return {"mean": round(sp.mean, 3), "worst": round(worst, 3), "unit": f.unit.strip()}


def _rank_order(key: tuple[int | None, int]) -> tuple[bool, int, int]:
    return (key[0] is None, key[0] or 0, key[1])


class SummaryBuilder:
    """Feed samples in order; `verdicts` are those of the window ending at the latest sample.

    The window is kept as running totals (gpudoctor.watch.window): a sample costs its GPUs and ranks,
    whatever the window's length; `balance` (the numbers the dashboard shows) is made when read."""

    def __init__(self, source: str = "live", th: Thresholds = DEFAULT) -> None:
        self.source = source
        self.th = th
        self._window = Window(th, th.window_s)
        self._gpus: dict[int, _GpuStats] = {}
        self._ranks = RankRows()  # one row per rank number, its processes folded in (watch/rank_rows.py)
        self._open: dict[tuple[Any, ...], VerdictSpan] = {}
        self._last: dict[tuple[Any, ...], VerdictSpan] = {}  # each verdict's latest span
        self._count: dict[tuple[Any, ...], int] = {}  # spans listed per verdict
        self._subjects: dict[str, int] = {}  # code -> subjects listed (MAX_SUBJECTS_PER_CODE)
        self._unlisted: dict[str, int] = {}  # code -> samples it held for subjects beyond them
        self._unlisted_at: dict[str, float] = {}  # ...and the latest of them
        self._spans: list[VerdictSpan] = []
        self._events: dict[tuple[Any, ...], Event] = {}
        self._active: set[tuple[Any, ...]] = set()  # the events held at the latest sample
        self.samples = 0
        self.start: float | None = None
        self.end: float | None = None
        self.verdicts: tuple[Verdict, ...] = ()
        self._balance: Balance | None = None
        self._rank_stats: dict[tuple[int | None, int], RankStats] = {}
        self._warming: float | None = None
        self._judged: tuple[Verdict, ...] = ()
        self.book = JobBook(th)  # the job's data, numerics and resources (GD940-GD949)

    def add(self, s: Sample) -> tuple[Verdict, ...]:
        self.samples += 1
        self.start = s.t if self.start is None else self.start
        self.end = s.t
        gpus = self._gpus
        for g in s.gpus:
            st = gpus.get(g.index)
            if st is None:
                st = gpus[g.index] = _GpuStats(name=g.name)
            elif g.name:
                st.name = g.name
            alive = g.state != LOST
            if not alive:
                st.lost = True
            if g.xids:
                st.xids.update(g.xids)
            u = g.util
            if alive and u is not None:
                st.n += 1
                st.util_sum += u
                st.hist[max(0, min(100, int(u)))] += 1
            if alive and g.mem_used is not None:
                st.mem_n += 1
                st.mem_sum += g.mem_used
                st.mem_peak = max(st.mem_peak, g.mem_used)
                st.mem_total = g.mem_total or st.mem_total
        self.add_ranks(s.ranks or ())
        self._window.add(s)
        self._rank_stats = rank_stats(self._window, self.th) if self._window.ranks else {}
        verdicts, self._warming = judge(self._window, self.th, s.t - self.start, self._rank_stats)
        self._balance = None
        self._judged = tuple(verdicts)  # the balance's own (the job's verdicts are beside them)
        self.book.add(s)
        stalled = any(v.code == STEPS_STALLED.code for v in verdicts)
        self.verdicts = (*self._book_verdicts(), *job_verdicts(self._window, self.th, stalled))
        self._track(s.t)
        return self.verdicts

    @property
    def balance(self) -> Balance:
        """The latest window's numbers and verdicts (analysis.analyze's), made on first read."""
        if self._balance is None:
            self._balance = balance(self._window, self.th, self._judged, self._warming, self._rank_stats)
        return self._balance

    def _book_verdicts(self) -> tuple[Verdict, ...]:
        """The balance's verdicts (GD910's advice counted against the CPUs) and the job's data verdicts."""
        return self.book.verdicts(self._window, self._judged, self._warming, self._rank_stats)

    def conclude(self, verdicts: Iterable[Verdict], t: float) -> None:
        """Verdicts known only once the job ended (how it ended: a failed rank, uneven steps), as of `t`."""
        found = tuple(verdicts)
        if not found:
            return
        self.start = t if self.start is None else self.start
        self.end = t if self.end is None else max(self.end, t)
        self.verdicts = found
        self._track(t)

    def add_late_data(self, readings: Iterable[DataReading]) -> None:
        """What the ranks sent as the job ended, after the last sample: judged at the last sample's time."""
        self.book.add_data(readings)
        if self.end is None:
            return
        verdicts = self._book_verdicts()
        if {v.key for v in verdicts} - {v.key for v in self.verdicts}:
            self.verdicts = verdicts
            self._track(self.end)

    def add_end(self, end: Sample) -> None:
        """A recording's last line (Sample.end): the steps and data its job sent as it ended."""
        self.add_ranks(end.ranks or ())
        self.add_late_data(end.data or ())

    def add_ranks(self, ranks: Iterable[RankReading]) -> None:
        """Count steps into the per-rank totals (each sample's, and the last ones a job sent as it ended)."""
        self._ranks.add(ranks)

    @property
    def unlisted(self) -> dict[str, int]:
        """Code -> samples in which it held for subjects beyond the MAX_SUBJECTS_PER_CODE it lists."""
        return self._unlisted

    @property
    def held_ranks(self) -> int:
        """The rank rows held now (at most MAX_RANKS, whatever the run showed)."""
        return len(self._ranks.rows)

    def _track(self, t: float) -> None:
        current = {v.key: v for v in self.verdicts}
        self._widen(current)
        beyond = set()
        for key in [k for k in current if k not in self._last]:  # a subject never seen: listed while there is room
            code = key[0]
            listed = self._subjects.get(code, 0)
            if listed >= MAX_SUBJECTS_PER_CODE:
                del current[key]
                beyond.add(code)
            else:
                self._subjects[code] = listed + 1
        for code in beyond:  # samples, not subjects; once at a time (the job's late data is judged at the last)
            if self._unlisted_at.get(code) != t:
                self._unlisted_at[code] = t
                self._unlisted[code] = self._unlisted.get(code, 0) + 1
        for key in list(self._open):
            if key not in current:
                del self._open[key]  # the span ended at its last sample
        for key, v in current.items():
            span = self._open.get(key)
            event = self._events.get(key)
            if span is None:
                span = self._last.get(key)
                if span is not None and t - span.end <= self.th.window_s:
                    pass  # back within a window: the same trouble, the same span
                elif span is not None and self._count[key] >= MAX_SPANS_PER_VERDICT:
                    span.more += 1  # flapping for the whole run: fold into the last listed span
                    event.times += 1  # type: ignore[union-attr]
                else:
                    span = VerdictSpan(v, t, t, samples=0)
                    self._spans.append(span)
                    self._last[key] = span
                    self._count[key] = self._count.get(key, 0) + 1
                    if event is None:
                        event = self._events[key] = Event(span, t, t, 0, 0, None)
                    event.times += 1
                self._open[key] = span
            span.end = t
            span.samples += 1
            span.observe(v)
            event = self._events[key]
            event.span, event.last = span, t
            event.samples += 1
            f = v.figure
            if f is not None and f.span == "elapsed" and span.value is not None:
                event.worst = max(event.worst or 0.0, span.value)  # a duration: the longest span
            else:
                event.worst = _worse(v, event.worst)
        for key in self._active - current.keys():  # the held ones only: a long run has many events
            self._events[key].active = False
        for key in current:
            self._events[key].active = True
        self._active = set(current)

    def _widen(self, current: dict[tuple[Any, ...], Verdict]) -> None:
        """A verdict that comes to name more ranks (a data verdict, as more ranks reach the epoch that shows
        it), or fewer (a stall whose ranks behind change), in place of the one it was, goes on in the span
        it is in, not as a second span (and a second subject) of the same trouble. Only a span whose key
        no longer holds is carried on; grouped by code and GPUs, and a group whose ranks are as many as the
        new verdict's is passed over at once (one rank each: GD909's), so a sample costs what ended in it."""
        new = current.keys() - self._open.keys()
        if not new:
            return
        gone: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        sizes: dict[tuple[Any, ...], set[int]] = {}
        for k in self._open:
            if k[2] and k not in current:
                gone.setdefault(k[:2], []).append(k)
                sizes.setdefault(k[:2], set()).add(len(k[2]))
        if not gone:
            return
        for key in new:
            code, gpus, ranks = key
            group = gone.get((code, gpus))
            if not ranks or group is None or sizes[code, gpus] == {len(ranks)}:
                continue
            mine = set(ranks)
            old = next((k for k in group if k in self._open and (set(k[2]) < mine or set(k[2]) > mine)), None)
            if old is None:
                continue
            self._open[key] = self._open.pop(old)
            self._last[key] = self._last.pop(old)
            self._count[key] = self._count.pop(old)
            self._events[key] = self._events.pop(old)
            self._active.discard(old)

    def events(self) -> list[Event]:
        """Every verdict that fired, per code and subject: held ones first, then the most recent."""
        return sorted(
            self._events.values(), key=lambda e: (not e.active, -SEVERITY.get(e.verdict.severity, 0), -e.last)
        )

    def summary(self, *, damage: str | None = None, exit_code: int | None = None) -> Summary:
        return Summary(
            self.source,
            self.samples,
            self.start,
            self.end,
            dict(self._gpus),
            list(self._spans),
            damage,
            exit_code,
            {(rs.rank, rs.pid): rs for rs in self._ranks.rows.values()},
            self.th.warmup,
            self.th.idle_util,
            job=self.book.to_json(),
            earlier=self._ranks.earlier,
            unlisted=dict(self._unlisted),
        )

    @property
    def gpu_stats(self) -> dict[int, _GpuStats]:
        return self._gpus


def unlisted_text(code: str, samples: int) -> str:
    """What a code held beyond the subjects it lists, in one line: the summary's and the dashboard's."""
    return (
        f"{code} also held in {plural(samples, 'sample')} for GPUs or ranks beyond the "
        f"{MAX_SUBJECTS_PER_CODE} it lists (not listed)"
    )


def _worse(v: Verdict, worst: float | None) -> float | None:
    if v.figure is None:
        return worst
    if worst is None:
        return v.figure.value
    return (max if v.figure.higher_is_worse else min)(worst, v.figure.value)


def summarize(samples: Iterable[Sample], source: str, th: Thresholds = DEFAULT, damage: str | None = None) -> Summary:
    builder = SummaryBuilder(source, th)
    for s in samples:
        builder.add(s)
    return builder.summary(damage=damage)


PROGRESS_EVERY = 1024  # samples between two calls of `progress` (a heuristic: ~0.5 s of reading at 8 GPUs)


def summarize_recording(
    path: str, th: Thresholds = DEFAULT, progress: Callable[[float], None] | None = None
) -> Summary:
    """`gpudoctor report FILE`: the recording is read as a stream, never held in memory whole. `progress` is
    told the share of the file read (0 to 1) every PROGRESS_EVERY samples (a day of 8 GPUs: most of a minute)."""
    with RecordingStream(path) as stream:
        made = stream.header.get("source")
        synthetic = isinstance(made, str) and made.startswith("synthetic")  # a test recording
        builder = SummaryBuilder(f"{path}, {printable(made)[:40]}: made-up readings" if synthetic else path, th)
        for n, s in enumerate(stream, 1):
            builder.add(s)
            if progress is not None and not n % PROGRESS_EVERY:
                progress(stream.read_share())
        if stream.end is not None:
            builder.add_end(stream.end)
        summary = builder.summary()
    summary.damage = stream.damage
    summary.unreadable = stream.bad_input
    return summary


def _subject(sp: VerdictSpan) -> str:
    return sp.verdict.subject


def _step_and_wait(doc: dict[str, Any]) -> tuple[str, str]:
    """A rank row's mean step and input wait share, as the summary's table shows them."""
    step = f"{doc['mean_step_ms']:.0f} ms" if doc["mean_step_ms"] is not None else "n/a"
    wait = f"{100 * doc['wait_share']:.0f}%" if doc["wait_share"] is not None else "n/a"
    return step, wait


def render_text(summary: Summary) -> str:
    what = [plural(len(summary.gpus), "GPU") if summary.gpus else "no GPU"]
    if summary.ranks:
        held = plural(len(summary.ranks), "rank")
        what.append(held + (f" (and {plural(summary.earlier.rows, 'earlier rank row')})" if summary.earlier else ""))
    lines = [
        f"gpudoctor watch summary: {', '.join(what)}, {plural(summary.samples, 'sample')} over "
        f"{clock(summary.duration_s)} ({summary.source})"
    ]
    if summary.damage:
        lines.append(f"note: {summary.damage}")
    if summary.earlier is not None:
        lines.append(f"note: {summary.earlier.note}")
    if summary.exit_code is not None:
        failed = summary.failure.get("line") if summary.failure else None
        lines.append(f"command exit code: {summary.exit_code}" + (f" ({failed})" if failed else ""))
    if summary.gpus:
        lines.append("")
        lines.append(f"{'GPU':>3}  {'name':<26} {'mean util':>9} {'low util':>9} {'mean mem':>10} {'peak mem':>10}")
        for idx, g in sorted(summary.gpus.items()):
            mean = f"{g.util_sum / g.n:.0f}%" if g.n else "n/a"
            low = f"{g.low()}%" if g.n else "n/a"
            mem = f"{g.mem_sum / g.mem_n / 1024:.1f} GiB" if g.mem_n else "n/a"
            peak = f"{g.mem_peak / 1024:.1f} GiB" if g.mem_n else "n/a"
            name = (g.name or "?")[:26]
            marks = (" (lost)" if g.lost else "") + (f" XID {','.join(map(str, sorted(g.xids)))}" if g.xids else "")
            lines.append(f"{idx:>3}  {name:<26} {mean:>9} {low:>9} {mem:>10} {peak:>10}{marks}")
    if summary.ranks:
        lines.append("")
        lines.append(f"{'rank':>5}  {'PID':>8} {'steps':>7} {'mean step':>10} {'input wait':>10}")
        for _, r in sorted(summary.ranks.items(), key=lambda kv: _rank_order(kv[0])):
            step, wait = _step_and_wait(r.to_json())
            rank = "?" if r.rank is None else str(r.rank)
            more = f"  ({r.processes} processes, the latest shown)" if r.processes > 1 else ""
            lines.append(f"{rank:>5}  {r.pid:>8} {r.steps:>7} {step:>10} {wait:>10}{more}")
        if summary.earlier is not None:
            doc = summary.earlier.to_json()
            step, wait = _step_and_wait(doc)
            label = f"earlier ({plural(summary.earlier.rows, 'rank row')})"
            lines.append(f"{'...':>5}  {'':>8} {doc['steps']:>7} {step:>10} {wait:>10}  {label}")
    elif not summary.gpus:
        lines.append("")
        lines.append("no GPU and no step records: nothing was measured")
    score = summary.balance_score
    if summary.gpus:
        lines.append("")
        if summary.idle:
            lines.append(f"balance score: n/a (every GPU stayed below {summary.idle_util:.0f}% utilization: idle)")
        elif score is not None:
            lines.append(f"balance score: {score}/100 (the least busy GPU's utilization relative to the busiest)")
        else:
            lines.append("balance score: n/a (needs two GPUs with utilization readings)")
    lines.append("")
    if not summary.spans:
        if summary.idle:
            lines.append("verdicts: none, and nothing to judge: the GPUs were idle (no work ran on them)")
        elif summary.duration_s < summary.warmup_s:  # nothing was judged: no claim of balance
            lines.append(
                f"verdicts: none yet: balance is judged after a {summary.warmup_s:.0f} s warm-up "
                f"and this run lasted {summary.duration_s:.0f} s"
            )
        elif summary.gpus:
            lines.append("verdicts: none (the GPUs stayed balanced)")
        else:
            lines.append("verdicts: none")
        lines += [f"  seen: {line}" for line in seen(summary.job)]
    else:
        lines.append("verdicts:")
        start = summary.start or 0.0
        for sp in summary.spans:
            v = sp.verdict
            when = f"{clock(sp.start - start)}-{clock(sp.end - start)}"
            lines.append(f"  {v.code} {v.name:<17} {when:<13} {sp.message}")
            worst = sp.worst_text
            if worst and v.figure is not None and v.figure.span == "mean" and sp.fig_n > 1:
                lines.append(f"  {'':<23}{'':<13} over the span; worst {worst}")
            if sp.more:
                lines.append(f"  {'':<23}{'':<13} +{plural(sp.more, 'more time')} in this span (it kept coming back)")
            lines.append(f"  {'':<23}{'':<13} hint: {v.hint} (gpudoctor explain {v.code})")
    lines += [f"  {unlisted_text(code, samples)}" for code, samples in sorted(summary.unlisted.items())]
    return "\n".join(lines) + "\n"
