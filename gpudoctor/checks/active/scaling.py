"""GD72x: `gpudoctor bench scaling` verdicts, from the figures the scaling workload measured.

Pure functions (torch-free), tested with recorded numbers: `summarize` turns each model's runs
into samples/s, speedup (throughput on k / on 1) and efficiency (speedup / k) per GPU count,
with the step split of the rank on the critical path; `judge` gives the findings.

Thresholds (overridable: `bench scaling --warn-below/--fail-below`):
- warn below 0.80 efficiency: NVIDIA's DeepLearningExamples publish, on one 8-GPU node with the
  per-GPU batch fixed, ResNet-50 at 7.72x (0.97) TF32 and 6.72x (0.84) mixed precision on DGX
  A100, and the Transformer (translation) at 6.81x (0.85) TF32 and 6.72x (0.84) mixed precision on
  DGX A100, 6.52x (0.815) mixed precision on DGX-1 (tests/reference/scaling_published.md). Below
  the lowest of those, a run scales worse than tuned reference models do on NVLink machines.
- fail below 0.50: heuristic (half of the GPUs' time is lost), the same ratio as GD601's fail.
- a straggler: a rank whose input + compute takes 1.15x the median of the others or more
  (heuristic, the 15 % margin of watch's GD901).
- the split adds up when input + compute + communication is within 10 % of the step time.
On CPU (gloo) ranks share the machine's cores, so efficiency gets no verdict unless thresholds
are given; the cause of a low efficiency is still named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.checks.active.common import interference_clause
from gpudoctor.engine.codes import Code
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge import interconnect as topology
from gpudoctor.knowledge.expectations import Expectation, expected_busbw
from gpudoctor.knowledge.units import size
from gpudoctor.snapshot import Snapshot

WARN_EFFICIENCY = 0.80
FAIL_EFFICIENCY = 0.50
STRAGGLER_RATIO = 1.15
SPLIT_TOLERANCE = 0.10
ACCUM_PROJECTIONS = (1, 2, 4, 8)
THRESHOLD_SOURCE = (
    "NVIDIA DeepLearningExamples, 8 GPUs, per-GPU batch fixed: ResNet-50 0.84-0.97, Transformer 0.815-0.85"
)

# Model sizes and batches per device kind: big enough on GPUs for the gradient all-reduce to
# matter (transformer: ~67 M parameters, 270 MB of fp32 gradients); on CPU small, but with steps
# of several ms, long against a busy host's scheduling slices (tests).
DEFAULT_SIZES: dict[str, dict[str, dict[str, int]]] = {
    "cuda": {
        "cnn": {"width": 64, "depth": 4, "image": 128, "classes": 100, "batch": 64},
        "transformer": {"width": 1024, "layers": 4, "heads": 16, "seq": 256, "vocab": 8192, "batch": 8},
    },
    "cpu": {
        "cnn": {"width": 16, "depth": 3, "image": 32, "classes": 10, "batch": 8},
        "transformer": {"width": 64, "layers": 2, "heads": 4, "seq": 64, "vocab": 256, "batch": 8},
    },
}
DEFAULT_STEPS = {"cuda": (5, 20), "cpu": (2, 12)}  # (warm-up, measured) optimizer steps

EFFICIENCY = Code(
    "GD720",
    "scaling-efficiency",
    "Training throughput grows with the number of GPUs",
    what="`gpudoctor bench scaling` trains a synthetic model (a small ConvNet, a transformer block "
    "stack) with DDP on 1, 2, 4, ... GPUs with the same batch per GPU and reports samples/s, speedup "
    "(throughput on k GPUs / on 1) and efficiency (speedup / k). Efficiency below 0.80 warns: NVIDIA's "
    "DeepLearningExamples publish 0.84-0.97 for ResNet-50 and 0.815-0.85 for the Transformer on one "
    "8-GPU node; below 0.50 fails (heuristic). `--warn-below` / `--fail-below` change them. On CPU "
    "ranks share the machine's cores, so there is no verdict unless thresholds are given.",
    why="Efficiency is the share of the GPUs you pay for that does training: at 0.6 on 8 GPUs, three "
    "of them do nothing useful. The other GD72x findings say where the rest goes.",
    fix="Read the cause beside it (GD721 communication, GD722 input, GD723 a straggler GPU, GD724 "
    "compute contention) and follow its hint; re-run with `--accum`, `--amp bf16` or `--bucket-mb` "
    "to see what each buys on this machine.",
)
COMM_BOUND = Code(
    "GD721",
    "scaling-communication-bound",
    "Communication that compute does not hide costs a large part of each step",
    what="Splits each DDP step into input, compute (the same step without DDP) and communication not "
    "hidden by compute (timed where it happens: DDP's buffer broadcast before the forward, and the "
    "gradient all-reduce after the backward, by a comm hook). When communication is what the step "
    "lost against one GPU, it says how long the step waits, how many bytes of gradients are all-reduced "
    "at what busbw (measured in the same GPUs), what the links should give, and what gradient "
    "accumulation would buy back (projected from the measured split).",
    why="Each step waits for the gradients of every rank; when the links are slow, or the model's "
    "gradients are large for its compute, the GPUs sit idle for that time at every step.",
    fix="When the all-reduce busbw is below what the links should give, fix the links first (GD601, "
    "GD4 topology findings). Otherwise hide or shrink the communication: gradient accumulation (no_sync "
    "for N-1 micro-batches; try `--accum N`), a larger per-GPU batch, bf16 gradients "
    "(`bf16_compress_hook`), a bucket size fit to the model (`bucket_cap_mb`), or FSDP/ZeRO for large "
    "models.",
)
INPUT_BOUND = Code(
    "GD722",
    "scaling-input-bound",
    "Input takes a large part of each step",
    what="Times the hand-over of each step's batch to the GPU (synchronised copies from pinned host "
    "memory). When the input wait grows with the number of GPUs and is what the step lost, the run is "
    "input bound.",
    why="A GPU that waits for its batch does nothing; ranks that share host memory bandwidth, PCIe "
    "switches or CPU cores for their input slow each other down as more of them run.",
    fix="Prefetch: DataLoader with `num_workers` > 0, `pin_memory=True`, `persistent_workers=True`, and "
    "a non_blocking copy one batch ahead (or on a side stream); keep decoding off the training "
    "process; check the host links (GD420) and CPU cores per GPU (GD5).",
)
STRAGGLER = Code(
    "GD723",
    "scaling-straggler",
    "No GPU is much slower than the others",
    what="Compares every rank's input + compute time per step (measured without DDP, so no rank "
    "waits for another) with the median of the others: a rank at 1.15x or more is named, with its GPU.",
    why="DDP waits for the slowest rank at every all-reduce: one slow GPU sets the pace of all of "
    "them, and the others' waiting shows up as communication time.",
    fix="Look at the named GPU: clocks and throttle reasons (`nvidia-smi -q -d PERFORMANCE`), power "
    "and temperature, its PCIe link (GD420), other processes on it, and in `gpudoctor watch` (GD901).",
)
CONTENTION = Code(
    "GD724",
    "scaling-compute-contention",
    "Each GPU computes as fast with the others running as alone",
    what="Compares the typical rank's compute time per step on k GPUs with the one-GPU run: when "
    "compute itself grows and is what the step lost, the GPUs slow each other down.",
    why="GPUs that share power, cooling, host CPU cores or memory bandwidth run slower together than "
    "alone; on CPU ranks this is the cores being shared.",
    fix="Look for power or thermal throttling under load (`nvidia-smi -q -d PERFORMANCE`, GD8), "
    "CPU cores per GPU and OMP_NUM_THREADS (GD5), and NUMA placement of the ranks.",
)
NOT_RUN = Code(
    "GD725",
    "scaling-not-completed",
    "The scaling bench ran to the end",
    what="The bench runs in spawned ranks with a deadline; this finding names the rank (and GPU) that "
    "failed or did not answer, and the model and GPU count it was training.",
    why="A DDP run that fails here fails the same way in training.",
    fix="Read the named rank's error; see `gpudoctor check` (GD71x) for port, fabric manager, "
    "/dev/shm and out-of-memory causes; smaller `--batch` or model sizes if memory ran out; a "
    "longer `--timeout` on a slow machine.",
)
SPLIT = Code(
    "GD726",
    "scaling-split-unaccounted",
    "The step split adds up to the step time",
    what="Input, compute and communication are measured apart (compute in steps of its own without "
    "DDP); on the rank that sets the pace their sum must be within 10 % of the measured step time.",
    why="When it does not, something else took part of the step (another process, a busy machine, "
    "work outside the model), and the split should not be trusted for that count.",
    fix="Re-run on an idle machine, with more `--steps`; look for other processes on the GPUs (`gpudoctor watch`).",
)
DATAPARALLEL = Code(
    "GD727",
    "dataparallel-vs-ddp",
    "DataParallel beside DDP: throughput and GPU-0 memory",
    what="On 2 or more GPUs, trains the same model with `nn.DataParallel` over every GPU from one "
    "process (the same per-GPU batch) and reports its samples/s beside DDP's and each GPU's peak "
    "memory: DataParallel keeps the model, the whole batch's outputs and the loss on GPU 0.",
    why="DataParallel replicates the model every step, runs one Python thread per GPU under one GIL, "
    "and gathers outputs on GPU 0, which runs out of memory first; PyTorch recommends DDP instead.",
    fix="Use DistributedDataParallel with one process per GPU (torchrun); the figures show what the "
    "switch is worth on this machine.",
)
CODES = [EFFICIENCY, COMM_BOUND, INPUT_BOUND, STRAGGLER, CONTENTION, NOT_RUN, SPLIT, DATAPARALLEL]

CAUSE_CODES = {"communication": COMM_BOUND, "input": INPUT_BOUND, "straggler": STRAGGLER, "compute": CONTENTION}


@dataclass(frozen=True)
class RankSplit:
    rank: int
    input_ms: float
    compute_ms: float
    comm_ms: float
    step_ms: float  # mean (throughput)
    step_median_ms: float
    accounted: float  # median over steps of (input + compute + communication) / step
    peak_mem_bytes: int | None = None

    @property
    def busy_ms(self) -> float:
        """The rank's own work: input and compute, without waiting for anyone."""
        return self.input_ms + self.compute_ms

    @staticmethod
    def of(row: dict[str, Any]) -> RankSplit:
        return RankSplit(
            row["rank"],
            row["input_ms"],
            row["compute_ms"],
            row["comm_ms"],
            row["step_ms"],
            row["step_median_ms"],
            row["accounted"],
            row.get("peak_mem_bytes"),
        )


