"""GD8 (GPU health): memory errors, XID errors in the kernel log, the driver's recovery action,
clocks throttled now. Lost GPUs (GD827) and link error counters (GD831-832) have modules of their
own, registered from here."""

from __future__ import annotations

from collections import defaultdict
from operator import attrgetter
from typing import Any

from gpudoctor import clock_reasons, xid
from gpudoctor.checks.lost_gpus import readable
from gpudoctor.checks.targets import gpu_list, target_gpus
from gpudoctor.checks.unread import Reading, coverage, not_supported_finding, unreadable_findings
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.registry import CheckContext, Code, check
from gpudoctor.snapshot import Gpu, known
from gpudoctor.topology import normalize_bus_id
from gpudoctor.xid import describe

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
XID_HARDWARE = Code(
    "GD810",
    "xid-hardware",
    "No XID errors that need a GPU reset, a reboot or the vendor",
    what="Reads NVIDIA XID errors ('NVRM: Xid (PCI:...): N') from the kernel log, where it is readable, "
    "names the GPU by its PCI address, and looks each up in NVIDIA's XID catalog (Ampere and later). "
    "XIDs whose immediate action is a GPU reset, a power cycle, a reboot, an NVLink or ECC workflow or "
    "a report to NVIDIA fail the GPU: e.g. 48 double-bit ECC, 62/119/120 micro-controller and GSP "
    "faults, 64 row-remap failure, 74 NVLink, 79 fallen off the bus, 95 uncontained ECC, 109 context "
    "switch timeout. Two memory faults the driver already handled warn instead: 63 (a row remap "
    "recorded) and 94 (a contained ECC error). Xid 154 (the GPU recovery action changed) is judged by "
    "the action it names. The kernel log covers the time since boot, so an event may predate a GPU "
    "reset that cleared it.",
    why="A GPU that logged such an XID since boot is likely to hang or crash the next job; in a "
    "multi-GPU run that shows up as an NCCL watchdog timeout on every rank, far from the cause.",
    fix="Do what the finding says (the catalog's immediate action for the XID). Look at "
    "`sudo dmesg -T | grep -i xid`. If the XID returns after the reset or reboot, drain the node and "
    "contact the vendor. For 63/94, check `nvidia-smi -q -d ROW_REMAPPER`: a pending remap needs a "
    "reset (GD804). When the log cannot be read (dmesg_restrict, containers without CAP_SYSLOG), run "
    "gpudoctor on the host as root.",
)
XID_APPLICATION = Code(
    "GD811",
    "xid-application",
    "No application XID errors in the kernel log",
    what="Reports XIDs NVIDIA's catalog files under RESTART_APP: faults a program caused (13 graphics "
    "engine exception, 31 memory page fault, 32, 43-era copy-engine errors...).",
    why="These come from programs (an illegal address, a killed process) rather than the hardware; "
    "they explain earlier crashes, and a stream of them on one GPU hints at a driver or hardware "
    "problem after all.",
    fix="Match the timestamps to your job's crashes and fix the program (run it once with "
    "CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer to find the kernel). If they appear without your "
    "code at fault, treat them as hardware XIDs.",
)
XID_OTHER = Code(
    "GD812",
    "xid-other",
    "Other XIDs in the kernel log: informational, secondary or unknown",
    what="Reports the remaining XIDs: those NVIDIA's catalog says need no action (IGNORE, e.g. 43, 92, 121: "
    "a pass that lists them), 45 (a cleanup after another error: warns, act on the other one) and XIDs "
    "the catalog does not list (warn).",
    why="They give context to other errors; an XID gpudoctor does not know may be a harmless driver notice "
    "or the first sign of a fault.",
    fix="Look the code up in NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors) and act on it; for 45, "
    "act on the XID logged just before it.",
)
RECOVERY_ACTION = Code(
    "GD828",
    "gpu-recovery-action",
    "The driver asks for no recovery action",
    what="Reads the recovery action the driver sets after a fault (NVML field "
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, R570 and later; nvidia-smi -q 'GPU Recovery Action'): none, "
    "GPU reset, node reboot, drain peer-to-peer, drain and reset. As DCGM's health watch does, drain "
    "peer-to-peer warns and every other action fails.",
    why="The driver has seen a fault the GPU cannot run past: until the action is taken, new work fails "
    "or runs at reduced capacity (drain and reset), and the OS may be inconsistent (node reboot).",
    fix="Take the action it names (NVIDIA GPU Memory Error Management, 'Error Recovery and Response "
    "Flags'): reset: stop the GPU's processes and `sudo nvidia-smi -r -i <gpu>`; node reboot: reboot; "
    "drain P2P: stop the processes doing peer-to-peer traffic, disable UVM persistence mode and read the "
    "action again; drain and reset: schedule no new work, reset the GPU once running work has drained.",
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
THROTTLED = Code(
    "GD815",
    "clocks-throttled",
    "Clocks are not held down by heat, power or hardware slowdown",
    what="Reads the clock event (throttle) reasons NVML reports now (nvmlDeviceGetCurrentClocksEventReasons), "
    "ignoring 'GPU idle', application clock settings, sync boost and display clocks. Hardware "
    "slowdown, hardware thermal slowdown and power-brake fail; software thermal slowdown and the "
    "software power cap warn.",
    why="A throttled GPU runs slower than its peers, and in a data-parallel job every step waits for "
    "the slowest GPU. Hardware slowdown (often a power supply or cooling fault) halves clocks or worse.",
    fix="Check cooling (`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`), airflow and fan speed; for power "
    "brake or hardware slowdown check the PSUs and power cabling; for the software power cap check "
    "`nvidia-smi -q -d POWER` for a lowered power limit (`sudo nvidia-smi -pl <watts>`).",
)
ECC_DISABLED = Code(
    "GD833",
    "ecc-disabled",
    "ECC is on for data-centre GPUs the run uses",
    what="Reads each GPU's ECC mode, current and pending (nvmlDeviceGetEccMode: 'only applicable to devices "
    "with ECC'; the pending mode is the one after the next reboot). A GPU whose ECC mode NVML reads has ECC; "
    "on a data-centre GPU (any model whose name is not GeForce, TITAN, Quadro or an RTX workstation card: "
    "A100, H100, H200, B200, V100, A30, A40, L40S, L4, T4...) ECC off now, or set to go off at the next "
    "reboot, warns. GeForce and workstation cards, which ship with ECC off, are compared by GD305 only.",
    why="Data-centre GPUs ship with ECC on. With it off, a flipped bit in HBM or GDDR is neither corrected "
    "nor reported: the run goes on with wrong weights or gradients (silent data corruption), the error "
    "counters GD801-GD805 stay at zero and row remapping never runs. DCGM's memory diagnostic refuses to "
    "judge such a GPU (DCGM_FR_ECC_DISABLED, 'ECC is not enabled on GPU').",
    fix="Turn ECC on: `sudo nvidia-smi -i <gpu> -e 1`, then reboot for it to take effect (NVML: 'takes "
    "effect after the next reboot'); "
    "check with `nvidia-smi -q -d ECC` ('Current' and 'Pending'). If ECC is off on purpose (for the few "
    'percent of memory or bandwidth it costs), say so in a policy: `ignore = ["GD833"]` (docs/gates.md).',
)
HOT_IDLE = Code(
    "GD834",
    "idle-gpu-hot",
    "Idle GPUs are not much hotter than their idle peers (heuristic)",
    what="Compares the temperature of each idle GPU (clock event reason 'GPU idle' set) with the median of "
    "the other idle GPUs of the same model. A GPU at least 25 C hotter than that median and at 60 C or "
    "more warns. These thresholds are gpudoctor's heuristic, not an NVIDIA figure: GPUs of one chassis idle "
    "within a few degrees of each other (28-37 C in the recorded H100, A100 and RTX 40 readings), so a "
    "gap of 25 C at idle is far outside airflow differences between slots.",
    why="A GPU that is hot while doing nothing has a cooling fault: a failed fan, blocked airflow, a heat "
    "sink or thermal interface that came loose. Under load it reaches its slowdown temperature first and "
    "throttles (GD815), and every step of a data-parallel job waits for it.",
    fix="Check the GPU's cooling: fans (`nvidia-smi -q -d TEMPERATURE,FAN`), the chassis airflow and inlet "
    "temperature, blanking panels, the heat sink and its thermal material (DCGM: 'Verify that the cooling "
    "on this machine is functional'). Run `gpudoctor watch` under load to see whether it throttles.",
)
CODES = [ECC_VOLATILE, ECC_AGGREGATE, RETIRED_PENDING, REMAP_PENDING, REMAP_FAILED, SRAM_THRESHOLD, REMAP_EXHAUSTED]
XID_CODES = [XID_HARDWARE, XID_APPLICATION, XID_OTHER]


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


