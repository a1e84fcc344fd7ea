"""Balance analysis: pure functions from a window of samples to numbers and verdicts.

Nothing here reads NVML or draws: the dashboard, the headless mode and the summary all
call `analyze(window)` with the samples of the last `window_s` seconds. Each function reads the
window's running totals (`gpudoctor.watch.window.Window`): given a `Window` that a caller keeps
up to date sample by sample, a verdict costs the GPUs and ranks of one sample, not the window's
length; given a plain list of samples, the totals are built from it first.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from gpudoctor.knowledge import clock_reasons
from gpudoctor.knowledge.units import gpu_list
from gpudoctor.knowledge.xid import classify, contained, describe
from gpudoctor.watch import codes
from gpudoctor.watch.loader_time import loader_share
from gpudoctor.watch.model import LOST, Sample, plural
from gpudoctor.watch.thresholds import DEFAULT, Thresholds
from gpudoctor.watch.window import (
    POWER_THROTTLE_BITS,
    THERMAL_THROTTLE_BITS,
    RankTotals,
    Window,
    exact_mean,
    median_sorted,
    median_without,
    share_of,
)

# What GD907 says per XID class (gpudoctor.knowledge.xid.classify, the same classes as `gpudoctor check`).
# A hardware XID the driver contained (63 row remap, 94 contained ECC) warns, as in GD810.
XID_HINTS = {
    "hardware": "Hardware XID: drain the node and run `gpudoctor check`.",
    "contained": "The driver contained it (row remapped, or only the context that hit the ECC error "
    "stopped): the job may go on; run `gpudoctor check` after it, and plan an RMA if these keep coming.",
    "application": "Application fault: rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel.",
    "other": "Look the XID up in NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors).",
}


@dataclass(frozen=True)
class Figure:
    """A verdict's main number, so a span of the verdict can be told with its figures over the whole span
    (the mean, or the worst where a mean means nothing, like how long a hang lasted)."""

    value: float
    template: str  # the message with {} where the figure goes
    fmt: str = "{:.0f}"
    unit: str = ""  # after the number in "worst ..."
    span: str = "mean"  # what the span's message quotes: "mean", "worst", or "elapsed" (first + span length)
    higher_is_worse: bool = True

    def text(self, value: float) -> str:
        return self.fmt.format(value)

    def message(self, value: float) -> str:
        return self.template.format(self.text(value))


@dataclass(frozen=True)
class RankRef:
    """A training rank a verdict names (its global rank, if it said it, and its PID)."""

    rank: int | None
    pid: int

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"PID {self.pid}"


@dataclass(frozen=True)
class Verdict:
    code: str
    name: str
    gpus: tuple[int, ...]  # the GPUs it concerns (for a hung collective: the suspects, if any)
    message: str
    hint: str
    severity: str = "warn"  # "warn" or "fail"
    figure: Figure | None = None
    ranks: tuple[RankRef, ...] = ()  # the training ranks it concerns (GD909-GD911)

    @property
    def key(self) -> tuple[str, tuple[int, ...], tuple[tuple[int | None, int], ...]]:
        return (self.code, self.gpus, tuple((r.rank, r.pid) for r in self.ranks))

    @property
    def subject(self) -> str:
        """Whom it names, short: "GPU 3", "GPUs 0,5", "rank 1", "ranks 0,1"."""
        if self.ranks:
            known = [r for r in self.ranks if r.rank is not None]
            if len(known) == len(self.ranks):
                return f"rank{'s' if len(known) > 1 else ''} {','.join(str(r.rank) for r in known)}"
            return ", ".join(r.label for r in self.ranks)
        if not self.gpus:
            return "job"
        return f"GPU{'s' if len(self.gpus) > 1 else ''} {gpu_list(list(self.gpus))}"


@dataclass(frozen=True)
class Balance:
    samples: int
    mean_util: dict[int, float] = field(default_factory=dict)  # per GPU over the window
    util_spread: float | None = None  # mean over samples of max-min utilization across GPUs
    mem_mean: dict[int, float] = field(default_factory=dict)  # MiB
    verdicts: tuple[Verdict, ...] = ()
    warming: float | None = None  # seconds of warm-up left (balance verdicts wait); None: warm
    ranks: dict[tuple[int | None, int], RankStats] = field(default_factory=dict)
    idle: bool = False  # every GPU below idle_util over the window: no balance to judge


@dataclass(frozen=True)
class RankStats:
    """One rank over the window, from its step records."""

    ref: RankRef
    steps: int
    step_s: float | None  # mean step time
    wait_share: float | None  # share of the step time spent waiting for input
    late_s: float | None  # how much later than the others' median it ends its steps (synchronized ranks)
    late_share: float  # share of its comparable steps it ended after the others' median
    late_n: int  # its steps the others ran too (comparable)
    last_step: int | None
    last_end: float | None
    cycle_s: float | None = None  # mean time from one step's end to the next's (its step and what is around it)

    loader_share: float | None = None  # share inside next(loader), where gpudoctor.watch_loader measures it

    @property
    def input_share(self) -> float | None:
        """The share of its steps a rank waits for input: inside next(loader) where that is measured (the
        rest between steps is other work, GD948), else all the time between steps."""
        return self.wait_share if self.loader_share is None else self.loader_share


def window(samples: Sequence[Sample], window_s: float) -> list[Sample]:
    """The trailing samples within `window_s` seconds of the last one."""
    if not samples:
        return []
    end = samples[-1].t
    out: list[Sample] = []
    for s in reversed(samples):
        if end - s.t > window_s:
            break
        out.append(s)
    out.reverse()
    return out


def totals(win: Sequence[Sample], th: Thresholds = DEFAULT) -> Window:
    """The running totals of `win`: itself when it is a Window kept for `th`, else built from it."""
    return Window.of(win, th)


def stragglers(win: Sequence[Sample], th: Thresholds = DEFAULT) -> list[Verdict]:
    w = totals(win, th)
    if w.counted < th.min_samples:
        return []
    need = th.straggler_share * w.counted
    out = []
    for idx in sorted(k for k, a in w.gpus.items() if a.gap_n and (a.low >= need or a.high >= need)):
        a = w.gpus[idx]
        mean_gap = a.gap2_sum / (2 * a.gap_n)  # exact: the gaps are halves
        for side, hits in (("below", a.low), ("above", a.high)):
            if hits >= need:
                template = f"GPU {idx} runs {{}} points {side} the other GPUs' utilization"
                figure = Figure(abs(mean_gap), template, unit=" points")
                out.append(
                    Verdict(
                        codes.STRAGGLER.code,
                        codes.STRAGGLER.name,
                        (idx,),
                        figure.message(figure.value),
                        "Check this GPU's throttle reasons, clocks and PCIe link, other processes on it, and "
                        "that every rank gets the same amount of work.",
                        figure=figure,
                    )
                )
    return out


def memory_imbalance(win: Sequence[Sample], th: Thresholds = DEFAULT) -> list[Verdict]:
    w = totals(win, th)
    used = {k: a for k, a in w.gpus.items() if a.mem_n}
    if len(used) < 2 or len(w) < th.min_samples:
        return []
    means = {k: a.mem_sum / a.mem_n for k, a in used.items()}
    top = max(means, key=lambda k: (means[k], used[k].total is not None, -k))  # a tie: a known total, the lowest index
    others = statistics.median(v for k, v in means.items() if k != top)
    cap = used[top].total
    if cap is None:
        return []
    if means[top] - others >= th.mem_gap_share * cap and means[top] >= th.mem_ratio * others:
        figure = Figure(
            means[top] / 1024,
            f"GPU {top} holds {{}} GiB, the others {others / 1024:.1f} GiB (median)",
            "{:.1f}",
            " GiB",
        )
        return [
            Verdict(
                codes.MEMORY_IMBALANCE.code,
                codes.MEMORY_IMBALANCE.name,
                (top,),
                figure.message(figure.value),
                "A model, an evaluation copy or extra CUDA contexts sit on this GPU (the DataParallel "
                "pattern): use DDP, set_device(local_rank) first, map_location per rank.",
                figure=figure,
            )
        ]
    return []


def input_starvation(win: Sequence[Sample], th: Thresholds = DEFAULT) -> list[Verdict]:
    w = totals(win, th)
    if len(w) < th.min_samples or w.dips < th.starve_share * len(w):
        return []
    if not w.dip_cpu_n:
        return []
    cpu = exact_mean(w.dip_cpu_sum, w.dip_cpu_n)
    if cpu < th.starve_cpu:
        return []
    gpus = tuple(sorted(k for k, a in w.gpus.items() if a.alive))
    figure = Figure(
        100 * w.dips / len(w),
        f"all GPUs drop below {th.starve_util:.0f}% together in {{}}% of the samples "
        f"while the CPUs are {cpu:.0f}% busy",
        unit="% of the samples",
    )
    return [
        Verdict(
            codes.INPUT_STARVATION.code,
            codes.INPUT_STARVATION.name,
            gpus,
            figure.message(figure.value),
            "The input pipeline cannot keep up: more DataLoader workers, pin_memory, or move augmentation to the GPU.",
            figure=figure,
        )
    ]


def hung_collective(win: Sequence[Sample], th: Thresholds = DEFAULT) -> list[Verdict]:
    """GPUs that have spun (busy, no power) for hung_min_s up to the latest sample; the figure is how
    long they have all spun together (within the window)."""
    w = totals(win, th)
    if not w:
        return []
    last, first = w[-1], w[0].t
    since = {i: max(t, first) for i, t in w.spin.items()}  # a spin is seen as far back as the window goes
    spinning = [g.index for g in last.gpus if g.alive and g.index in since and last.t - since[g.index] >= th.hung_min_s]
    if not spinning:
        return []
    taken = set(spinning)
    suspects = tuple(g.index for g in last.gpus if g.index not in taken)
    lasted = last.t - max(since[i] for i in spinning)
    if suspects:
        template = (
            f"GPU(s) {gpu_list(spinning)} spin at 100% utilization on idle power for {{}} s: "
            f"waiting in a collective for GPU(s) {gpu_list(list(suspects))}"
        )
        hint = f"Suspect GPU(s) {gpu_list(list(suspects))}: look at that rank's stack (py-spy dump) and logs."
    else:
        template = (
            "every GPU spins at 100% utilization on idle power for {} s: "
            "a collective is waiting for a rank that is not on these GPUs"
        )
        hint = "Look for a rank on another node, or one stuck on the CPU side (I/O, a deadlock)."
    figure = Figure(lasted, template, unit=" s", span="elapsed")  # the window caps `lasted`; the span does not
    return [
        Verdict(
            codes.HUNG_COLLECTIVE.code,
            codes.HUNG_COLLECTIVE.name,
            suspects or tuple(spinning),
            figure.message(lasted),
            hint,
            "fail",
            figure,
        )
    ]


def _labels(bits: int, kind_bits: int) -> str:
    """The clock_reasons labels of `kind_bits` set in `bits`, in bit order."""
    return ", ".join(r.label for r in clock_reasons.active(bits & kind_bits))


def throttling(win: Sequence[Sample], th: Thresholds = DEFAULT) -> list[Verdict]:
    w = totals(win, th)
    if len(w) < th.min_samples:
        return []
    need = th.throttle_share * len(w)
    out = []
    hot = tuple(sorted(k for k, a in w.gpus.items() if a.thermal and a.thermal >= need))
    if hot:
        temps = {g.index: g.temp for g in w[-1].gpus if g.index in hot and g.temp is not None}
        shown = ", ".join(f"GPU {k} {v} C" for k, v in temps.items()) or f"GPU(s) {gpu_list(list(hot))}"
        why = _labels(_seen_bits(w, hot), THERMAL_THROTTLE_BITS)
        share = 100 * min(w.gpus[k].thermal for k in hot) / len(w)
        figure = Figure(share, f"{why} in {{}}% of the samples: {shown}", unit="% of the samples")
        out.append(
            Verdict(
                codes.THERMAL_THROTTLE.code,
                codes.THERMAL_THROTTLE.name,
                hot,
                figure.message(share),
                "Check cooling and airflow around these GPUs.",
                figure=figure,
            )
        )
    capped = tuple(sorted(k for k, a in w.gpus.items() if a.power and a.power >= need))
    if capped:
        why = _labels(_seen_bits(w, capped), POWER_THROTTLE_BITS)
        share = 100 * min(w.gpus[k].power for k in capped) / len(w)
        figure = Figure(
            share, f"{why} slows GPU(s) {gpu_list(list(capped))} in {{}}% of the samples", unit="% of the samples"
        )
        out.append(
            Verdict(
                codes.POWER_THROTTLE.code,
                codes.POWER_THROTTLE.name,
                capped,
                figure.message(share),
                "Compare power limits across GPUs (nvidia-smi -q -d POWER).",
                figure=figure,
            )
        )
    return out


def _seen_bits(w: Window, gpus: Sequence[int]) -> int:
    """Every judged throttle reason bit that some of `gpus` reported in the window."""
    seen = 0
    for k in gpus:
        for bit in w.gpus[k].bits:
            seen |= bit
    return seen


def xid_events(win: Sequence[Sample]) -> list[Verdict]:
    w = totals(win, win.th if isinstance(win, Window) else DEFAULT)
    out = []
    for idx in sorted(k for k, a in w.gpus.items() if a.xids):
        xids = sorted(w.gpus[idx].xids)
        classes = {"contained" if contained(x) else classify(x) for x in xids}
        # The worst class decides: hardware first, then a contained hardware fault, an application
        # fault, the unknown.
        worst = next(c for c in ("hardware", "contained", "application", "other") if c in classes)
        out.append(
            Verdict(
                codes.XID_EVENT.code,
                codes.XID_EVENT.name,
                (idx,),
                f"GPU {idx} reported {', '.join(f'{classify(x)} {describe(x)}' for x in xids)}",
                XID_HINTS[worst],
                "fail" if worst == "hardware" else "warn",
            )
        )
    return out


def lost_gpus(win: Sequence[Sample]) -> list[Verdict]:
    if not win:
        return []
    lost = tuple(g.index for g in win[-1].gpus if g.state == LOST)
    if not lost:
        return []
    return [
        Verdict(
            codes.GPU_LOST.code,
            codes.GPU_LOST.name,
            lost,
            f"GPU(s) {gpu_list(list(lost))} lost (NVML: GPU is lost)",
            "Check dmesg for XID 79; reset the GPU or reboot before restarting.",
            "fail",
        )
    ]


def rank_stats(win: Sequence[Sample], th: Thresholds = DEFAULT) -> dict[tuple[int | None, int], RankStats]:
    """Per rank over the window: mean step time, input-wait share, and how late it ends its steps
    (Window._lateness), in the window's order of ranks. A Window kept sample by sample keeps them: only
    the ranks the latest sample changed (Window.touched) are made again."""
    w = totals(win, th)
    kept = w.stats
    if w.stats_seq == w.seq - 1 and w.seq:
        for key in w.touched:
            a = w.ranks.get(key)
            if a is None:
                kept.pop(key, None)
            else:
                kept[key] = _rank_stat(w, key, a)
    elif w.stats_seq != w.seq:
        kept.clear()
        for key, a in w.ranks.items():
            kept[key] = _rank_stat(w, key, a)
    w.stats_seq = w.seq
    return {key: kept[key] for key in w.ranks}  # a dict of its own: a caller may keep the previous one


def _rank_stat(w: Window, key: tuple[int | None, int], a: RankTotals) -> RankStats:
    step_s = exact_mean(a.step_sum, a.timed) if a.timed else None
    # The waited time over the time of the steps that measured a wait (a plain step() has none).
    share = share_of(a.wait_sum, a.waited_step_sum) if a.waited and a.waited_step_sum else None
    late_n, late_sum, late_pos = a.late
    last = a.last
    ends = a.ends  # (step, end) of its readings in the window that had both, oldest first
    cycle = None
    if len(ends) >= 2 and ends[-1][0] > ends[0][0]:
        cycle = (ends[-1][1] - ends[0][1]) / (ends[-1][0] - ends[0][0])
    stats = _new(RankStats)  # made per changed rank per sample: without the frozen __init__'s calls
    stats.__dict__.update(
        ref=_ref(key),
        steps=a.steps,
        step_s=step_s,
        wait_share=share,
        late_s=exact_mean(late_sum, late_n) if late_n else None,
        late_share=late_pos / late_n if late_n else 0.0,
        late_n=late_n,
        last_step=None if last is None else last.last_step,
        last_end=None if last is None else last.last_end,
        cycle_s=cycle,
        loader_share=loader_share(w, key),
    )
    return stats


_new = object.__new__


@lru_cache(maxsize=1 << 14)
def _ref(key: tuple[int | None, int]) -> RankRef:
    return RankRef(key[0], key[1])


def _rank_order(r: RankRef) -> tuple[bool, int, int]:
    return (r.rank is None, r.rank or 0, r.pid)


# How many ranks a verdict names (heuristics): its message names the first few, its `ranks` (the JSON's,
# and what tells one span from another) at most MAX_VERDICT_RANKS. A job whose processes churn (an
# elastic restart, a crafted recording) holds thousands of ranks in a window: a verdict naming each of
# them made a span per sample, and a report of tens of megabytes (issue 22's review).
NAMED_IN_MESSAGE = 8
MAX_VERDICT_RANKS = 64


def _refs(stats: Sequence[RankStats]) -> tuple[RankRef, ...]:
    """The ranks a verdict names, in rank order: the first MAX_VERDICT_RANKS of `stats` (the caller's
    order says which come first)."""
    return tuple(sorted((s.ref for s in stats[:MAX_VERDICT_RANKS]), key=_rank_order))


def _named(parts: Sequence[str], total: int) -> str:
    """The first NAMED_IN_MESSAGE of `parts` (the first few of `total`), and how many more."""
    more = total - min(total, NAMED_IN_MESSAGE)
    return ", ".join(parts[:NAMED_IN_MESSAGE]) + (f" and {more} more" if more else "")


def slow_ranks(stats: dict[tuple[int | None, int], RankStats], th: Thresholds) -> list[Verdict]:
    """GD909: the rank the others wait for, from its step times, its lateness or its input wait."""
    timed = [s for s in stats.values() if s.step_s is not None and s.steps >= th.min_samples]
    if len(timed) < 2:
        return []
    timed.sort(key=lambda s: _rank_order(s.ref))
    step_times = sorted(s.step_s for s in timed if s.step_s is not None)
    waits = sorted(s.input_share or 0.0 for s in timed)
    cycles = sorted(s.cycle_s for s in timed if s.cycle_s)  # the others' median from it: O(log n) a slow rank
    out = []
    for s in timed:
        assert s.step_s is not None
        median_step = median_without(step_times, s.step_s)  # the others'
        median_wait = median_without(waits, s.input_share or 0.0)
        steady = s.late_n >= th.min_samples and s.late_share >= th.rank_late_hits
        late = s.late_s if steady else None
        hint = (
            "Look at what this rank does that the others do not (rank-0-only logging, evaluation or "
            "checkpointing on the step path, a bigger shard, a slower data source, its GPU's row)."
        )
        slow_steps = s.step_s >= th.rank_slow_ratio * median_step and s.step_s - median_step >= th.rank_late_min_s
        if slow_steps and not _kept_waiting(s, cycles, th):
            figure = Figure(
                1000 * s.step_s,
                f"{s.ref.label}'s steps take {{}} ms, the others' {1000 * median_step:.0f} ms (median)",
                unit=" ms",
            )
        elif late is not None and late >= max(th.rank_late_share * median_step, th.rank_late_min_s):
            figure = Figure(
                1000 * late,
                f"{s.ref.label} ends each step {{}} ms after the others (step {1000 * median_step:.0f} ms): "
                "they wait for it in the next collective",
                unit=" ms late",
            )
        elif (
            s.input_share is not None
            and s.input_share >= th.rank_wait_share
            and s.input_share >= th.rank_wait_ratio * median_wait
        ):
            figure = Figure(
                100 * s.input_share,
                f"{s.ref.label} waits for input {{}}% of its step time, the others {100 * median_wait:.0f}% "
                "(median): they wait for it in the next collective",
                unit="% waiting for input",
            )
            hint = "Its input is the bottleneck: its DataLoader workers, its shard's storage, its preprocessing."
        else:
            continue
        out.append(
            Verdict(
                codes.SLOW_RANK.code,
                codes.SLOW_RANK.name,
                (),
                figure.message(figure.value),
                hint,
                figure=figure,
                ranks=(s.ref,),
            )
        )
    return out


def _kept_waiting(s: RankStats, cycles: list[float], th: Thresholds) -> bool:
    """Its steps are longer but not its cycle (step end to step end): it waited inside its steps for the
    others to arrive (a rank kept waiting by one that came late, or that worked between steps), so it is
    not the slow one. Ranks that do not synchronize have longer cycles too when they are slow. Without
    its cycle yet (its steps of the window came in one reading) nothing says it is slow: wait for one.
    `cycles`: every timed rank's known cycle, sorted (its own among them)."""
    if s.cycle_s is None:
        return True
    if not s.cycle_s:  # zero: not among `cycles`, which are all the others'
        return bool(cycles) and s.cycle_s < th.rank_slow_ratio * median_sorted(cycles)
    if len(cycles) < 2:  # no other rank's cycle to compare with
        return False
    return s.cycle_s < th.rank_slow_ratio * median_without(cycles, s.cycle_s)