@dataclass
class CountSummary:
    """One model on k GPUs (ranks), against the same model on one."""

    model: str
    gpus: int
    samples_per_s: float
    step_ms: float
    speedup: float
    efficiency: float
    ranks: list[RankSplit]
    critical: RankSplit  # the rank whose own work is longest: the others wait for it
    grad_allreduce: dict[str, Any] | None
    contributions: dict[str, float] = field(default_factory=dict)  # ms per step lost, by cause
    straggler_ratio: float = 1.0
    projected: dict[int, float] = field(default_factory=dict)  # accumulation steps -> efficiency

    def cause(self) -> str | None:
        """What the step lost most to, against one GPU (None when nothing was lost)."""
        candidates = {
            k: v for k, v in self.contributions.items() if k != "straggler" or self.straggler_ratio >= STRAGGLER_RATIO
        }
        if not candidates or max(candidates.values()) <= 0:
            return None
        return max(candidates, key=candidates.__getitem__)

    def to_json(self) -> dict[str, Any]:
        c = self.critical
        return {
            "model": self.model,
            "gpus": self.gpus,
            "samples_per_s": round(self.samples_per_s, 3),
            "step_ms": round(self.step_ms, 4),
            "speedup": round(self.speedup, 4),
            "efficiency": round(self.efficiency, 4),
            "critical_rank": c.rank,
            "input_ms": c.input_ms,
            "compute_ms": c.compute_ms,
            "comm_ms": c.comm_ms,
            "accounted": round(c.accounted, 4),
            "straggler_ratio": round(self.straggler_ratio, 4),
            "contributions_ms": {k: round(v, 4) for k, v in self.contributions.items()},
            "cause": self.cause() if self.gpus > 1 else None,
            "projected_efficiency": {str(k): round(v, 4) for k, v in self.projected.items()},
            "grad_allreduce": self.grad_allreduce,
        }


