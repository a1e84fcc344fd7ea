"""GD85x (health under load), level 3: a sustained GEMM on every GPU at once, judged with the
NVML readings the parent took while it ran.

The judging is one pure function, `judge_load(samples, rows)`: a stream of NVML readings (the
shape watch records: per GPU index, temp, power, power_limit, sm_clock, throttle, xids, state)
and the per-rank GEMM figures of gpudoctor/workloads/deep_gemm.py. It is tested on recorded
streams (tests/fixtures/deep/) as well as on the live run.

Thresholds:
- A GPU below its peers: sustained TFLOPS below PEER_WARN_RATIO (0.95) of the median of the
  other GPUs of its model warns. 5 % is SuperBench's data-diagnosis rule for a defective
  machine (its rule file: "label it as defective" at > 5 % downgrade from the baseline); here
  the baseline is the node's own GPUs of the same model. Healthy GPUs of one node sit well
  inside it: 8 H100s within 1.6 % in NVIDIA/enroot#272, 7 A100s within 0.9 % in
  NVIDIA/DCGM#122 (tests/reference/deep-gemm-peers.md). Below PEER_FAIL_RATIO (0.75) fails
  (heuristic: a quarter of every synchronous step lost; DCGM#122's faulty GPU ran at 0.35).
- Thermal: a software thermal slowdown in 2 readings or more warns (one is a blip, reported), a
  hardware one fails (the hardware engages it at "a factor of 2 or more", nvml.h).
- Power: the hardware power brake (the power supply asserting it) fails; the software power cap
  is NOT a fault under a full GEMM (GPUs run at their power limit under DCGM's targeted power
  test by design), it is reported, and it names a slow GPU's cause when only that GPU has it.
- HW_SLOWDOWN without the thermal or brake bit fails.
- Any XID during the deep run, and a GPU lost from NVML, are findings (hardware ones fail).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.checks.deep.common import (
    SAMPLE_INTERVAL_S,
    SampleStream,
    deep_data,
    median,
    subject,
    who,
    with_gpus,
)
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge import clock_reasons as cr
from gpudoctor.knowledge import xid as xids

SLOW = Code(
    "GD850",
    "gemm-slower-than-peers",
    "Every GPU sustains the GEMM throughput of its peers",
    what="Runs a large matrix multiplication on every GPU at once for --duration seconds (bf16 on "
    "Ampere and newer, fp16 on Volta/Turing, fp32 before), and compares each GPU's sustained "
    "TFLOPS (the second half of the run, once it is hot) with the median of the other GPUs of "
    "the same model. Below 0.95 of its peers warns, below 0.75 fails. The finding names the "
    "throttle reason NVML reported for that GPU meanwhile, with its clocks and temperature.",
    why="Data-parallel training runs at the pace of its slowest GPU: every step waits for it in the "
    "all-reduce. A GPU that passes every static check can still be slow under sustained load "
    "(poor cooling, a weak power stage, a degraded chip), and only a load shows it.",
    fix="Read the named reason: thermal (airflow, fans, a blocked slot, datacenter inlet "
    "temperature), power (power limit set lower, GD304; a power supply fault), none (the GPU "
    "itself: swap it with a peer to see whether the slowness follows the GPU or the slot, then "
    "ask the vendor).",
)
THERMAL = Code(
    "GD851",
    "thermal-slowdown-under-load",
    "No GPU slows down for heat under sustained load",
    what="Reads NVML's clock event reasons about once a second while the deep tests run, and "
    "reports a GPU that engaged software thermal slowdown in two readings or more (warn; a single "
    "reading is reported as a blip) or hardware thermal slowdown (fail: the hardware cuts clocks by "
    "a factor of 2 or more), with how often, from when, and its peak temperature.",
    why="A GPU that overheats under load runs slower than its peers and holds every step back; "
    "hardware thermal slowdown is the last protection before a shutdown.",
    fix="Check the cooling: fan speeds and failures, airflow (blanking panels, cable routing), inlet "
    "temperature, dust; compare with the GPU's position in the chassis. A single GPU that runs "
    "hot among identical peers needs service (thermal paste, fan, heat sink).",
)
POWER = Code(
    "GD852",
    "power-slowdown-under-load",
    "No GPU is held back by its power supply under load",
    what="Reads NVML's clock event reasons while the deep tests run: the hardware power brake "
    "(asserted by the system's power supply) fails. The software power cap is reported but is not "
    "a fault: a GPU at full GEMM load runs at its power limit by design.",
    why="A power brake means the power delivery cannot sustain the GPUs: clocks are cut by a factor "
    "of 2 or more, and a worse event takes the GPU or the node down.",
    fix="Check the power supplies (redundancy lost, a failed unit, input power), the PSU and BMC "
    "event logs, and the power cables to the GPU board.",
)
HW_SLOWDOWN = Code(
    "GD853",
    "hw-slowdown-under-load",
    "No GPU engages hardware slowdown under load",
    what="Reports NVML's HW_SLOWDOWN clock event reason when it appears under load without the "
    "thermal or power-brake reason that would explain it: NVML's other causes are a power draw "
    "too high for the fast trigger protection, or a fault.",
    why="Hardware slowdown cuts the clocks by a factor of 2 or more: that GPU paces the whole job.",
    fix="Run the load again watching `nvidia-smi -q -d PERFORMANCE`; check the power supplies and "
    "cooling; if it persists on one GPU, it is a hardware fault for the vendor.",
)
XID_UNDER_LOAD = Code(
    "GD854",
    "xid-during-load",
    "No XID error and no lost GPU during the deep tests",
    what="Listens for NVML's XID error events while the deep tests run (live events: NVML keeps no "
    "history) and watches for a GPU that stops answering NVML (fallen off the bus).",
    why="An XID under a known-good workload is the driver reporting a fault: hardware XIDs (ECC, "
    "NVLink, fallen off the bus) mean the GPU will fail a training job the same way.",
    fix="Look the XID up (`gpudoctor explain GD810` lists the common ones, NVIDIA's XID catalogue "
    "the rest), read the kernel log around it, and drain the node for hardware XIDs.",
)
NOT_DONE = Code(
    "GD855",
    "gemm-load-not-completed",
    "The sustained GEMM load ran to the end",
    what="The load runs in spawned ranks under a deadline (--timeout plus the planned load time); "
    "this finding names the rank and GPU that failed or stopped answering.",
    why="A GPU that cannot sustain a plain matrix multiplication for a minute will not sustain "
    "training: a crash or hang under load is the fault itself, or points at the driver stack.",
    fix="Read the named rank's error and log tail in the evidence. On GPUs, run `gpudoctor check --level 3 "
    "--select deep_load` again with that GPU alone (CUDA_VISIBLE_DEVICES=<its UUID>) to see whether the "
    "failure follows the GPU; on CPU ranks (--device cpu) the cause is the software setup, not a GPU.",
)
CODES = [SLOW, THERMAL, POWER, HW_SLOWDOWN, XID_UNDER_LOAD, NOT_DONE]

PEER_WARN_RATIO = 0.95
PEER_FAIL_RATIO = 0.75
# A throttle reason "explains" a slow GPU when its peers had it less than half as often.
EXPLAINS_FACTOR = 0.5
# Software thermal slowdown in one reading is a blip, reported but not judged: users find DCGM's
# "thermal violations totaling 0.0 seconds" failures too sensitive (NVIDIA/DCGM#242), and
# llm-rig#97 gates on two consecutive readings. Hardware thermal slowdown counts at once.
SW_THERMAL_MIN_READINGS = 2


@dataclass
class GpuUnderLoad:
    """What NVML said about one GPU while the load ran."""

    index: int
    name: str = ""
    readings: int = 0
    masks: int = 0  # readings that carried a throttle mask
    reason_times: dict[int, list[float]] = field(default_factory=dict)  # bit -> seconds into the load
    slowdown_only: list[float] = field(default_factory=list)  # HW_SLOWDOWN without thermal/brake bits
    temps: list[float] = field(default_factory=list)
    power: list[float] = field(default_factory=list)
    power_limit: float | None = None
    clocks: list[float] = field(default_factory=list)
    lost_at: float | None = None

    def share(self, bit: int) -> float:
        return len(self.reason_times.get(bit, [])) / self.masks if self.masks else 0.0

    def first(self, bit: int) -> float | None:
        times = self.reason_times.get(bit)
        return times[0] if times else None

    @property
    def temp_max(self) -> float | None:
        return max(self.temps) if self.temps else None

    @property
    def clock_median(self) -> float | None:
        return median(self.clocks) if self.clocks else None


def under_load(samples: SampleStream, start: float, end: float) -> dict[int, GpuUnderLoad]:
    """Per GPU index, the readings taken between `start` and `end` (epoch seconds; a reading up to
    one interval and a half after the end still shows the load)."""
    out: dict[int, GpuUnderLoad] = {}
    for t, readings in samples:
        if not start <= t <= end + 1.5 * SAMPLE_INTERVAL_S:
            continue
        for r in readings:
            g = out.setdefault(int(r["index"]), GpuUnderLoad(int(r["index"]), str(r.get("name", ""))))
            if r.get("state") == "lost":
                g.lost_at = g.lost_at if g.lost_at is not None else t - start
                continue
            g.readings += 1
            for key, values in (("temp", g.temps), ("power", g.power), ("sm_clock", g.clocks)):
                if r.get(key) is not None:
                    values.append(float(r[key]))
            if r.get("power_limit") is not None:
                g.power_limit = float(r["power_limit"])
            mask = r.get("throttle")
            if isinstance(mask, int):
                g.masks += 1
                for reason in cr.slowdowns(mask):
                    g.reason_times.setdefault(reason.bit, []).append(round(t - start, 1))
                if mask & cr.HW_SLOWDOWN and not mask & (cr.HW_THERMAL_SLOWDOWN | cr.HW_POWER_BRAKE_SLOWDOWN):
                    g.slowdown_only.append(round(t - start, 1))
    return out


def judge_load(
    samples: SampleStream,
    rows: Sequence[Mapping[str, Any]],
    *,
    warn_ratio: float = PEER_WARN_RATIO,
    fail_ratio: float = PEER_FAIL_RATIO,
    sampling: str = "",
) -> list[Finding]:
    """Findings GD850-GD854 from the GEMM figures (`rows`, one per rank, "gpu" = NVML index where
    known) and the NVML readings taken meanwhile. `sampling` says why there are none."""
    if not rows:
        return []
    start = min(float(r["start"]) for r in rows)
    end = max(float(r["end"]) for r in rows)
    gpus = under_load(samples, start, end)
    findings = judge_throughput(rows, gpus, warn_ratio, fail_ratio)
    if not samples:
        why = sampling or "no NVML readings were taken"
        return findings + [
            Finding(c.code, Status.SKIP, "host", f"not judged: {why}", "", {})
            for c in (THERMAL, POWER, HW_SLOWDOWN, XID_UNDER_LOAD)
        ]
    if any(g.masks for g in gpus.values()):
        findings += judge_thermal(gpus) + judge_power(gpus) + judge_hw_slowdown(gpus)
    else:
        findings += [
            Finding(c.code, Status.SKIP, "host", "not judged: NVML gave no clock event reasons under load", "", {})
            for c in (THERMAL, POWER, HW_SLOWDOWN)
        ]
    return findings + judge_xids(samples, start, gpus)


def _peer_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row.get("device"), row.get("sm_count"), row.get("dtype"))


def judge_throughput(
    rows: Sequence[Mapping[str, Any]], gpus: Mapping[int, GpuUnderLoad], warn_ratio: float, fail_ratio: float
) -> list[Finding]:
    dtype = rows[0].get("dtype", "")
    figures = [float(r["tflops_sustained"]) for r in rows]
    span = f"{min(figures):.3g}-{max(figures):.3g} TFLOPS {dtype}" if len(rows) > 1 else f"{figures[0]:.3g} TFLOPS"
    seconds = max(float(r.get("seconds", 0)) for r in rows)
    if all(r.get("device") == "cpu" for r in rows):
        return [
            Finding(
                SLOW.code,
                Status.PASS,
                "host",
                f"{len(rows)} CPU rank(s) sustained {span} for {seconds:.0f} s (CPU: no hardware verdict)",
                "",
                {"tflops": {str(r["rank"]): r["tflops_sustained"] for r in rows}},
            )
        ]
    findings, alone = [], []
    for row in rows:
        peers = [p for p in rows if p is not row and _peer_key(p) == _peer_key(row)]
        if not peers:
            alone.append(row)
            continue
        peer_median = median([float(p["tflops_sustained"]) for p in peers])
        ratio = float(row["tflops_sustained"]) / peer_median if peer_median > 0 else 1.0
        if ratio >= warn_ratio:
            continue
        status = Status.FAIL if ratio < fail_ratio else Status.WARN
        mine = gpus.get(row["gpu"]) if row.get("gpu") is not None else None
        others = [gpus[p["gpu"]] for p in peers if p.get("gpu") in gpus]
        why, evidence = explain_slow(mine, others)
        findings.append(
            Finding(
                SLOW.code,
                status,
                subject(row),
                f"{who(row)} sustained {row['tflops_sustained']:.3g} TFLOPS {row.get('dtype', '')}, "
                f"{ratio:.0%} of its peers' {peer_median:.3g} ({row.get('device')}): {why}",
                SLOW.fix,
                {
                    "tflops_sustained": row["tflops_sustained"],
                    "tflops_mean": row.get("tflops_mean"),
                    "peer_median_tflops": round(peer_median, 6),
                    "ratio": round(ratio, 4),
                    "peers": [p["rank"] for p in peers],
                    "warn_below_ratio": warn_ratio,
                    "fail_below_ratio": fail_ratio,
                    **evidence,
                },
            )
        )
    if not findings:
        parts = [f"{len(rows)} GPU(s) sustained {span} for {seconds:.0f} s"]
        if len(alone) < len(rows):
            parts.append(f"each compared GPU within {1 - warn_ratio:.0%} of its peers")
        if alone:
            parts.append(f"no other GPU of its model beside {', '.join(who(r) for r in alone)}")
        findings.append(
            Finding(
                SLOW.code,
                Status.PASS,
                "host",
                "; ".join(parts),
                "",
                {"tflops": {str(r["rank"]): r["tflops_sustained"] for r in rows}, "warn_below_ratio": warn_ratio},
            )
        )
    return findings


def explain_slow(mine: GpuUnderLoad | None, peers: Sequence[GpuUnderLoad]) -> tuple[str, dict[str, Any]]:
    """Why a GPU was slower than its peers, in words, from what NVML said about both."""
    if mine is None or not mine.readings:
        return "no NVML readings of it to say why", {}
    evidence: dict[str, Any] = {
        "throttle_share": {r.label: round(mine.share(r.bit), 3) for r in cr.REASONS if mine.share(r.bit)},
        "temp_max_c": mine.temp_max,
        "sm_clock_median_mhz": mine.clock_median,
    }
    peer_clock = median([c for p in peers if (c := p.clock_median) is not None])
    peer_temp = max((t for p in peers if (t := p.temp_max) is not None), default=None)
    evidence["peers_sm_clock_median_mhz"] = peer_clock or None
    evidence["peers_temp_max_c"] = peer_temp
    context = []
    if mine.clock_median is not None and peer_clock:
        context.append(f"SM clock {mine.clock_median:.0f} MHz vs {peer_clock:.0f}")
    if mine.temp_max is not None:
        context.append(f"up to {mine.temp_max:.0f} C" + (f" vs {peer_temp:.0f} C" if peer_temp is not None else ""))
    detail = f" ({', '.join(context)})" if context else ""
    if not mine.masks:
        return f"no throttle reasons were readable{detail}", evidence
    own = [r for r in cr.REASONS if r.kind != cr.BENIGN and mine.share(r.bit)]
    peer_share = {r.bit: (sum(p.share(r.bit) for p in peers) / len(peers) if peers else 0.0) for r in own}
    explaining = [r for r in own if peer_share[r.bit] < EXPLAINS_FACTOR * mine.share(r.bit)]
    if explaining:
        named = ", ".join(f"{r.label} {mine.share(r.bit):.0%} of the time" for r in explaining)
        return f"explained by {named}{detail}", evidence
    if own:
        named = ", ".join(r.label for r in own)
        return f"throttled like its peers ({named}), slower all the same{detail}", evidence
    return f"no throttle reason reported: suspect the GPU itself{detail}", evidence


def _when(g: GpuUnderLoad, bit: int) -> str:
    times = g.reason_times.get(bit, [])
    return f"in {len(times)} of {g.masks} readings from {times[0]:.0f} s into the load"


def judge_thermal(gpus: Mapping[int, GpuUnderLoad]) -> list[Finding]:
    findings, blips = [], []
    for g in gpus.values():
        sw = len(g.reason_times.get(cr.SW_THERMAL_SLOWDOWN, []))
        if 0 < sw < SW_THERMAL_MIN_READINGS and not g.share(cr.HW_THERMAL_SLOWDOWN):
            blips.append(f"GPU {g.index} touched software thermal slowdown in {sw} reading")
            continue
        for bit, status in ((cr.HW_THERMAL_SLOWDOWN, Status.FAIL), (cr.SW_THERMAL_SLOWDOWN, Status.WARN)):
            if g.share(bit):
                label = cr.BY_BIT[bit].label
                temp = f", up to {g.temp_max:.0f} C" if g.temp_max is not None else ""
                findings.append(
                    Finding(
                        THERMAL.code,
                        status,
                        gpu_subject(g.index),
                        f"GPU {g.index} reached {label} under load: {_when(g, bit)}{temp}",
                        THERMAL.fix,
                        {
                            "reason": label,
                            "share": round(g.share(bit), 3),
                            "first_s": g.first(bit),
                            "temp_max_c": g.temp_max,
                            "sm_clock_median_mhz": g.clock_median,
                        },
                    )
                )
                break  # the hardware one says it all
    if findings:
        return findings
    temps = [t for g in gpus.values() if (t := g.temp_max) is not None]
    hottest = f" (hottest {max(temps):.0f} C)" if temps else ""
    blip = f"; {', '.join(blips)}" if blips else ""
    return [
        Finding(
            THERMAL.code,
            Status.PASS,
            "host",
            f"no sustained thermal slowdown on {len(gpus)} GPU(s) under load{hottest}{blip}",
            "",
            {"readings": sum(g.masks for g in gpus.values())},
        )
    ]


def judge_power(gpus: Mapping[int, GpuUnderLoad]) -> list[Finding]:
    findings = [
        Finding(
            POWER.code,
            Status.FAIL,
            gpu_subject(g.index),
            f"GPU {g.index}: the power supply asserted the {cr.BY_BIT[cr.HW_POWER_BRAKE_SLOWDOWN].label} "
            f"under load, {_when(g, cr.HW_POWER_BRAKE_SLOWDOWN)}",
            POWER.fix,
            {"share": round(g.share(cr.HW_POWER_BRAKE_SLOWDOWN), 3), "power_max_w": max(g.power, default=None)},
        )
        for g in gpus.values()
        if g.share(cr.HW_POWER_BRAKE_SLOWDOWN)
    ]
    if findings:
        return findings
    capped = [g for g in gpus.values() if g.share(cr.SW_POWER_CAP)]
    if capped:
        names = ", ".join(f"GPU {g.index} {g.share(cr.SW_POWER_CAP):.0%}" for g in capped)
        limits = sorted({g.power_limit for g in capped if g.power_limit is not None})
        at = f" (limit {', '.join(f'{x:g}' for x in limits)} W)" if limits else ""
        message = (
            f"software power cap under load: {names} of the time{at}; a GPU at full GEMM load runs at its "
            f"power limit by design, not a fault"
        )
    else:
        message = f"no power slowdown on {len(gpus)} GPU(s) under load"
    evidence = {"power_cap_share": {str(g.index): round(g.share(cr.SW_POWER_CAP), 3) for g in capped}}
    return [Finding(POWER.code, Status.PASS, "host", message, "", evidence)]


def judge_hw_slowdown(gpus: Mapping[int, GpuUnderLoad]) -> list[Finding]:
    findings = [
        Finding(
            HW_SLOWDOWN.code,
            Status.FAIL,
            gpu_subject(g.index),
            f"GPU {g.index} engaged hardware slowdown under load without a thermal or power-brake reason: "
            f"in {len(g.slowdown_only)} of {g.masks} readings from {g.slowdown_only[0]:.0f} s into the load",
            HW_SLOWDOWN.fix,
            {"readings": len(g.slowdown_only), "of": g.masks, "power_max_w": max(g.power, default=None)},
        )
        for g in gpus.values()
        if g.slowdown_only
    ]
    return findings or [
        Finding(HW_SLOWDOWN.code, Status.PASS, "host", f"no hardware slowdown on {len(gpus)} GPU(s) under load")
    ]


def judge_xids(samples: SampleStream, start: float, gpus: Mapping[int, GpuUnderLoad]) -> list[Finding]:
    """XID events anywhere in the deep run, and GPUs that NVML lost."""
    seen: dict[int, list[tuple[float, int]]] = {}
    lost: dict[int, float] = {}
    for t, readings in samples:
        for r in readings:
            for x in r.get("xids") or ():
                seen.setdefault(int(r["index"]), []).append((round(t - start, 1), int(x)))
            if r.get("state") == "lost":
                lost.setdefault(int(r["index"]), round(t - start, 1))
    findings = []
    for index, events in sorted(seen.items()):
        codes = sorted({x for _, x in events})
        hard = [x for x in codes if xids.classify(x) == "hardware" and not xids.contained(x)]
        findings.append(
            Finding(
                XID_UNDER_LOAD.code,
                Status.FAIL if hard else Status.WARN,
                gpu_subject(index),
                f"GPU {index} reported {', '.join(xids.describe(x) for x in codes)} during the deep tests "
                f"(first {events[0][0]:.0f} s in)",
                XID_UNDER_LOAD.fix,
                {"xids": [{"t_s": t, "xid": x, "class": xids.classify(x)} for t, x in events[:20]]},
            )
        )
    for index, t in sorted(lost.items()):
        findings.append(
            Finding(
                XID_UNDER_LOAD.code,
                Status.FAIL,
                gpu_subject(index),
                f"GPU {index} stopped answering NVML {t:.0f} s into the deep tests (GPU lost: fallen off the bus?)",
                XID_UNDER_LOAD.fix,
                {"lost_at_s": t},
            )
        )
    return findings or [
        Finding(
            XID_UNDER_LOAD.code,
            Status.PASS,
            "host",
            f"no XID event and no lost GPU in {len(samples)} NVML readings of {len(gpus)} GPU(s)",
        )
    ]


def load_table(rows: Sequence[Mapping[str, Any]], gpus: Mapping[int, GpuUnderLoad]) -> dict[str, Any]:
    out = []
    for r in rows:
        g = gpus.get(r["gpu"]) if r.get("gpu") is not None else None
        shares = [(x.label, g.share(x.bit)) for x in cr.REASONS if x.kind != cr.BENIGN] if g is not None else []
        slow = ", ".join(f"{label} {share:.0%}" for label, share in shares if share)
        out.append(
            [
                r["rank"],
                "-" if r.get("gpu") is None else r["gpu"],
                r.get("device", ""),
                r.get("dtype", ""),
                f"{r['tflops_mean']:.3g}",
                f"{r['tflops_sustained']:.3g}",
                "-" if g is None or g.temp_max is None else f"{g.temp_max:.0f}",
                "-" if g is None or g.clock_median is None else f"{g.clock_median:.0f}",
                slow or "-",
            ]
        )
    return {
        "title": "sustained GEMM per rank",
        "columns": ["rank", "gpu", "device", "dtype", "TFLOPS", "sustained", "max C", "SM MHz", "slowdowns"],
        "rows": out,
    }


@check("deep_load", "Sustained GEMM load (deep)", codes=CODES, active=True, level=3, shares="deep")
def deep_load(ctx: CheckContext) -> tuple[list[Finding], dict[str, Any]]:
    got = deep_data(ctx, "deep_load", "deep_gemm", NOT_DONE, "the sustained GEMM load", CODES[0])
    if isinstance(got, list):
        return got, {}
    run, data = got
    rows = with_gpus(data["rows"], run)
    findings = judge_load(run.samples, rows, sampling=run.sampling)
    gpus = under_load(run.samples, min(r["start"] for r in rows), max(r["end"] for r in rows))
    details = {
        "tables": [load_table(rows, gpus)],
        "gemm": {**data, "rows": rows},
        "nvml_readings": len(run.samples),
        "launch": run.launch.to_json(),
    }
    return findings, details