_SINCE_BOOT = "the kernel log covers the time since boot: an event before the last GPU reset may already be cleared"
# What a GPU needs for each recovery action (NVIDIA GPU Memory Error Management, "Error Recovery and
# Response Flags"); DCGM's health watch warns on drain_p2p and fails on the others.
RECOVERY_HINTS = {
    "gpu_reset": "stop all processes on the GPU and reset it (sudo nvidia-smi -r -i {gpu})",
    "node_reboot": "reboot the node: the fault may have left the OS in an inconsistent state",
    "drain_p2p": "stop the processes doing peer-to-peer traffic and disable UVM persistence mode, then read "
    "the recovery action again (nvidia-smi -q -i {gpu})",
    "drain_and_reset": "schedule no new work on the GPU (it runs at reduced capacity) and reset it once running "
    "work has drained (sudo nvidia-smi -r -i {gpu})",
    "bus_reset": "reset the GPU's PCIe bus (sudo nvidia-smi -r bus -i {gpu}) or reboot",
    "system_reboot": "reboot the system",
    "recover_imex_domain": "recover the IMEX domain (multi-node NVLink): restart nvidia-imex on the domain's nodes",
}
WARN_ACTIONS = frozenset({"drain_p2p"})


def recovery_status(action: str) -> Status:
    if action == "none":
        return Status.PASS
    return Status.WARN if action in WARN_ACTIONS else Status.FAIL