def input_wait(stats: dict[tuple[int | None, int], RankStats], th: Thresholds) -> list[Verdict]:
    """GD910: the ranks, as a whole, wait for input a large share of each step."""
    shares = [s.input_share for s in stats.values() if s.input_share is not None and s.steps >= th.min_samples]
    if not shares:
        return []
    median = statistics.median_low(shares)  # at least half the ranks wait this much: the job, not one rank
    if median < th.input_wait_share:
        return []
    figure = Figure(
        100 * median,
        f"the ranks wait for input {{}}% of each step (median of {plural(len(shares), 'rank')})",
        unit="% waiting for input",
    )
    return [
        Verdict(
            codes.INPUT_WAIT.code,
            codes.INPUT_WAIT.name,
            (),
            figure.message(figure.value),
            "The input pipeline cannot keep up: more DataLoader workers, pin_memory, prefetching, "
            "faster storage or preprocessing on the GPU; the host line shows whether the CPUs are saturated.",
            figure=figure,
            ranks=_refs(
                sorted((s for s in stats.values() if s.input_share is not None), key=lambda s: _rank_order(s.ref))
            ),
        )
    ]


def steps_stalled(stats: dict[tuple[int | None, int], RankStats], now: float, th: Thresholds) -> list[Verdict]:
    """GD911: no rank has finished a step for the deadline; names the ranks whose last step is behind."""
    ended = [s for s in stats.values() if s.last_end is not None and s.last_step is not None]
    if not ended:
        return []
    quiet = now - max(s.last_end for s in ended if s.last_end is not None)
    steps = [s.step_s for s in stats.values() if s.step_s is not None]
    deadline = th.hang_after_s
    if deadline is None:
        deadline = max(th.hang_min_s_steps, th.hang_step_factor * statistics.median(steps) if steps else 0.0)
    if quiet < deadline:
        return []
    top = max(s.last_step for s in ended if s.last_step is not None)
    behind = [s for s in ended if s.last_step is not None and s.last_step < top]
    if behind:
        behind.sort(key=lambda s: (s.last_step or 0, _rank_order(s.ref)))  # the furthest behind first
        shown = _named([f"{s.ref.label} at step {s.last_step}" for s in behind[:NAMED_IN_MESSAGE]], len(behind))
        template = f"no rank has finished a step for {{}} s; behind the others (step {top}): {shown}"
    else:
        template = f"no rank has finished a step for {{}} s; every rank stopped after step {top}"
    figure = Figure(quiet, template, unit=" s", span="worst")
    return [
        Verdict(
            codes.STEPS_STALLED.code,
            codes.STEPS_STALLED.name,
            (),
            figure.message(quiet),
            "Dump the named ranks' stacks (py-spy dump --pid PID) and read their logs; a rank behind the "
            "others usually stopped first. A checkpoint or evaluation this long: raise --hang-after.",
            "fail",
            figure,
            _refs(behind or sorted(ended, key=lambda s: _rank_order(s.ref))),
        )
    ]