def _median(values: Any) -> float:
    import statistics  # lazy: every check module loads on check --quick, which needs none of this

    return statistics.median(values)


def summarize(record: dict[str, Any], config: dict[str, Any]) -> list[CountSummary]:
    """Per GPU count: throughput, speedup and efficiency against the 1-GPU run, and the split."""
    per_step = record["sizes"]["batch"] * config["accum"]
    out: list[CountSummary] = []
    base: CountSummary | None = None
    for run in sorted(record["runs"], key=lambda r: r["gpus"]):
        ranks = [RankSplit.of(r) for r in run["ranks"]]
        k = run["gpus"]
        step = max(r.step_ms for r in ranks)
        sps = k * per_step * 1000.0 / step if step > 0 else 0.0
        critical = max(ranks, key=lambda r: r.busy_ms)
        s = CountSummary(record["model"], k, sps, step, 1.0, 1.0, ranks, critical, run.get("grad_allreduce"))
        if base is None:
            base = s
        else:
            s.speedup = sps / base.samples_per_s if base.samples_per_s else 0.0
            s.efficiency = s.speedup / k
            others = [r for r in ranks if r is not critical] or [critical]
            typical_busy = _median(r.busy_ms for r in others)
            s.straggler_ratio = critical.busy_ms / typical_busy if typical_busy > 0 else 1.0
            s.contributions = {
                "communication": critical.comm_ms,
                "straggler": max(0.0, critical.busy_ms - typical_busy),
                "input": max(0.0, _median(r.input_ms for r in ranks) - base.critical.input_ms),
                "compute": max(0.0, _median(r.compute_ms for r in others) - base.critical.compute_ms),
            }
            s.projected = project_accumulation(base.critical, critical, config["accum"])
        out.append(s)
    return out