def recovery_hint(action: str, gpu: int) -> str:
    return RECOVERY_HINTS.get(action, "look the action up in nvml.h (nvmlDeviceGpuRecoveryAction_t)").format(gpu=gpu)


# NOT_SUPPORTED is a fact: a driver before R570 has no recovery action (nvidia-smi -q prints the older
# reset-status pair instead: tests/reference/nvidia_smi_q_h100.md).
RECOVERY_READING = Reading(RECOVERY_ACTION.code, "GPU recovery action", attrgetter("recovery_action"))


@check("recovery_action", "The driver asks for no recovery action", codes=[RECOVERY_ACTION], needs="gpus")
def recovery_action(ctx: CheckContext) -> list[Finding]:
    used = {g.index for g in target_gpus(ctx)}
    gpus = readable(ctx.snapshot.gpus)
    out = []
    for g in gpus:
        action = g.recovery_action
        if not known(action) or action == "none":
            continue
        status = recovery_status(action)
        note = ""
        if g.index not in used and status is Status.FAIL:
            status, note = Status.WARN, " (a GPU this run does not use)"
        out.append(
            Finding(
                RECOVERY_ACTION.code,
                status,
                gpu_subject(g.index),
                f"the driver asks for a recovery action on GPU {g.index}: {action.replace('_', ' ')}{note}",
                recovery_hint(action, g.index)[:1].upper() + recovery_hint(action, g.index)[1:] + ".",
                {"recovery_action": action, "expected": "none"},
            )
        )
    unknown = unreadable_findings(gpus, [RECOVERY_READING])
    cov = coverage(gpus, [RECOVERY_READING])
    if not out and cov.read:
        message = cov.passed("no recovery action pending") + cov.not_supported_note()
        out.append(Finding(RECOVERY_ACTION.code, Status.PASS, "host", message, "", {"gpus": cov.read}))
    elif not out and cov.not_supported:
        why = "drivers before R570 do not report it"
        out.append(not_supported_finding(RECOVERY_ACTION.code, "GPU recovery action", cov.not_supported, why))
    return unknown + out