def judge(
    win: Sequence[Sample],
    th: Thresholds = DEFAULT,
    elapsed: float | None = None,
    ranks: dict[tuple[int | None, int], RankStats] | None = None,
) -> tuple[list[Verdict], float | None]:
    """The verdicts of one window, and the seconds of warm-up left (None: warm); `ranks`: its
    rank_stats when the caller has them already.

    `elapsed`: seconds since watching started. During the warm-up only what cannot be warm-up noise is
    judged: a lost GPU, an XID, a hung collective, stalled steps (each has its own deadline)."""
    w = totals(win, th)
    ranks = rank_stats(w, th) if ranks is None else ranks
    hung = hung_collective(w, th)
    stalled = steps_stalled(ranks, w[-1].t, th) if w else []
    verdicts = [*lost_gpus(w), *hung, *stalled, *xid_events(w)]
    warming = None if elapsed is None or elapsed >= th.warmup else th.warmup - elapsed
    if warming is None:
        if not hung and not stalled:  # a hang makes every other balance reading meaningless
            verdicts += stragglers(w, th) + input_starvation(w, th) + slow_ranks(ranks, th)
            verdicts += input_wait(ranks, th)
        verdicts += memory_imbalance(w, th) + throttling(w, th)
    return verdicts, warming


def analyze(win: Sequence[Sample], th: Thresholds = DEFAULT, elapsed: float | None = None) -> Balance:
    """Numbers and verdicts for one window (the caller picks the window, see `window`; a `Window`
    kept sample by sample costs one sample's GPUs and ranks, whatever its length)."""
    w = totals(win, th)
    ranks = rank_stats(w, th)
    verdicts, warming = judge(w, th, elapsed, ranks)
    return balance(w, th, verdicts, warming, ranks)


def balance(
    w: Window,
    th: Thresholds,
    verdicts: Sequence[Verdict],
    warming: float | None,
    ranks: dict[tuple[int | None, int], RankStats],
) -> Balance:
    """The window's numbers around its verdicts (what the dashboard's balance line shows)."""
    mean_util = {k: a.util_sum / a.util_n for k, a in w.gpus.items() if a.util_n}
    return Balance(
        samples=len(w),
        mean_util=mean_util,
        util_spread=w.spread_sum / w.spread_n if w.spread_n else None,
        mem_mean={k: a.mem_sum / a.mem_n for k, a in w.gpus.items() if a.mem_n},
        verdicts=tuple(verdicts),
        warming=warming,
        ranks=ranks,
        idle=bool(mean_util) and max(mean_util.values()) < th.idle_util,
    )
