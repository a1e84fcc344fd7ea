"""Balance analysis: pure functions from a window of samples to numbers and verdicts.

Nothing here reads NVML or draws: the dashboard, the headless mode and the summary all
call `analyze(window)` with the samples of the last `window_s` seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpudoctor import clock_reasons
from gpudoctor.checks.targets import gpu_list
from gpudoctor.watch import codes
from gpudoctor.watch.model import LOST, Sample
from gpudoctor.xid import classify, contained, describe

# GD905 holds the hot GPU (thermal slowdown) and HW_SLOWDOWN, which the hardware engages for
# heat among other causes; GD906 the power cap and the power brake (clock_reasons' classes).
THERMAL_THROTTLE_BITS = clock_reasons.THERMAL_BITS | clock_reasons.HARDWARE_BITS
POWER_THROTTLE_BITS = clock_reasons.POWER_BITS

# What GD907 says per XID class (gpudoctor.xid.classify, the same classes as `gpudoctor check`).
# A hardware XID the driver contained (63 row remap, 94 contained ECC) warns, as in GD810.
XID_HINTS = {
    "hardware": "Hardware XID: drain the node and run `gpudoctor check`.",
    "contained": "The driver contained it (row remapped, or only the context that hit the ECC error "
    "stopped): the job may go on; run `gpudoctor check` after it, and plan an RMA if these keep coming.",
    "application": "Application fault: rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel.",
    "other": "Look the XID up in NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors).",
}


@dataclass(frozen=True)
class Thresholds:
    window_s: float = 30.0
    min_samples: int = 5  # fewer than this in the window: too early to judge balance
    straggler_gap: float = 15.0  # utilization points away from the median of the others
    straggler_share: float = 0.8  # ...in this share of the window's samples
    mem_gap_share: float = 0.15  # extra memory, as a share of the GPU's total
    mem_ratio: float = 1.25  # ...and at least this times the median of the others
    starve_util: float = 50.0  # every GPU below this at once is a dip
    starve_share: float = 0.3  # dips in this share of the window
    starve_cpu: float = 85.0  # host CPU busy % during the dips
    hung_util: float = 95.0
    hung_power_share: float = 0.25  # power below this share of the limit while "busy"
    hung_idle_w: float = 100.0  # used when the power limit is unknown
    hung_min_s: float = 20.0
    throttle_share: float = 0.5


DEFAULT = Thresholds()


@dataclass(frozen=True)
class Verdict:
    code: str
    name: str
    gpus: tuple[int, ...]  # the GPUs it concerns (for a hung collective: the suspects, if any)
    message: str
    hint: str
    severity: str = "warn"  # "warn" or "fail"

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        return (self.code, self.gpus)


@dataclass(frozen=True)
class Balance:
    samples: int
    mean_util: dict[int, float] = field(default_factory=dict)  # per GPU over the window
    util_spread: float | None = None  # mean over samples of max-min utilization across GPUs
    mem_mean: dict[int, float] = field(default_factory=dict)  # MiB
    verdicts: tuple[Verdict, ...] = ()


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


def _alive_utils(s: Sample) -> dict[int, int]:
    return {g.index: g.util for g in s.gpus if g.alive and g.util is not None}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def stragglers(win: Sequence[Sample], th: Thresholds = DEFAULT) -> list[Verdict]:
    low: dict[int, int] = {}
    high: dict[int, int] = {}
    gaps: dict[int, list[float]] = {}
    counted = 0
    for s in win:
        utils = _alive_utils(s)
        if len(utils) < 3:  # with two GPUs "the odd one out" has no meaning
            continue
        counted += 1
        for idx, u in utils.items():
            others = statistics.median(v for k, v in utils.items() if k != idx)
            gap = u - others
            gaps.setdefault(idx, []).append(gap)
            if gap <= -th.straggler_gap:
                low[idx] = low.get(idx, 0) + 1
            elif gap >= th.straggler_gap:
                high[idx] = high.get(idx, 0) + 1
    if counted < th.min_samples:
        return []
    out = []
    for idx in sorted(gaps):
        mean_gap = _mean(gaps[idx])
        for side, hits in (("below", low), ("above", high)):
            if hits.get(idx, 0) >= th.straggler_share * counted:
                out.append(
                    Verdict(
                        codes.STRAGGLER.code,
                        codes.STRAGGLER.name,
                        (idx,),
                        f"GPU {idx} runs {abs(mean_gap):.0f} points {side} the other GPUs' utilization",
                        "Check this GPU's throttle reasons, clocks and PCIe link, other processes on it, and "
                        "that every rank gets the same amount of work.",
                    )
                )
    return out


def memory_imbalance(win: Sequence[Sample], th: Thresholds = DEFAULT) -> list[Verdict]:
    used: dict[int, list[int]] = {}
    total: dict[int, int] = {}
    for s in win:
        for g in s.gpus:
            if g.alive and g.mem_used is not None:
                used.setdefault(g.index, []).append(g.mem_used)
                if g.mem_total:
                    total[g.index] = g.mem_total
    if len(used) < 2 or len(win) < th.min_samples:
        return []
    means = {k: _mean(v) for k, v in used.items()}
    top = max(means, key=means.__getitem__)
    others = statistics.median(v for k, v in means.items() if k != top)
    cap = total.get(top)
    if cap is None:
        return []
    if means[top] - others >= th.mem_gap_share * cap and means[top] >= th.mem_ratio * others:
        return [
            Verdict(
                codes.MEMORY_IMBALANCE.code,
                codes.MEMORY_IMBALANCE.name,
                (top,),
                f"GPU {top} holds {means[top] / 1024:.1f} GiB, the others {others / 1024:.1f} GiB (median)",
                "A model, an evaluation copy or extra CUDA contexts sit on this GPU (the DataParallel "
                "pattern): use DDP, set_device(local_rank) first, map_location per rank.",
            )
        ]
    return []


def input_starvation(win: Sequence[Sample], th: Thresholds = DEFAULT) -> list[Verdict]:
    if len(win) < th.min_samples:
        return []
    dips = []
    for s in win:
        utils = _alive_utils(s)
        if utils and max(utils.values()) < th.starve_util:
            dips.append(s)
    if len(dips) < th.starve_share * len(win):
        return []
    cpus = [s.cpu for s in dips if s.cpu is not None]
    if not cpus or _mean(cpus) < th.starve_cpu:
        return []
    gpus = tuple(sorted({g.index for s in win for g in s.gpus if g.alive}))
    return [
        Verdict(
            codes.INPUT_STARVATION.code,
            codes.INPUT_STARVATION.name,
            gpus,
            f"all GPUs drop below {th.starve_util:.0f}% together in {len(dips)}/{len(win)} samples "
            f"while the CPUs are {_mean(cpus):.0f}% busy",
            "The input pipeline cannot keep up: more DataLoader workers, pin_memory, or move augmentation to the GPU.",
        )
    ]


def _spinning(g_util: int | None, power: float | None, limit: float | None, th: Thresholds) -> bool:
    if g_util is None or power is None or g_util < th.hung_util:
        return False
    idle = th.hung_power_share * limit if limit else th.hung_idle_w
    return power <= idle


def hung_collective(win: Sequence[Sample], th: Thresholds = DEFAULT) -> list[Verdict]:
    """GPUs that have spun (busy, no power) for hung_min_s up to the latest sample."""
    if not win:
        return []
    last = win[-1]
    spinning: list[int] = []
    for g in last.gpus:
        if not g.alive:
            continue
        since = None
        for s in reversed(win):
            r = s.gpu(g.index)
            if r is None or not _spinning(r.util, r.power, r.power_limit, th):
                break
            since = s.t
        if since is not None and last.t - since >= th.hung_min_s:
            spinning.append(g.index)
    if not spinning:
        return []
    suspects = tuple(g.index for g in last.gpus if g.index not in spinning)
    lasted = last.t - min(s.t for s in win if all(_spinning_in(s, i, th) for i in spinning))
    if suspects:
        message = (
            f"GPU(s) {gpu_list(spinning)} spin at 100% utilization on idle power for {lasted:.0f} s: "
            f"waiting in a collective for GPU(s) {gpu_list(list(suspects))}"
        )
        hint = f"Suspect GPU(s) {gpu_list(list(suspects))}: look at that rank's stack (py-spy dump) and logs."
    else:
        message = (
            f"every GPU spins at 100% utilization on idle power for {lasted:.0f} s: "
            "a collective is waiting for a rank that is not on these GPUs"
        )
        hint = "Look for a rank on another node, or one stuck on the CPU side (I/O, a deadlock)."
    return [
        Verdict(
            codes.HUNG_COLLECTIVE.code, codes.HUNG_COLLECTIVE.name, suspects or tuple(spinning), message, hint, "fail"
        )
    ]


def _spinning_in(s: Sample, index: int, th: Thresholds) -> bool:
    r = s.gpu(index)
    return r is not None and _spinning(r.util, r.power, r.power_limit, th)


def _labels(masks: Sequence[int], kind_bits: int) -> str:
    """The clock_reasons labels of `kind_bits` set in any of `masks`, in bit order."""
    seen = 0
    for m in masks:
        seen |= m & kind_bits
    return ", ".join(r.label for r in clock_reasons.active(seen))


def throttling(win: Sequence[Sample], th: Thresholds = DEFAULT) -> list[Verdict]:
    if len(win) < th.min_samples:
        return []
    thermal: dict[int, int] = {}
    power: dict[int, int] = {}
    masks: dict[int, list[int]] = {}
    for s in win:
        for g in s.gpus:
            if g.throttle is None:
                continue
            masks.setdefault(g.index, []).append(g.throttle)
            if g.throttle & THERMAL_THROTTLE_BITS:
                thermal[g.index] = thermal.get(g.index, 0) + 1
            if g.throttle & POWER_THROTTLE_BITS:
                power[g.index] = power.get(g.index, 0) + 1
    need = th.throttle_share * len(win)
    out = []
    hot = tuple(sorted(k for k, v in thermal.items() if v >= need))
    if hot:
        temps = {g.index: g.temp for g in win[-1].gpus if g.index in hot and g.temp is not None}
        shown = ", ".join(f"GPU {k} {v} C" for k, v in temps.items()) or f"GPU(s) {gpu_list(list(hot))}"
        why = _labels([m for k in hot for m in masks[k]], THERMAL_THROTTLE_BITS)
        out.append(
            Verdict(
                codes.THERMAL_THROTTLE.code,
                codes.THERMAL_THROTTLE.name,
                hot,
                f"{why}: {shown}",
                "Check cooling and airflow around these GPUs.",
            )
        )
    capped = tuple(sorted(k for k, v in power.items() if v >= need))
    if capped:
        why = _labels([m for k in capped for m in masks[k]], POWER_THROTTLE_BITS)
        out.append(
            Verdict(
                codes.POWER_THROTTLE.code,
                codes.POWER_THROTTLE.name,
                capped,
                f"{why} slows GPU(s) {gpu_list(list(capped))}",
                "Compare power limits across GPUs (nvidia-smi -q -d POWER).",
            )
        )
    return out


def xid_events(win: Sequence[Sample]) -> list[Verdict]:
    seen: dict[int, set[int]] = {}
    for s in win:
        for g in s.gpus:
            if g.xids:
                seen.setdefault(g.index, set()).update(g.xids)
    out = []
    for idx in sorted(seen):
        xids = sorted(seen[idx])
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


def analyze(win: Sequence[Sample], th: Thresholds = DEFAULT) -> Balance:
    """Numbers and verdicts for one window (the caller picks the window, see `window`)."""
    util_sum: dict[int, list[int]] = {}
    spreads = []
    mem: dict[int, list[int]] = {}
    for s in win:
        utils = _alive_utils(s)
        for k, v in utils.items():
            util_sum.setdefault(k, []).append(v)
        if len(utils) >= 2:
            spreads.append(max(utils.values()) - min(utils.values()))
        for g in s.gpus:
            if g.alive and g.mem_used is not None:
                mem.setdefault(g.index, []).append(g.mem_used)
    hung = hung_collective(win, th)
    verdicts = [*lost_gpus(win), *hung, *xid_events(win)]
    if not hung:  # a hang makes every other balance reading meaningless
        verdicts += stragglers(win, th) + input_starvation(win, th)
    verdicts += memory_imbalance(win, th) + throttling(win, th)
    return Balance(
        samples=len(win),
        mean_util={k: _mean(v) for k, v in util_sum.items()},
        util_spread=_mean(spreads) if spreads else None,
        mem_mean={k: _mean(v) for k, v in mem.items()},
        verdicts=tuple(verdicts),
    )
