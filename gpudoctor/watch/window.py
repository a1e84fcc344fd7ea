"""The analysis window as running totals: what enters is added, what leaves is subtracted.

`watch` judges the samples of the last `window_s` seconds after every sample. Recomputing each
verdict over the whole window cost window length x GPUs per sample, and the "without this one"
medians a sort per member (issue 22: 61 ms a sample at 256 GPUs). Here a sample costs its own GPUs
and ranks when it enters and again when it leaves, whatever the window's length; the order
statistics of one sample (the others' median) come from one sorted list, O(1) per member.

`Window` is also the sequence of its samples (oldest first), so a verdict that wants the samples
themselves can still read them, and `analysis` builds one over any list it is given.

Sums of floats are kept exactly, as whole multiples of 2**-1074 (the smallest float: every finite
float is one), so a value taken out leaves the very total there was before it came in: a long
run's figures never drift, and a window's figures do not depend on what came before it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from typing import Any, overload

from gpudoctor.knowledge import clock_reasons
from gpudoctor.watch.bounds import MAX_RANKS
from gpudoctor.watch.model import RankReading, Sample
from gpudoctor.watch.thresholds import Thresholds

# GD905 holds the hot GPU (thermal slowdown) and HW_SLOWDOWN, which the hardware engages for
# heat among other causes; GD906 the power cap and the power brake (clock_reasons' classes).
THERMAL_THROTTLE_BITS = clock_reasons.THERMAL_BITS | clock_reasons.HARDWARE_BITS
POWER_THROTTLE_BITS = clock_reasons.POWER_BITS
_JUDGED_BITS = THERMAL_THROTTLE_BITS | POWER_THROTTLE_BITS

_SCALE = 1074  # 2**-1074 is the smallest positive float: every finite float is a whole multiple of it


def exact(value: float) -> int:
    """`value` as a whole number of 2**-1074 (exact: no rounding)."""
    if type(value) is int:
        return value << _SCALE
    numerator, denominator = float(value).as_integer_ratio()
    return numerator << (_SCALE + 1 - denominator.bit_length())  # the denominator is a power of two


def exact_mean(total: int, count: int) -> float:
    """The mean of `count` values whose exact() sum is `total`, correctly rounded."""
    return total / (count << _SCALE)


def share_of(part: int, whole: int) -> float:
    """part / whole of two exact sums, at most 1 (correctly rounded). Compared first: a whole of a few
    2**-1074 (a recorded step of 1e-320 s) under a part of seconds would overflow a float's division."""
    return 1.0 if part >= whole else part / whole


def median_sorted(ordered: Sequence[float]) -> float:
    """statistics.median of a non-empty sorted list, without sorting it again: O(1)."""
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def median_without(ordered: Sequence[float], value: float) -> float:
    """statistics.median of a sorted list with one occurrence of `value` left out (the others'
    median), without copying it: O(log n)."""
    i = bisect_left(ordered, value)
    rest = len(ordered) - 1
    half = rest // 2
    lo = ordered[half - 1 if half - 1 < i else half]
    hi = ordered[half if half < i else half + 1]
    return hi if rest % 2 else (lo + hi) / 2


def _twice_median_without(ordered: list[int], value: int) -> int:
    """2 x the others' median of whole numbers (itself whole: straggler gaps stay integers)."""
    i = bisect_left(ordered, value)
    rest = len(ordered) - 1
    half = rest // 2
    hi = ordered[half if half < i else half + 1]
    if rest % 2:
        return 2 * hi
    return ordered[half - 1 if half - 1 < i else half] + hi