def project_accumulation(base: RankSplit, critical: RankSplit, accum: int) -> dict[int, float]:
    """Efficiency with N micro-batches per synchronisation, from the measured split: the work per
    micro-batch stays, the communication is paid once per N (DDP no_sync). A projection."""
    one = base.busy_ms / accum
    work = critical.busy_ms / accum
    return {
        n: (one / (work + critical.comm_ms / n) if work + critical.comm_ms / n > 0 else 0.0) for n in ACCUM_PROJECTIONS
    }


@dataclass(frozen=True)
class Machine:
    """Where the ranks ran: NVML index per rank and the snapshot (GPUs), or nothing (CPU)."""

    gpus: list[int] = field(default_factory=list)
    snapshot: Snapshot | None = None

    @property
    def unit(self) -> str:
        return "GPU" if self.gpus else "rank"

    def count(self, k: int) -> str:
        return f"{k} {self.unit}{'s' if k != 1 else ''}"

    def label(self, rank: int) -> str:
        if rank < len(self.gpus):
            return f"GPU {self.gpus[rank]} (rank {rank})"
        return f"rank {rank}"

    def subject(self, rank: int) -> str:
        return f"gpu:{self.gpus[rank]}" if rank < len(self.gpus) else f"rank:{rank}"

    def expect(self, k: int) -> Expectation | None:
        if self.snapshot is None or k < 2 or k > len(self.gpus):
            return None
        return expected_busbw(self.snapshot, self.gpus[:k])

    def links(self, k: int) -> str:
        """The `topo -m` labels among the first k GPUs, e.g. 'NV12' or 'PIX, SYS'."""
        if self.snapshot is None or k > len(self.gpus):
            return ""
        idx = self.gpus[:k]
        labels = {topology.link_label(self.snapshot, a, b) for i, a in enumerate(idx) for b in idx[i + 1 :]}
        return ", ".join(sorted(labels))


@dataclass(frozen=True)
class Thresholds:
    warn: float = WARN_EFFICIENCY
    fail: float = FAIL_EFFICIENCY
    verdict: bool = True  # False: report efficiency without a verdict (CPU ranks)

    def status(self, efficiency: float) -> Status:
        if not self.verdict or efficiency >= self.warn:
            return Status.PASS
        return Status.FAIL if efficiency < self.fail else Status.WARN


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "-"


