"""The ranks' losses (gpudoctor.step(loss=...)): a loss that turns NaN/inf (GD945) and ranks whose losses
disagree beyond noise (GD946).

GD945 is kept over the whole run (the first non-finite loss of each rank, by loss number) and holds to
the end once found: a NaN does not heal by itself, and the first rank and step are the clue. GD946 is
judged over the window, like the balance verdicts, and waits for the warm-up: the first steps' losses
move fast and say nothing about the replicas.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from gpudoctor.watch import data_codes as codes
from gpudoctor.watch.analysis import Figure, RankRef, Verdict
from gpudoctor.watch.bounds import MAX_RANKS
from gpudoctor.watch.data_model import DataReading
from gpudoctor.watch.model import Sample
from gpudoctor.watch.thresholds import Thresholds
from gpudoctor.watch.window import Window, median_without


def _order(ref: RankRef) -> tuple[bool, int, int]:
    return (ref.rank is None, ref.rank or 0, ref.pid)


class LossBook:
    """Per rank over the run: how many losses, the last one, and the first that was not finite."""

    def __init__(self) -> None:
        self.first_bad: dict[RankRef, tuple[int, str]] = {}
        self.last: dict[RankRef, tuple[int, float | None]] = {}  # (loss number, value if finite)
        self.finite: dict[RankRef, int] = {}
        self.bad: dict[RankRef, int] = {}
        self.range: dict[RankRef, tuple[float, float]] = {}

    def add(self, readings: Iterable[DataReading]) -> None:
        for r in readings:
            loss = r.loss
            if loss is None:
                continue
            ref = RankRef(r.rank, r.pid)
            if ref not in self.finite and len(self.finite) >= MAX_RANKS:
                self._forget(next(iter(self.finite)))  # the earliest process: a job restarted past MAX_RANKS times
            self.finite[ref] = self.finite.get(ref, 0) + loss.n
            self.bad[ref] = self.bad.get(ref, 0) + loss.bad
            if loss.first_bad is not None and loss.bad_kind is not None:
                old = self.first_bad.get(ref)
                if old is None or loss.first_bad < old[0]:
                    self.first_bad[ref] = (loss.first_bad, loss.bad_kind)
            if loss.last >= self.last.get(ref, (0, None))[0]:
                self.last[ref] = (loss.last, loss.last_value)
            if loss.min is not None and loss.max is not None:
                lo, hi = self.range.get(ref, (loss.min, loss.max))
                self.range[ref] = (min(lo, loss.min), max(hi, loss.max))

    def _forget(self, ref: RankRef) -> None:
        """Past MAX_RANKS processes that sent losses, the earliest goes (its first NaN with it): held are
        the processes of the latest ranks, not all a long restarted job ever had."""
        self.first_bad.pop(ref, None)
        self.last.pop(ref, None)
        self.finite.pop(ref, None)
        self.bad.pop(ref, None)
        self.range.pop(ref, None)

    def not_finite(self) -> list[Verdict]:
        """GD945: the first rank (by loss number) whose loss was NaN or infinite, and those that followed."""
        if not self.first_bad:
            return []
        ordered = sorted(self.first_bad.items(), key=lambda kv: (kv[1][0], _order(kv[0])))
        first_step = ordered[0][1][0]
        firsts = [ref for ref, (k, _) in ordered if k == first_step]
        kind = ordered[0][1][1]
        what = "NaN" if kind == "nan" else kind.replace("inf", "infinite")
        who = " and ".join(r.label for r in firsts)
        first = "the first ranks" if len(firsts) > 1 else "the first rank"
        message = f"{who}'s loss became {what} at step {first_step} ({first})"
        later = [f"{ref.label} at step {k}" for ref, (k, _) in ordered if ref not in firsts]
        if later:
            message += f"; then {', '.join(later)}"
        hint = (
            f"Look at {firsts[0].label}'s batch at step {first_step} and at the learning rate and precision; "
            "torch.autograd.detect_anomaly() names the operation."
        )
        refs = tuple(sorted(self.first_bad, key=_order))
        return [Verdict(codes.LOSS_NOT_FINITE.code, codes.LOSS_NOT_FINITE.name, (), message, hint, "fail", ranks=refs)]

    def to_json(self) -> list[dict[str, object]]:
        out = []
        for ref in sorted(set(self.last) | set(self.first_bad), key=_order):
            k, value = self.last.get(ref, (0, None))
            lo, hi = self.range.get(ref, (None, None))
            first = self.first_bad.get(ref)
            out.append(
                {
                    "rank": ref.rank,
                    "pid": ref.pid,
                    "losses": self.finite.get(ref, 0) + self.bad.get(ref, 0),
                    "not_finite": self.bad.get(ref, 0),
                    "last_step": k,
                    "last": value,
                    "min": lo,
                    "max": hi,
                    "first_not_finite": None if first is None else {"step": first[0], "kind": first[1]},
                }
            )
        return out


def divergence(win: Sequence[Sample], th: Thresholds) -> list[Verdict]:
    """GD946: a rank whose loss stays on one side of the other ranks' median, far from it.

    Compared interval by interval (each sample's mean loss per rank), so the trend all ranks share as they
    train cancels out: a rank is named when its interval mean lies on the same side of the others' median
    in `loss_side_share` of the intervals (a sign test: by chance, 9 of 10 or more on one side is 2%) and
    its mean over the window is `loss_gap_share` of the larger away from the others' median."""
    if isinstance(win, Window) and not win.losses:
        return []  # no rank gave a loss in the window (the window keeps the count): nothing to read
    series: dict[RankRef, dict[float, float]] = {}  # rank -> sample time -> its interval mean
    counts: dict[RankRef, int] = {}
    for s in win:
        for r in s.data or ():
            loss = r.loss
            if loss is None or not loss.n or loss.sum is None:
                continue
            ref = RankRef(r.rank, r.pid)
            series.setdefault(ref, {})[s.t] = loss.sum / loss.n
            counts[ref] = counts.get(ref, 0) + loss.n
    ready = {ref: ms for ref, ms in series.items() if counts[ref] >= th.loss_min_steps}
    if len(ready) < 2:
        return []
    means = {ref: statistics.mean(ms.values()) for ref, ms in ready.items()}
    # The others' median at each time and over the window, from one sorted list each: O(ranks log ranks) a
    # time, not a scan of every other rank per rank (ranks squared: 0.8 s a sample at 256 ranks).
    at: dict[float, list[float]] = {}
    for ms in ready.values():
        for t, m in ms.items():
            at.setdefault(t, []).append(m)
    for values in at.values():
        values.sort()
    all_means = sorted(means.values())
    odd = []
    for ref, ms in ready.items():
        sides = [m - median_without(at[t], m) for t, m in ms.items() if len(at[t]) >= 2]
        if len(sides) < th.loss_min_intervals:
            continue
        median = median_without(all_means, means[ref])
        gap, larger = means[ref] - median, max(abs(means[ref]), abs(median))
        same_side = sum(1 for d in sides if d * gap > 0) / len(sides)
        if larger > 0 and abs(gap) >= th.loss_gap_share * larger and same_side >= th.loss_side_share:
            odd.append((ref, means[ref], median, abs(gap) / larger))
    if not odd:
        return []
    if len(ready) == 2:  # two ranks: neither is "the odd one", both are named
        a, b = sorted(ready, key=_order)
        ma, mb = means[a], means[b]
        share = abs(ma - mb) / max(abs(ma), abs(mb))
        template = f"{a.label} and {b.label} disagree: mean loss {ma:.4g} vs {mb:.4g} over the window, {{}}% apart"
        refs: tuple[RankRef, ...] = (a, b)
    else:
        ref, mean, median, share = max(odd, key=lambda x: x[3])
        template = f"{ref.label}'s mean loss is {mean:.4g}, the other ranks' {median:.4g} (median): {{}}% apart"
        refs = tuple(sorted((x[0] for x in odd), key=_order))
    figure = Figure(100 * share, template, unit="% apart")
    hint = "The replicas differ: parameters changed after DDP wrapping, unsynchronized buffers, or per-rank data."
    return [
        Verdict(
            codes.LOSS_DIVERGES.code,
            codes.LOSS_DIVERGES.name,
            (),
            figure.message(figure.value),
            hint,
            figure=figure,
            ranks=refs,
        )
    ]