def _code_for(kind: str) -> Code:
    if kind in ("hardware", "contained", "recovery"):
        return XID_HARDWARE
    return XID_APPLICATION if kind == "application" else XID_OTHER


_KIND_STATUS = {
    "hardware": Status.FAIL,
    "contained": Status.WARN,
    "application": Status.WARN,
    "secondary": Status.WARN,
    "informational": Status.PASS,
    "other": Status.WARN,
}
_LABEL = {
    "hardware": "hardware",
    "contained": "contained memory fault",
    "application": "application",
    "secondary": "secondary",
    "informational": "informational",
    "other": "unknown",
    "recovery": "recovery-action",
}
_CONTAINED_HINT = (
    "The driver handled it (row remapped, or only the context that hit the ECC error was stopped): check "
    "`nvidia-smi -q -d ROW_REMAPPER`, reset the GPU if a remap is pending (GD804); if these keep coming, "
    "the memory is wearing: plan an RMA."
)


def _recovery_event(evs: list[Any], gpu: Gpu | None) -> tuple[Status, str, str]:
    """Xid 154: the last change the log shows decides, unless NVML says the action is done."""
    target = xid.recovery_target(evs[-1].text)
    action = xid.recovery_name(target) if target is not None else "unknown"
    status = recovery_status(action) if target is not None else Status.WARN
    index = gpu.index if gpu else "<gpu>"
    hint = recovery_hint(action, index) if target is not None else "Read the XID 154 line: it names the action."
    if gpu is not None and gpu.recovery_action == "none" and status is not Status.PASS:
        return Status.PASS, f"{action.replace('_', ' ')}, since done (NVML reports none now)", ""
    return status, action.replace("_", " "), hint[:1].upper() + hint[1:] + "."


def _xid_hint(kind: str, xids: list[int], gpu: Gpu | None) -> str:
    """The catalog's immediate action per XID, the heaviest first (a power cycle before a reset)."""
    if kind == "contained":
        return _CONTAINED_HINT
    by_action: dict[str, list[int]] = {}
    for x in sorted(xids, key=xid.severity_rank):
        by_action.setdefault(xid.action(x), []).append(x)
    index = str(gpu.index) if gpu else "<gpu>"
    parts = [f"XID {', '.join(map(str, xs))}: {act.replace('<gpu>', index)}" for act, xs in by_action.items()]
    return "NVIDIA's XID catalog: " + "; ".join(parts) + "."