def _cause_finding(s: CountSummary, cause: str, status: Status, machine: Machine) -> Finding:
    where = f"{s.model} on {machine.count(s.gpus)}"
    c = s.critical
    lost = s.contributions[cause]
    evidence: dict[str, Any] = {
        "model": s.model,
        "gpus": s.gpus,
        "step_ms": round(s.step_ms, 3),
        "lost_ms": round(lost, 3),
        "contributions_ms": {k: round(v, 3) for k, v in s.contributions.items()},
    }
    if cause == "communication":
        text = (
            f"{where} is communication bound: {c.comm_ms:.1f} ms of each {c.step_median_ms:.1f} ms step "
            f"({_pct(c.comm_ms, c.step_median_ms)}) waits for communication compute did not hide"
        )
        grad = s.grad_allreduce
        if grad:
            text += (
                f"; its {size(grad['bytes'])} of gradients all-reduce in {grad['time_ms']:.1f} ms at "
                f"{grad['busbw_gbps']:.2f} GB/s busbw"
            )
            evidence["grad_allreduce"] = grad
        links = machine.links(s.gpus)
        if links:
            text += f" over {links}"
            evidence["links"] = links
        expect = machine.expect(s.gpus)
        if expect is not None and grad:
            ratio = grad["busbw_gbps"] / expect.busbw_gbps if expect.busbw_gbps else 0.0
            evidence |= expect.to_json() | {"busbw_ratio": round(ratio, 3)}
            verdict = "the links are slow (see GD601)" if ratio < 0.8 else "the links run as they should"
            text += f"; these GPUs should reach {expect.busbw_gbps:.1f} GB/s ({expect.basis}): {verdict}"
        best = max(s.projected.items(), key=lambda kv: kv[1], default=None)
        if best is not None and best[0] > 1:
            evidence["projected_efficiency"] = {str(k): round(v, 3) for k, v in s.projected.items()}
            text += f"; {best[0]} micro-batches per all-reduce would bring efficiency to {best[1]:.2f} (projected)"
        return Finding(COMM_BOUND.code, status, "host", text, COMM_BOUND.fix, evidence)
    if cause == "straggler":
        evidence |= {"rank": c.rank, "busy_ms": round(c.busy_ms, 3), "ratio": round(s.straggler_ratio, 3)}
        text = (
            f"{where}: {machine.label(c.rank)} is a straggler: its input + compute takes {c.busy_ms:.1f} ms per "
            f"step, {s.straggler_ratio:.2f}x the other ranks' median; every rank waits for it in the all-reduce"
        )
        return Finding(STRAGGLER.code, status, machine.subject(c.rank), text, STRAGGLER.fix, evidence)
    if cause == "input":
        median_input = _median(r.input_ms for r in s.ranks)
        evidence["input_ms"] = round(median_input, 3)
        text = (
            f"{where} is input bound: handing each step's batch to the device takes {median_input:.2f} ms "
            f"({_pct(median_input, s.critical.step_median_ms)} of the step), {lost:.2f} ms more than on one "
            f"{machine.unit}"
        )
        return Finding(INPUT_BOUND.code, status, "host", text, INPUT_BOUND.fix, evidence)
    others = [r for r in s.ranks if r is not c] or [c]
    typical = _median(r.compute_ms for r in others)
    evidence["compute_ms"] = round(typical, 3)
    text = (
        f"{where}: each {machine.unit} computes slower with the others running: {typical:.1f} ms per step "
        f"against {typical - lost:.1f} ms alone ({typical / (typical - lost):.2f}x)"
        if typical > lost
        else f"{where}: compute per step grew by {lost:.1f} ms"
    )
    return Finding(CONTENTION.code, status, "host", text, CONTENTION.fix, evidence)


