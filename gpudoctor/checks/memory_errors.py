"""GD80x, GD829-830 (GPU health): GPU memory errors. Uncorrectable ECC errors (since the driver
loaded and over the GPU's life, split into SRAM and DRAM where NVML gives it), retired pages and
row remaps waiting for a reset, failed remaps, the SRAM RMA threshold and DRAM banks out of spare rows."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from gpudoctor.checks.lost_gpus import readable
from gpudoctor.checks.targets import target_gpus
from gpudoctor.checks.unread import Reading, coverage, not_supported_finding, unreadable_findings
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge.units import gpu_list
from gpudoctor.snapshot import Gpu, known

_RMA = "If it comes back after a reset, the GPU is failing: drain the node and contact the vendor (RMA)."

ECC_VOLATILE = Code(
    "GD801",
    "ecc-uncorrectable-volatile",
    "No uncorrectable ECC errors since the driver loaded",
    what="Reads the volatile (since the last driver load or GPU reset) count of uncorrectable ECC "
    "memory errors on each GPU the run uses.",
    why="An uncorrectable ECC error corrupts data in GPU memory; CUDA kills the context ('uncorrectable "
    "ECC error encountered') and in a multi-GPU job one rank dies while the others wait in NCCL "
    "until the watchdog timeout.",
    fix="Stop the jobs on the GPU, reset it (`sudo nvidia-smi -r -i <gpu>`) or reboot, then re-run gpudoctor. " + _RMA,
)
ECC_AGGREGATE = Code(
    "GD802",
    "ecc-uncorrectable-aggregate",
    "No uncorrectable ECC errors over the GPU's lifetime",
    what="Reads the aggregate (lifetime, kept in the GPU's InfoROM) count of uncorrectable ECC errors.",
    why="A GPU that has had uncorrectable errors before is more likely to have them again; with no "
    "volatile errors now it runs, but it is the first suspect when jobs on this node crash.",
    fix="Watch the count (`nvidia-smi -q -d ECC`). If it grows, or pages/rows keep being retired or "
    "remapped, drain the node and contact the vendor.",
)
RETIRED_PENDING = Code(
    "GD803",
    "retired-pages-pending",
    "No retired memory pages waiting for a reset",
    what="Reads whether the GPU has memory pages marked for retirement that take effect only after "
    "the next GPU reset or reboot (page retirement: Volta and older datacentre GPUs).",
    why="Until the reset the bad pages stay in use and can raise more ECC errors mid-run.",
    fix="Reset the GPU (`sudo nvidia-smi -r -i <gpu>`) or reboot when no job uses it. " + _RMA,
)
REMAP_PENDING = Code(
    "GD804",
    "row-remap-pending",
    "No memory row remapping waiting for a reset",
    what="Reads the row-remapping state (nvmlDeviceGetRemappedRows, Ampere and later): whether a remap is pending.",
    why="A pending remap means a memory row failed and the spare row is used only after a GPU reset; "
    "DCGM fails the GPU until then, and jobs may hit the bad row.",
    fix="Reset the GPU (`sudo nvidia-smi -r -i <gpu>`) or reboot when no job uses it, then re-run gpudoctor.",
)
REMAP_FAILED = Code(
    "GD805",
    "row-remap-failed",
    "Memory row remapping has not failed",
    what="Reads the row-remapping state (nvmlDeviceGetRemappedRows): whether a remap failed.",
    why="A failed remap means the GPU ran out of spare rows in a bank: the memory fault cannot be "
    "repaired and the GPU will keep producing uncorrectable errors.",
    fix="Take the GPU out of service and contact the vendor (RMA); a reset does not fix it.",
)
SRAM_THRESHOLD = Code(
    "GD829",
    "sram-uncorrectable",
    "No uncorrectable SRAM errors, and the SRAM RMA threshold not reached",
    what="Reads the uncorrectable ECC errors of the GPU's on-chip SRAM (L2 cache, register files, "
    "microcontrollers: nvmlDeviceGetSramEccErrorStatus) apart from the HBM/DRAM ones, and NVIDIA's SRAM "
    "threshold flag: set by more than 4 unique uncorrectable parity events, or more than 2 SEC-DED ones, "
    "in one address bank. The flag set fails; uncorrectable SRAM errors below it warn.",
    why="NVIDIA's RMA policy (GPU Memory Error Management, 'RMA Policy'): the SRAM threshold flag means the "
    "GPU qualifies for replacement. SRAM cannot be remapped the way DRAM rows can, so these errors keep "
    "crashing jobs on that GPU.",
    fix="Flag set: drain the node, run NVIDIA's field diagnostic and open an RMA with the vendor. Errors "
    "below the threshold: watch `nvidia-smi -q -d ECC` (Aggregate Uncorrectable SRAM Sources) and plan the "
    "replacement if they grow.",
)
REMAP_EXHAUSTED = Code(
    "GD830",
    "row-remap-banks-exhausted",
    "Every DRAM bank still has spare rows",
    what="Reads the row-remapper histogram (nvmlDeviceGetRowRemapperHistogram; nvidia-smi -q 'Bank Remap "
    "Availability Histogram'): how many DRAM banks have all, most, some, few or no spare rows left. A "
    "bank with none left warns.",
    why="Row remapping repairs an uncorrectable DRAM error by swapping in a spare row of the same bank. In "
    "a bank with no spare rows left, the next uncorrectable error is a row-remap failure: NVIDIA's RMA "
    "criterion (a remap attempt on a bank that already has eight rows remapped).",
    fix="Plan the GPU's replacement before the next error; watch `nvidia-smi -q -d ROW_REMAPPER`. Nothing "
    "to do on the host: the spare rows are hardware.",
)
CODES = [ECC_VOLATILE, ECC_AGGREGATE, RETIRED_PENDING, REMAP_PENDING, REMAP_FAILED, SRAM_THRESHOLD, REMAP_EXHAUSTED]


def _where_errors(gpu: Gpu, scope: str, total: int) -> tuple[str, dict[str, Any]]:
    """' (SRAM 2, DRAM 0)' and its evidence, where NVML splits the count by memory.

    The split is shown only when both parts are known and add up to the total NVML reports
    (nvmlDeviceGetTotalEccErrors counts every memory location: SRAM and DRAM together). A
    recording that predates the split, or a driver that gives only one part, says it is unknown
    rather than print a split that contradicts its own total."""
    sram_ecc, dram = gpu.sram_ecc, getattr(gpu, f"ecc_uncorrected_dram_{scope}")
    if known(sram_ecc) and known(dram):
        sram = getattr(sram_ecc, f"{scope}_uncorrectable")
        if sram + dram == total:
            return f" (SRAM {sram}, DRAM {dram})", {"sram": sram, "dram": dram}
    return " (SRAM/DRAM split unknown)", {"split": "unknown"}


def _ecc_counts(gpu: Gpu) -> list[Finding]:
    subject = gpu_subject(gpu.index)
    volatile = gpu.ecc_uncorrected_volatile
    aggregate = gpu.ecc_uncorrected_aggregate
    if known(volatile) and volatile > 0:
        where, split = _where_errors(gpu, "volatile", volatile)
        return [
            Finding(
                ECC_VOLATILE.code,
                Status.FAIL,
                subject,
                f"{volatile} uncorrectable ECC error(s) since the driver loaded{where}",
                "Reset the GPU or reboot; if errors return, drain the node (RMA).",
                {"ecc_uncorrected_volatile": volatile, **split, "expected": 0},
            )
        ]
    if known(aggregate) and aggregate > 0:
        where, split = _where_errors(gpu, "aggregate", aggregate)
        return [
            Finding(
                ECC_AGGREGATE.code,
                Status.WARN,
                subject,
                f"{aggregate} uncorrectable ECC error(s) over the GPU's lifetime{where}, none since the driver loaded",
                "Watch `nvidia-smi -q -d ECC`; if the count grows, drain the node and contact the vendor.",
                {"ecc_uncorrected_aggregate": aggregate, **split, "expected": 0},
            )
        ]
    return []


def _sram(gpu: Gpu) -> list[Finding]:
    sram = gpu.sram_ecc
    if not known(sram) or not (sram.threshold_exceeded or sram.aggregate_uncorrectable):
        return []
    evidence = {
        "aggregate_uncorrectable_parity": sram.aggregate_uncorrectable_parity,
        "aggregate_uncorrectable_secded": sram.aggregate_uncorrectable_secded,
        "threshold_exceeded": sram.threshold_exceeded,
        "rma_threshold": "more than 4 unique parity or 2 unique SEC-DED events in one bank",
    }
    if sram.threshold_exceeded:
        return [
            Finding(
                SRAM_THRESHOLD.code,
                Status.FAIL,
                gpu_subject(gpu.index),
                f"the SRAM uncorrectable-error threshold is exceeded ({sram.aggregate_uncorrectable} over the "
                "GPU's life): NVIDIA's RMA criterion",
                "Drain the node, run NVIDIA's field diagnostic and open an RMA with the vendor.",
                evidence,
            )
        ]
    return [
        Finding(
            SRAM_THRESHOLD.code,
            Status.WARN,
            gpu_subject(gpu.index),
            f"{sram.aggregate_uncorrectable} uncorrectable SRAM error(s) over the GPU's life "
            f"({sram.aggregate_uncorrectable_parity} parity, {sram.aggregate_uncorrectable_secded} SEC-DED); "
            "NVIDIA's RMA threshold is not reached",
            "Watch `nvidia-smi -q -d ECC`; plan a replacement if the count grows.",
            evidence,
        )
    ]


def _remap_banks(gpu: Gpu) -> list[Finding]:
    hist = gpu.remap_histogram
    if not known(hist) or hist.none == 0:
        return []
    banks = hist.max + hist.high + hist.partial + hist.low + hist.none
    return [
        Finding(
            REMAP_EXHAUSTED.code,
            Status.WARN,
            gpu_subject(gpu.index),
            f"{hist.none} of {banks} DRAM banks have no spare rows left ({hist.low} more have few): the next "
            "uncorrectable error in one of them is a row-remap failure, an RMA case",
            "Plan the GPU's replacement; watch `nvidia-smi -q -d ROW_REMAPPER`.",
            {
                "histogram": {
                    "max": hist.max,
                    "high": hist.high,
                    "partial": hist.partial,
                    "low": hist.low,
                    "none": hist.none,
                }
            },
        )
    ]


def _gpu_memory_errors(gpu: Gpu) -> list[Finding]:
    out: list[Finding] = [*_ecc_counts(gpu), *_sram(gpu), *_remap_banks(gpu)]
    subject = gpu_subject(gpu.index)
    if gpu.retired_pages_pending is True:
        out.append(
            Finding(
                RETIRED_PENDING.code,
                Status.FAIL,
                subject,
                "retired memory pages are pending: they take effect at the next GPU reset",
                f"Reset the GPU (sudo nvidia-smi -r -i {gpu.index}) or reboot when it is idle.",
                {"retired_pages_pending": True, "expected": False},
            )
        )
    rows = gpu.remapped_rows
    if known(rows):
        evidence = {
            "correctable": rows.correctable,
            "uncorrectable": rows.uncorrectable,
            "pending": rows.pending,
            "failed": rows.failed,
        }
        if rows.failed:
            out.append(
                Finding(
                    REMAP_FAILED.code,
                    Status.FAIL,
                    subject,
                    "memory row remapping failed: no spare rows left, the fault cannot be repaired",
                    "Take the GPU out of service and contact the vendor (RMA).",
                    {**evidence, "expected": "failed: false"},
                )
            )
        elif rows.pending:
            out.append(
                Finding(
                    REMAP_PENDING.code,
                    Status.FAIL,
                    subject,
                    "a memory row remap is pending: the GPU needs a reset",
                    f"Reset the GPU (sudo nvidia-smi -r -i {gpu.index}) or reboot when it is idle.",
                    {**evidence, "expected": "pending: false"},
                )
            )
    return out


# What memory_errors reads on each GPU. NOT_SUPPORTED is a fact for every one of them: GeForce and
# workstation cards without ECC report no ECC counters, page retirement is for Volta and older
# datacentre GPUs, row remapping for Ampere and later ones, the SRAM split and the bank histogram
# need newer drivers (tests/reference/nvidia_smi_q_h100.md: a 535 driver on A100).
MEMORY_READINGS = (
    Reading(ECC_VOLATILE.code, "volatile ECC errors", attrgetter("ecc_uncorrected_volatile")),
    Reading(ECC_AGGREGATE.code, "lifetime ECC errors", attrgetter("ecc_uncorrected_aggregate")),
    Reading(RETIRED_PENDING.code, "retired pages", attrgetter("retired_pages_pending")),
    Reading(REMAP_PENDING.code, "row remapping", attrgetter("remapped_rows")),
    Reading(SRAM_THRESHOLD.code, "SRAM errors", attrgetter("sram_ecc")),
    Reading(REMAP_EXHAUSTED.code, "remap bank histogram", attrgetter("remap_histogram")),
)


@check("memory_errors", "GPU memory errors (ECC, retired pages, row remapping)", codes=CODES, needs="visible")
def memory_errors(ctx: CheckContext) -> list[Finding]:
    gpus = readable(target_gpus(ctx))
    unknown = unreadable_findings(gpus, MEMORY_READINGS)
    findings = [f for g in gpus for f in _gpu_memory_errors(g)]
    if findings:
        return unknown + findings
    cov = coverage(gpus, MEMORY_READINGS)
    if not cov.judged:
        if not cov.not_supported:
            return unknown
        what = "memory error counters (ECC, retired pages, row remapping)"
        why = "GPUs without ECC memory, such as GeForce cards, have none"
        return [*unknown, not_supported_finding(ECC_VOLATILE.code, what, cov.not_supported, why)]
    sram = [g.index for g in gpus if known(g.sram_ecc)]
    banks = [g.index for g in gpus if known(g.remap_histogram)]
    also = "".join(
        (
            f"; SRAM under NVIDIA's RMA threshold on GPU {gpu_list(sram)}" if sram else "",
            f"; every DRAM bank has spare rows on GPU {gpu_list(banks)}" if banks else "",
        )
    )
    evidence = {
        "gpus": cov.read,
        "partly_read": cov.partly,
        "not_supported": cov.not_supported,
        "sram_checked": sram,
        "remap_banks_checked": banks,
    }
    message = cov.passed("no memory errors") + also + cov.not_supported_note()
    return [*unknown, Finding(ECC_VOLATILE.code, Status.PASS, "host", message, "", evidence)]