@check("xid", "XID errors in the kernel log", codes=XID_CODES, needs="gpus")
def xid_errors(ctx: CheckContext) -> list[Finding]:
    events = ctx.snapshot.host.xid_events
    if not known(events):
        if events.reason == "not_collected":
            return []
        why = {
            "no_permission": "the kernel log is not readable (dmesg_restrict, or a container without CAP_SYSLOG)",
            "unsupported": "this system has no readable kernel log",
        }.get(events.reason, f"the kernel log could not be read ({events.detail or events.reason})")
        return [
            Finding(
                XID_HARDWARE.code,
                Status.SKIP,
                "host",
                f"XIDs not checked: {why}",
                "Run gpudoctor as root on the host (or `sudo sysctl kernel.dmesg_restrict=0`) to read XIDs.",
                {"reason": events.reason},
            )
        ]
    by_bus = {normalize_bus_id(g.pci_bus_id): g for g in ctx.snapshot.gpus if g.pci_bus_id}
    # A lost GPU the run would have used (CUDA no longer enumerates it) is still the run's GPU here.
    lost = set(ctx.visible.lost_wanted)
    targets = {g.index for g in target_gpus(ctx)} | lost
    # A GPU the run uses whose PCI address NVML could not give may be the one an unmatched XID names.
    unplaced = sorted(g.index for g in target_gpus(ctx) if not g.pci_bus_id)
    # (subject, kind) -> events, so each GPU gets one finding per kind of XID.
    grouped: dict[tuple[str, str], list[Any]] = defaultdict(list)
    gpu_of: dict[str, Gpu | None] = {}
    for event in events:
        gpu = by_bus.get(normalize_bus_id(event.pci_bus_id))
        subject = gpu_subject(gpu.index) if gpu else f"pci:{event.pci_bus_id}"
        gpu_of[subject] = gpu
        grouped[(subject, xid.kind(event.xid))].append(event)
    findings = []
    for (subject, kind), evs in grouped.items():
        gpu = gpu_of[subject]
        xids = sorted({e.xid for e in evs})
        if kind == "recovery":
            status, what, hint = _recovery_event(evs, gpu)
            kinds = f"XID 154 (GPU recovery action changed to {what})"
        else:
            status, hint = _KIND_STATUS[kind], _xid_hint(kind, xids, gpu)
            kinds = ", ".join(describe(x) for x in xids)
        used = gpu.index in targets if gpu is not None else bool(unplaced)
        if not used and status is Status.FAIL:
            status = Status.WARN  # a sick GPU the run does not use: worth knowing, not blocking
        if gpu is not None:
            where = f"GPU {gpu.index} ({gpu.pci_bus_id})"
        elif unplaced:
            where = f"PCI {evs[0].pci_bus_id} (maybe GPU {gpu_list(unplaced)}, whose PCI address NVML could not give)"
        else:
            where = f"PCI {evs[0].pci_bus_id} (not a GPU NVML lists)"
        note = (
            ""
            if gpu is None
            else " (lost: see GD827)"
            if gpu.index in lost
            else ""
            if used
            else " (a GPU this run does not use)"
        )
        if hint:
            hint = f"{hint} Note: {_SINCE_BOOT}."
        evidence = {
            "xids": xids,
            "count": len(evs),
            "class": xid.classify(xids[0]),
            "kind": kind,
            "catalog": {str(x): xid.bucket(x) for x in xids},
            "contained": kind == "contained",
            "first": evs[0].timestamp,
            "last": evs[-1].timestamp,
            "last_text": evs[-1].text[:200],
        }
        findings.append(
            Finding(
                _code_for(kind).code,
                status,
                subject,
                f"{_LABEL[kind]} {kinds} on {where}{note}, {len(evs)} time(s) in the kernel log since boot",
                hint,
                evidence,
            )
        )
    if not findings:
        return [Finding(XID_HARDWARE.code, Status.PASS, "host", "no XID errors in the kernel log", "", {"events": 0})]
    return findings


def _throttle_finding(gpu: Gpu) -> Finding | None:
    mask = gpu.clock_event_reasons
    if not known(mask):
        return None
    active = clock_reasons.slowdowns(mask)
    if not active:
        return None
    status = Status.FAIL if any(r.severe for r in active) else Status.WARN
    names = [r.label for r in active]
    kinds = {r.kind for r in active}
    evidence: dict[str, Any] = {"clock_event_reasons": f"0x{mask:x}", "active": names, "expected": "none"}
    if known(gpu.temperature_c):
        evidence["temperature_c"] = gpu.temperature_c
    if known(gpu.power_draw_w):
        evidence["power_draw_w"] = gpu.power_draw_w
    if known(gpu.power_limit_w):
        evidence["power_limit_w"] = gpu.power_limit_w
    if clock_reasons.THERMAL in kinds:
        hint = "Check cooling: fans, airflow, inlet temperature (`nvidia-smi -q -d TEMPERATURE`)."
    elif clock_reasons.HARDWARE in kinds or any(r.severe for r in active):
        hint = "Check the power supplies and cabling and `nvidia-smi -q -d PERFORMANCE`; reboot; then the vendor."
    else:
        hint = "Check the power limit (`nvidia-smi -q -d POWER`); raise it with `sudo nvidia-smi -pl <watts>`."
    return Finding(
        THROTTLED.code, status, gpu_subject(gpu.index), f"clocks throttled now: {', '.join(names)}", hint, evidence
    )