def judge_model(summaries: list[CountSummary], machine: Machine, thresholds: Thresholds) -> list[Finding]:
    """GD720 per GPU count, with the cause (GD721-GD724) of a low efficiency, and GD726."""
    findings: list[Finding] = []
    if len(summaries) < 2:
        s = summaries[0]
        return [
            Finding(
                EFFICIENCY.code,
                Status.SKIP,
                "host",
                f"{s.model}: {s.samples_per_s:,.1f} samples/s on one {machine.unit}; nothing to scale to "
                f"(one {machine.unit} {'visible' if machine.gpus else 'given'})",
                "",
                s.to_json(),
            )
        ]
    for s in summaries[1:]:
        status = thresholds.status(s.efficiency)
        where = f"{s.model} on {machine.count(s.gpus)}"
        text = f"{where}: {s.samples_per_s:,.1f} samples/s, speedup {s.speedup:.2f}x, efficiency {s.efficiency:.2f}"
        if not thresholds.verdict:
            text += " (CPU ranks share this machine's cores: no verdict unless --warn-below/--fail-below)"
        elif status is not Status.PASS:
            limit = thresholds.fail if status is Status.FAIL else thresholds.warn
            text += f", below {limit:.2f}"
        cause = s.cause() if s.efficiency < thresholds.warn else None
        if cause is not None:
            text += (
                f"; lost mostly to {cause} ({s.contributions[cause]:.1f} ms of a {s.critical.step_median_ms:.1f} ms "
                "step)"
            )
        evidence = s.to_json() | {
            "warn_below": thresholds.warn,
            "fail_below": thresholds.fail,
            "verdict": thresholds.verdict,
            "source": THRESHOLD_SOURCE,
        }
        findings.append(
            Finding(EFFICIENCY.code, status, "host", text, "" if status is Status.PASS else EFFICIENCY.fix, evidence)
        )
        if cause is not None:
            findings.append(_cause_finding(s, cause, status, machine))
    for s in summaries:
        c = s.critical
        if abs(c.accounted - 1.0) > SPLIT_TOLERANCE:
            total = c.input_ms + c.compute_ms + c.comm_ms
            findings.append(
                Finding(
                    SPLIT.code,
                    Status.WARN,
                    "host",
                    f"{s.model} on {machine.count(s.gpus)}: input + compute + communication account for "
                    f"{c.accounted:.0%} of the measured step (median over steps; {total:.1f} of "
                    f"{c.step_median_ms:.1f} ms): the split is not reliable for this count",
                    SPLIT.fix,
                    {"rank": c.rank, "accounted": round(c.accounted, 4), "tolerance": SPLIT_TOLERANCE},
                )
            )
    return findings


def judge_dataparallel(
    record: dict[str, Any], summaries: list[CountSummary], machine: Machine, config: dict[str, Any], device: str
) -> Finding | None:
    """GD727: DataParallel's throughput and GPU-0 memory beside DDP's on the same GPUs."""
    dp = record.get("dataparallel")
    model = record["model"]
    why = ""
    if device != "cuda":
        why = (
            "on CPU ranks: it splits each batch across CUDA devices from one process, and without GPUs it "
            "would run the module unchanged on one device"
        )
    elif dp is None and not machine.gpus:
        why = "under torchrun/srun: it runs in one process over one node's GPUs, not across the launcher's ranks"
    elif dp is None and len(machine.gpus) < 2:
        why = "it needs 2 or more GPUs"
    if why:
        return Finding(DATAPARALLEL.code, Status.SKIP, "host", f"{model}: DataParallel skipped {why}", "", {})
    if dp is None:
        return None  # --no-dataparallel
    n = dp["gpus"]
    ddp = next((s for s in summaries if s.gpus == n), None)
    per_step = n * record["sizes"]["batch"] * config["accum"]  # the same per-GPU batch
    dp_sps = per_step * 1000.0 / dp["step_ms"] if dp["step_ms"] > 0 else 0.0
    peaks = dp["peak_mem_bytes"]
    gpu0, rest = peaks[0], _median(peaks[1:]) if len(peaks) > 1 else peaks[0]
    ddp_peaks = [r.peak_mem_bytes for r in ddp.ranks if r.peak_mem_bytes is not None] if ddp else []
    text = f"{model} on {n} GPUs: DataParallel {dp_sps:,.1f} samples/s"
    if ddp is not None:
        text += f" against DDP {ddp.samples_per_s:,.1f} (DDP {ddp.samples_per_s / dp_sps:.2f}x)" if dp_sps else ""
    text += (
        f"; DataParallel peak memory GPU {machine.gpus[0]} {size(gpu0)} against {size(rest)} on the others"
        f" ({gpu0 / rest:.2f}x)"
        if rest
        else ""
    )
    if ddp_peaks:
        text += f"; DDP {size(max(ddp_peaks))} at most per GPU"
    evidence = {
        "gpus": n,
        "dataparallel_samples_per_s": round(dp_sps, 3),
        "dataparallel_step_ms": dp["step_ms"],
        "ddp_samples_per_s": round(ddp.samples_per_s, 3) if ddp else None,
        "dataparallel_peak_mem_bytes": peaks,
        "ddp_peak_mem_bytes": ddp_peaks,
        "samples_per_step": per_step,
    }
    return Finding(DATAPARALLEL.code, Status.PASS, "host", text, "", evidence)