class GpuTotals:
    """One GPU over the window."""

    __slots__ = (
        "index",
        "present",
        "alive",
        "util_n",
        "util_sum",
        "mem_n",
        "mem_sum",
        "total",
        "total_at",
        "gap_n",
        "gap2_sum",
        "low",
        "high",
        "thermal",
        "power",
        "bits",
        "xids",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.present = 0  # samples that have it
        self.alive = 0  # ...not lost
        self.util_n = self.util_sum = 0
        self.mem_n = self.mem_sum = 0
        self.total: int | None = None  # memory total of the latest sample in the window that gave one
        self.total_at = -1  # that sample's number
        self.gap_n = self.gap2_sum = 0  # straggler gaps (x 2: whole numbers) in samples of 3+ GPUs
        self.low = self.high = 0  # samples where the gap was a straggler's, below or above
        self.thermal = self.power = 0  # samples with a thermal / power throttle reason set
        self.bits: dict[int, int] = {}  # throttle reason bit (of the judged kinds) -> samples
        self.xids: dict[int, int] = {}  # XID -> samples that reported it


class RankTotals:
    """One training rank over the window, from its step records."""

    __slots__ = (
        "key",
        "readings",
        "steps",
        "timed",
        "step_sum",
        "waited",
        "wait_sum",
        "waited_step_sum",
        "last",
        "late",
        "ends",
    )

    def __init__(self, key: tuple[int | None, int]) -> None:
        self.key = key
        self.readings = 0
        self.steps = 0
        self.timed = 0  # steps with a step time
        self.step_sum = 0  # exact sum of their step times
        self.waited = 0  # steps with an input wait
        self.wait_sum = 0
        self.waited_step_sum = 0  # exact sum of their step times (the share's whole: not every step's)
        self.last: RankReading | None = None  # the latest reading in the window
        self.late = [0, 0, 0]  # lateness entries: count, exact sum, how many late (> 0)
        self.ends: deque[tuple[int, float]] = deque()  # (last step, its end) of readings that had both


# What one sample holds, as added (and taken out again when it leaves):
# per GPU (totals, alive, util, mem_used, thermal, power, judged throttle bits, xids);
_GpuPart = tuple[GpuTotals, bool, "int | None", "int | None", bool, bool, int, tuple[int, ...]]
# per rank (totals, steps, timed steps, exact step time sum, waited steps, exact wait sum, exact step time
# sum of the waited steps, (step, end));
_RankPart = tuple[RankTotals, int, int, int, int, int, int, "tuple[int, float] | None"]
# per rank judged late (totals, exact lateness, late at all).
_LatePart = tuple[RankTotals, int, bool]


class _Entry:
    __slots__ = ("seq", "gpus", "spread", "dip", "dip_cpu", "gaps", "ranks", "lates", "loaders", "losses")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.gpus: list[_GpuPart] = []
        self.spread: int | None = None  # max - min utilization (2+ GPUs reading it)
        self.dip = False  # every GPU below starve_util
        self.dip_cpu: int | None = None  # exact host CPU during a dip
        self.gaps: list[tuple[GpuTotals, int]] = []  # straggler gaps x 2 (3+ GPUs reading utilization)
        self.ranks: list[_RankPart] = []
        self.lates: list[_LatePart] = []
        self.loaders: list[tuple[tuple[int | None, int], int]] = []  # (rank key, exact time in next(loader))
        self.losses = 0  # data readings with losses (GD946 reads the window's samples only when there are)


class Window(Sequence[Sample]):
    """The samples of the last `span` seconds (all that were added, for None) and their totals.

    Built for one set of thresholds (what counts as a straggler's gap, a dip, a spinning GPU).
    """

    def __init__(self, th: Thresholds, span: float | None = None) -> None:
        self.th = th
        self.span = span
        self._samples: deque[Sample] = deque()
        self._entries: deque[_Entry] = deque()
        self._seq = 0  # the number of the next sample
        self.gpus: dict[int, GpuTotals] = {}  # in the order they came
        # The ranks in the window, the least recently seen first; at most MAX_RANKS (a line's bound): a
        # recording whose ranks change line to line costs a sample its own ranks, not window x line ranks.
        self.ranks: OrderedDict[tuple[int | None, int], RankTotals] = OrderedDict()
        # Per rank that wraps its loader (gpudoctor.watch_loader): [readings, exact time inside next(loader)].
        self.loader: dict[tuple[int | None, int], list[int]] = {}
        self.losses = 0  # data readings in the window that gave losses
        self.counted = 0  # samples with 3+ GPUs reading utilization (a straggler has a meaning)
        self.spread_n = self.spread_sum = 0  # max - min utilization, samples with 2+ such GPUs
        self.dips = 0  # samples where every GPU was below starve_util
        self.dip_cpu_n = self.dip_cpu_sum = 0  # host CPU during the dips (exact sum)
        # Not sums: the state a sample leaves for the next.
        self.spin: dict[int, float] = {}  # GPU -> when its current spin (busy on idle power) began
        self._prev: dict[tuple[int | None, int], tuple[int, float]] = {}  # each rank's last (step, end)
        self._done: int | None = None  # the common step judged last
        self._gap2 = 2 * th.straggler_gap
        # The ranks whose totals the latest add() changed (entered, left, late, loader): their per-rank
        # figures are made again, the others' kept (analysis.rank_stats), so a sample costs its own ranks
        # and those leaving, not every rank in the window (a job whose processes churn holds thousands).
        self.touched: set[tuple[int | None, int]] = set()
        self.stats: dict[tuple[int | None, int], Any] = {}  # analysis.rank_stats' per-rank figures, kept
        self.stats_seq = -1  # the sample they are of

    @classmethod
    def of(cls, samples: Sequence[Sample], th: Thresholds) -> Window:
        """All of `samples` as one window."""
        if isinstance(samples, Window) and (samples.th is th or samples.th == th):
            return samples
        w = cls(th)
        for s in samples:
            w.add(s)
        return w

    @property
    def seq(self) -> int:
        """How many samples were ever added (the number the next one gets)."""
        return self._seq

    # The samples, as a sequence.
    def __len__(self) -> int:
        return len(self._samples)

    @overload
    def __getitem__(self, i: int) -> Sample: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Sample]: ...
    def __getitem__(self, i: Any) -> Any:
        return list(self._samples)[i] if isinstance(i, slice) else self._samples[i]

    def __iter__(self) -> Iterator[Sample]:
        return iter(self._samples)

    def __reversed__(self) -> Iterator[Sample]:
        return reversed(self._samples)

    def add(self, s: Sample) -> None:
        """`s` enters (it is the latest); samples older than the span leave."""
        entry = _Entry(self._seq)
        self._seq += 1
        self.touched = set()
        self._gpu_parts(s, entry)
        self._rank_parts(s, entry)
        self._samples.append(s)
        self._entries.append(entry)
        self._apply(entry, 1)
        if self.span is not None:
            while s.t - self._samples[0].t > self.span:
                self._samples.popleft()
                self._apply(self._entries.popleft(), -1)

    def _gpu_parts(self, s: Sample, entry: _Entry) -> None:
        """What sample `s` adds per GPU; what only the entering sample updates (the latest memory total,
        the spin streaks)."""
        th = self.th
        spin, spinning = self.spin, {}
        gpus = self.gpus
        parts = entry.gpus
        lo = hi = None
        utils: list[tuple[GpuTotals, int]] = []
        for g in s.gpus:
            acc = gpus.get(g.index)
            if acc is None:
                acc = gpus[g.index] = GpuTotals(g.index)
            u = g.util
            if u is not None and u >= th.hung_util and g.power is not None:
                idle = th.hung_power_share * g.power_limit if g.power_limit else th.hung_idle_w
                if g.power <= idle:
                    spinning[g.index] = spin.get(g.index, s.t)
            alive = g.state != "lost"
            if alive:
                if u is not None:
                    utils.append((acc, u))
                    if lo is None or u < lo:
                        lo = u
                    if hi is None or u > hi:
                        hi = u
                if g.mem_used is not None and g.mem_total:
                    acc.total, acc.total_at = g.mem_total, entry.seq
            mask = g.throttle or 0
            parts.append(
                (
                    acc,
                    alive,
                    u if alive else None,
                    g.mem_used if alive else None,
                    bool(mask & THERMAL_THROTTLE_BITS),
                    bool(mask & POWER_THROTTLE_BITS),
                    mask & _JUDGED_BITS,
                    g.xids,
                )
            )
        self.spin = spinning
        if len(utils) >= 2:
            entry.spread = hi - lo  # type: ignore[operator]
        if utils and hi < th.starve_util:  # type: ignore[operator]
            entry.dip = True
            if s.cpu is not None:
                entry.dip_cpu = exact(s.cpu)
        if len(utils) >= 3:  # with two GPUs "the odd one out" has no meaning
            ordered = sorted(u for _, u in utils)
            entry.gaps = [(acc, 2 * u - _twice_median_without(ordered, u)) for acc, u in utils]

    def _rank_parts(self, s: Sample, entry: _Entry) -> None:
        ranks = self.ranks
        parts = entry.ranks
        for r in s.ranks or ():
            key = (r.rank, r.pid)
            acc = ranks.get(key)
            if acc is None:
                acc = ranks[key] = RankTotals(key)
            else:
                ranks.move_to_end(key)
            acc.last = r
            n = r.steps
            timed = n if n and r.step_s is not None else 0
            waited, wait, waited_step = r.wait_totals()
            step_x = exact(r.step_s * n) if timed else 0  # type: ignore[operator]
            end = (r.last_step, r.last_end) if r.last_step is not None and r.last_end is not None else None
            parts.append((acc, n, timed, step_x, waited, exact(wait), exact(waited_step), end))
        # Ranks that change sample to sample: the least recently seen go, never one of this sample's (they
        # are all at the end by now; a sample holds at most MAX_RANKS, but one built in code may hold more).
        # A rank that goes leaves its entries counting into its orphaned totals, unread.
        for _ in range(len(ranks) - max(MAX_RANKS, len(parts))):
            old, _ = ranks.popitem(last=False)
            self._prev.pop(old, None)
            self.touched.add(old)
        entry.lates = self._lateness(s)
        entry.losses = sum(1 for d in s.data or () if d.loss is not None and d.loss.n and d.loss.sum is not None)
        entry.loaders = [(d.key, exact(d.loader.s)) for d in s.data or () if d.loader is not None and d.loader.batches]

    def _apply(self, e: _Entry, sign: int) -> None:
        """Add (sign 1) or take out (-1) what entry `e` holds."""
        gpus = self.gpus
        for acc, alive, u, mem, thermal, power, judged, xids in e.gpus:
            acc.present += sign
            if alive:
                acc.alive += sign
                if u is not None:
                    acc.util_n += sign
                    acc.util_sum += sign * u
                if mem is not None:
                    acc.mem_n += sign
                    acc.mem_sum += sign * mem
            if thermal:
                acc.thermal += sign
            if power:
                acc.power += sign
            while judged:
                bit = judged & -judged
                judged ^= bit
                acc.bits[bit] = left = acc.bits.get(bit, 0) + sign
                if not left:
                    del acc.bits[bit]
            for x in xids:
                acc.xids[x] = left = acc.xids.get(x, 0) + sign
                if not left:
                    del acc.xids[x]
            if sign < 0:
                if not acc.present:
                    if gpus.get(acc.index) is acc:
                        del gpus[acc.index]  # back in the order it comes again
                elif acc.total_at == e.seq:
                    acc.total = None  # no later sample in the window gave a total
        if e.spread is not None:
            self.spread_n += sign
            self.spread_sum += sign * e.spread
        if e.dip:
            self.dips += sign
            if e.dip_cpu is not None:
                self.dip_cpu_n += sign
                self.dip_cpu_sum += sign * e.dip_cpu
        if e.gaps:
            self.counted += sign
            gap2 = self._gap2
            for acc, g2 in e.gaps:
                acc.gap_n += sign
                acc.gap2_sum += sign * g2
                if g2 <= -gap2:
                    acc.low += sign
                elif g2 >= gap2:
                    acc.high += sign
        touched = self.touched
        for acc, n, timed, step_x, waited, wait_x, waited_step_x, end in e.ranks:
            touched.add(acc.key)
            if end is not None:  # readings leave in the order they came: the oldest is this one
                acc.ends.append(end) if sign > 0 else acc.ends.popleft()
            acc.readings += sign
            acc.steps += sign * n
            if timed:
                acc.timed += sign * timed
                acc.step_sum += sign * step_x
            if waited:
                acc.waited += sign * waited
                acc.wait_sum += sign * wait_x
                acc.waited_step_sum += sign * waited_step_x
        self.losses += sign * e.losses
        loader = self.loader
        for key, x in e.loaders:
            touched.add(key)
            held = loader.get(key)
            if held is None:
                held = loader[key] = [0, 0]
            held[0] += sign
            held[1] += sign * x
            if not held[0]:
                del loader[key]
        for acc, late, behind in e.lates:
            touched.add(acc.key)
            entry = acc.late
            entry[0] += sign
            entry[1] += sign * late
            entry[2] += sign * behind
        if sign < 0:
            for acc, *_ in e.ranks:
                if not acc.readings and self.ranks.get(acc.key) is acc:
                    del self.ranks[acc.key]
                    self._prev.pop(acc.key, None)

    def _lateness(self, s: Sample) -> list[_LatePart]:
        """For a sample where the ranks moved on: how long after the others' median each rank ended
        the latest step that every rank had finished (each rank's end of it interpolated between its
        last two reports). O(ranks).

        Ranks that synchronize every step (DDP) leave each collective together, so their step *times*
        agree; the one that keeps the others waiting is the one that reaches the end of its steps late."""
        cur = {
            (r.rank, r.pid): (r.last_step, r.last_end)
            for r in s.ranks or ()
            if r.last_step is not None and r.last_end is not None
        }
        out: list[_LatePart] = []
        if len(cur) >= 2:
            common = min(n for n, _ in cur.values())
            ends = {}
            prev = self._prev
            for key, (n1, t1) in cur.items():
                p = prev.get(key)
                if n1 == common:
                    ends[key] = t1
                elif p is not None and p[0] <= common < n1:
                    ends[key] = p[1] + (t1 - p[1]) * (common - p[0]) / (n1 - p[0])
            if len(ends) >= 2 and common != self._done:
                self._done = common
                ordered = sorted(ends.values())
                ranks = self.ranks
                for key, t in ends.items():
                    late = t - median_without(ordered, t)
                    out.append((ranks[key], exact(late), late > 0))
        self._prev.update(cur)  # type: ignore[arg-type]
        return out