# Clock event reasons: nvml.h documents them for every fully supported GPU. NOT_SUPPORTED from both
# the new and the old call name (probe/gpus.py tries both) is read as this GPU/driver not reporting
# them: a skip, not a warning.
CLOCK_READING = Reading(THROTTLED.code, "clock event reasons", attrgetter("clock_event_reasons"))


@check("clocks", "GPU clocks not throttled", codes=[THROTTLED], needs="visible")
def clocks(ctx: CheckContext) -> list[Finding]:
    gpus = target_gpus(ctx)
    unknown = unreadable_findings(gpus, [CLOCK_READING])
    findings = [f for f in (_throttle_finding(g) for g in gpus) if f is not None]
    if findings:
        return unknown + findings
    cov = coverage(gpus, [CLOCK_READING])
    if cov.read:
        message = cov.passed("no throttling") + cov.not_supported_note()
        return [*unknown, Finding(THROTTLED.code, Status.PASS, "host", message, "", {"gpus": cov.read})]
    if cov.not_supported:
        return [*unknown, not_supported_finding(THROTTLED.code, "clock event reasons", cov.not_supported)]
    return unknown


# Product names of cards that ship with ECC off (GeForce, TITAN, Quadro and RTX workstation boards):
# their ECC mode is the owner's choice, compared across GPUs by GD305. Data-centre boards ship with it
# on. A server board with RTX in its name ("RTX PRO 6000 Blackwell Server Edition") is data-centre.
_ECC_OFF_BY_DEFAULT = ("geforce", "titan", "quadro", "rtx")


def ecc_expected_on(gpu: Gpu) -> bool:
    """A data-centre GPU whose ECC mode NVML reads (readable: the board has ECC): GD833 judges it."""
    if not (known(gpu.ecc_mode_current) or known(gpu.ecc_mode_pending)):
        return False
    name = gpu.name.lower()
    return "server edition" in name or not any(word in name for word in _ECC_OFF_BY_DEFAULT)


def _ecc_state(gpu: Gpu) -> str:
    """'on', 'off', 'off_until_reboot' (off now, on after the next reboot) or 'off_after_reboot'."""
    now, later = gpu.ecc_mode_current, gpu.ecc_mode_pending
    if now is False:
        return "off_until_reboot" if later is True else "off"
    if later is False:
        return "off_after_reboot"
    return "on"


_ECC_WORDS = {
    "off": "ECC is off",
    "off_until_reboot": "ECC is off until the next reboot (pending: on)",
    "off_after_reboot": "ECC is on but set to go off at the next reboot (pending: off)",
}
_ECC_HINTS = {
    "off": "sudo nvidia-smi -i {gpus} -e 1, then reboot; check with nvidia-smi -q -d ECC.",
    "off_until_reboot": "Reboot to apply the pending ECC mode; check with nvidia-smi -q -d ECC.",
    "off_after_reboot": "sudo nvidia-smi -i {gpus} -e 1 before the next reboot, unless turning ECC off is intended.",
}