def model_table(record: dict[str, Any], summaries: list[CountSummary], machine: Machine, config: dict) -> dict:
    rows = []
    for s in summaries:
        c = s.critical
        rows.append(
            [
                s.gpus,
                f"{s.samples_per_s:,.1f}",
                f"{s.speedup:.2f}x",
                f"{s.efficiency:.2f}",
                f"{s.step_ms:.1f}",
                f"{c.input_ms:.2f}",
                f"{c.compute_ms:.1f}",
                f"{c.comm_ms:.1f}",
                f"{c.accounted:.0%}",
                (s.cause() if s.gpus > 1 and s.efficiency < WARN_EFFICIENCY else None) or "-",
            ]
        )
    params = record["params"]
    amp = config["amp"] if config["amp"] != "off" else "fp32"
    accum = f", {config['accum']} micro-batches per step" if config["accum"] > 1 else ""
    return {
        "title": f"{record['model']} ({params / 1e6:.2f} M parameters, {size(params * 4)} of gradients; "
        f"batch {record['sizes']['batch']} per {machine.unit}{accum}, {amp}; ms per step, the split in medians "
        "on the slowest rank)",
        "columns": [
            machine.unit + "s",
            "samples/s",
            "speedup",
            "eff.",
            "step",
            "input",
            "compute",
            "comm",
            "sum",
            "lost to",
        ],
        "rows": rows,
    }


def projection_table(record: dict[str, Any], summaries: list[CountSummary], machine: Machine) -> dict | None:
    scaled = [s for s in summaries if s.projected]
    if not scaled:
        return None
    return {
        "title": f"{record['model']}: efficiency with N micro-batches per all-reduce "
        "(projected from the measured split)",
        "columns": [machine.unit + "s", *(f"N={n}" for n in ACCUM_PROJECTIONS)],
        "rows": [[s.gpus, *(f"{s.projected[n]:.2f}" for n in ACCUM_PROJECTIONS)] for s in scaled],
    }


def dataparallel_table(record: dict[str, Any], machine: Machine) -> dict | None:
    dp = record.get("dataparallel")
    if not dp or not machine.gpus:
        return None
    rows = [[f"GPU {machine.gpus[i]}", size(b)] for i, b in enumerate(dp["peak_mem_bytes"])]
    return {
        "title": f"{record['model']}: DataParallel peak memory per GPU ({dp['step_ms']:.1f} ms per step)",
        "columns": ["gpu", "peak memory"],
        "rows": rows,
    }


def judge(
    data: dict[str, Any], machine: Machine, thresholds: Thresholds
) -> tuple[list[Finding], list[dict[str, Any]], list[dict[str, Any]]]:
    """Findings, details tables and summary rows (JSON) for the scaling workload's result."""
    findings: list[Finding] = []
    tables: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    config = data["config"]
    for record in data["models"]:
        summaries = summarize(record, config)
        rows += [s.to_json() for s in summaries]
        tables.append(model_table(record, summaries, machine, config))
        for extra in (projection_table(record, summaries, machine), dataparallel_table(record, machine)):
            if extra is not None:
                tables.append(extra)
        findings += judge_model(summaries, machine, thresholds)
        dp = judge_dataparallel(record, summaries, machine, config, data["device"])
        if dp is not None:
            findings.append(dp)
    return findings, tables, rows


def not_completed(result: Any, label: Callable[[Any], str]) -> Finding:
    """GD725: who failed, and in which model and GPU count (the phase it was in)."""
    if result.setup_error is not None:
        return Finding(
            NOT_RUN.code,
            Status.FAIL,
            "host",
            f"scaling bench did not start: {result.setup_error['message']}",
            NOT_RUN.fix,
            {"launch": result.to_json()},
        )
    # (no rank is blamed for a lost connection while another local process could have caused it)
    suspects = result.suspects() or ([] if result.interference() else result.failed_ranks())
    first = next(iter(suspects), None)
    who = ", ".join(label(r) for r in suspects) or "a rank"
    msg = f"scaling bench did not complete: {who} failed"
    if first is not None:
        msg += f" during {first.phase}"
        if first.error:
            msg += f" ({first.error[:200]})"
    msg += interference_clause(result)
    subject = f"rank:{first.rank}" if first is not None and len(suspects) == 1 else "host"
    return Finding(NOT_RUN.code, Status.FAIL, subject, msg, NOT_RUN.fix, {"launch": result.to_json()})