@check("ecc_mode", "ECC on for data-centre GPUs", codes=[ECC_DISABLED], needs="visible")
def ecc_mode(ctx: CheckContext) -> list[Finding]:
    gpus = [g for g in readable(target_gpus(ctx)) if ecc_expected_on(g)]
    if not gpus:
        return []
    by_state: dict[str, list[Gpu]] = {}
    for g in gpus:
        by_state.setdefault(_ecc_state(g), []).append(g)
    out = []
    for state, group in by_state.items():
        if state == "on":
            continue
        indices = [g.index for g in group]
        subject = gpu_subject(indices[0]) if len(indices) == 1 else "host"
        where = ("GPU " if len(indices) == 1 else "GPUs ") + gpu_list(indices)
        models = ", ".join(sorted({g.name for g in group}))
        message = (
            f"{_ECC_WORDS[state]} on {where} ({models}): a memory error there is neither corrected nor "
            "reported, the run computes on with corrupted data"
        )
        evidence = {
            "gpus": indices,
            "ecc_mode_current": {str(g.index): _value(g.ecc_mode_current) for g in group},
            "ecc_mode_pending": {str(g.index): _value(g.ecc_mode_pending) for g in group},
            "expected": "on",
        }
        hint = _ECC_HINTS[state].format(gpus=",".join(map(str, indices)))
        out.append(Finding(ECC_DISABLED.code, Status.WARN, subject, message, hint, evidence))
    if out:
        return out
    indices = [g.index for g in gpus]
    message = f"ECC on, now and after the next reboot, on GPU {gpu_list(indices)}"
    return [Finding(ECC_DISABLED.code, Status.PASS, "host", message, "", {"gpus": indices})]


def _value(v: Any) -> Any:
    return v if known(v) else None


# Heuristic thresholds (no NVIDIA figure exists for idle temperature spread): GPUs of one chassis idle
# within a few degrees (28-37 C across the recorded fixtures; tests/reference/
# ecc_mode_and_idle_temperature.md), so 25 C above the idle peers' median,
# and warm in absolute terms, is a cooling fault rather than a slot's airflow.
HOT_IDLE_GAP_C = 25
HOT_IDLE_MIN_C = 60


def _idle(gpu: Gpu) -> bool:
    reasons = gpu.clock_event_reasons
    return known(reasons) and bool(reasons & clock_reasons.GPU_IDLE) and known(gpu.temperature_c)


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@check("idle_temperature", "Idle GPUs not much hotter than their peers (heuristic)", codes=[HOT_IDLE], needs="visible")
def idle_temperature(ctx: CheckContext) -> list[Finding]:
    models: dict[str, list[Gpu]] = {}
    for g in readable(target_gpus(ctx)):
        if _idle(g):
            models.setdefault(g.name, []).append(g)
    out, judged = [], []
    for group in models.values():
        if len(group) < 2:
            continue
        judged += group
        for g in group:
            peers = [int(p.temperature_c) for p in group if p is not g]
            reference = _median(peers)
            temp = int(g.temperature_c)
            if temp - reference < HOT_IDLE_GAP_C or temp < HOT_IDLE_MIN_C:
                continue
            evidence = {
                "temperature_c": temp,
                "peers_median_c": reference,
                "peers": {str(p.index): p.temperature_c for p in group if p is not g},
                "threshold": f"{HOT_IDLE_GAP_C} C above the idle peers' median and at least {HOT_IDLE_MIN_C} C",
                "heuristic": True,
            }
            out.append(
                Finding(
                    HOT_IDLE.code,
                    Status.WARN,
                    gpu_subject(g.index),
                    f"GPU {g.index} is at {temp} C while idle, its idle peers at {reference:g} C (median): a "
                    "cooling fault (fan, airflow, heat sink) that will throttle it under load (heuristic)",
                    "Check the GPU's fans and airflow (nvidia-smi -q -d TEMPERATURE,FAN), then its heat sink.",
                    evidence,
                )
            )
    if out or not judged:
        return out
    temps = [int(g.temperature_c) for g in judged]
    message = f"{len(judged)} idle GPUs at {min(temps)}-{max(temps)} C: none much hotter than its peers"
    return [Finding(HOT_IDLE.code, Status.PASS, "host", message, "", {"gpus": sorted(g.index for g in judged)})]
