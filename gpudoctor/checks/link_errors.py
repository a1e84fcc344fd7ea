"""GD831/GD832: NVLink and PCIe links that are erroring now, not just once since boot.

The probe reads each active NVLink's error counters and the PCIe replay counter twice, at the
start and at the end of the probe (`Gpu.error_window_s` apart). A counter that rose in between
is a link erroring now. The thresholds are DCGM's health watches (NVIDIA/DCGM,
modules/health/DcgmHealthWatch.cpp and common/DcgmGPUHardwareLimits.h), which judge the rise of
the same counters over a one-minute window:

- NVLink replay or recovery errors: any rise fails (DCGM_LIMIT_MAX_NVLINK_ERROR = 1; "Replay and
  recovery errors are failures, not warnings").
- NVLink CRC (flit, data) errors: a rise warns; 100 or more per second fails
  (DCGM_LIMIT_MAX_NVLINK_CRC_ERROR = 100: "CRC errors only matter at rates of 100+ per second").
  The rate is taken over at least one second, so a single error in a short window is no storm.
- PCIe replays: more than DCGM's per-minute allowance warns: one error per 10^12 bits per lane
  at the link's speed (2.5, 5, 8, 16, 32, 64 GT/s for Gen1-6: 0.15 ... 3.84 per lane per
  minute), times the lanes, rounded up. A short window seeing more replays than a whole minute
  allows is over DCGM's line whatever the rest of the minute does.

Counts since the driver loaded are evidence, not verdicts: a healthy H100 showed 9 PCIe replays
since reset (tests/reference/nvidia_smi_q_h100.md). One exception, a heuristic: an NVLink that
has needed recovery (retraining) since the driver loaded warns even when quiet during the probe.
"""

from __future__ import annotations

import math
from typing import Any

from gpudoctor.checks.lost_gpus import readable
from gpudoctor.checks.targets import target_gpus
from gpudoctor.checks.unread import Reading, coverage, not_supported_finding, unread, unreadable_findings
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge.units import gpu_list, listed
from gpudoctor.snapshot import NOT_COLLECTED, Gpu, Missing, NvLink, NvLinkErrors, known

NVLINK_ERRORS = Code(
    "GD831",
    "nvlink-errors",
    "Active NVLinks are not erroring",
    what="Reads the replay, recovery and CRC error counters of every active NVLink of the GPUs the run "
    "uses, twice during the probe, and judges the rise with DCGM's health-watch limits: any replay or "
    "recovery error fails, CRC errors warn and fail at 100 per second. A link that needed recovery "
    "(retraining) since the driver loaded warns even when it was quiet during the probe.",
    why="A link that replays or retrains drops bandwidth for every collective that crosses it and often "
    "precedes XID 74 (NVLink error) and a hung or crashed job; on NVSwitch systems one bad link slows the "
    "whole ring.",
    fix="Look at `nvidia-smi nvlink -e -i <gpu>` and the kernel log (XID 74). Reset the GPU or reboot; if the "
    "link keeps erroring, reseat or replace the GPU/baseboard (NVIDIA's catalog: WORKFLOW_NVLINK_ERR). "
    "`nvidia-smi nvlink -r` clears the counters to watch whether they come back.",
)
PCIE_REPLAYS = Code(
    "GD832",
    "pcie-replays",
    "PCIe links are not replaying packets faster than DCGM allows",
    what="Reads each GPU's PCIe replay counter twice during the probe and warns when it rises by more than "
    "DCGM's per-minute allowance for the link's generation and width (one error per 10^12 bits per lane).",
    why="Replays are retransmissions after link errors: a marginal slot, riser or cable. They cost host "
    "bandwidth (data loading, NCCL over PCIe) and often precede the GPU falling off the bus (XID 79).",
    fix="Check `nvidia-smi -q -d PCI` (Replays Since Reset) and `sudo lspci -vvv` for AER errors; reseat the "
    "GPU and riser, try another slot, update the BIOS; if the link also trains down (GD404), fix that first.",
)
CODES = [NVLINK_ERRORS, PCIE_REPLAYS]

NVLINK_CRC_FAIL_PER_S = 100.0  # DCGM_LIMIT_MAX_NVLINK_CRC_ERROR
MIN_RATE_WINDOW_S = 1.0  # a rate is never taken over less than this (one error is no storm)
PCIE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}  # DCGM's table, Gen1-6
PCIE_BIT_ERROR_RATE = 1e-12  # DCGM: the replay rate a healthy lane stays under
COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")


def _rise(first: NvLinkErrors, later: NvLinkErrors) -> dict[str, int]:
    out = {}
    for name in COUNTERS:
        a, b = getattr(first, name), getattr(later, name)
        if known(a) and known(b) and b > a:
            out[name] = b - a
    return out


def _link_verdict(link: NvLink, window: float | None) -> tuple[Status, str, dict[str, Any]] | None:
    first, later = link.errors, link.errors_later
    if not known(first):
        return None
    evidence: dict[str, Any] = {"link": link.link, "since_driver_load": {c: getattr(first, c) for c in COUNTERS}}
    rise = _rise(first, later) if known(later) and window is not None else {}
    if rise:
        evidence["rise"] = rise
        evidence["window_s"] = window
        hard = {k: v for k, v in rise.items() if k in ("replay", "recovery")}
        crc = rise.get("crc_flit", 0) + rise.get("crc_data", 0)
        rate = crc / max(window or 0.0, MIN_RATE_WINDOW_S)
        evidence["crc_per_s_at_least"] = round(rate, 1)
        words = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in rise.items())
        if hard or rate >= NVLINK_CRC_FAIL_PER_S:
            return Status.FAIL, f"link {link.link}: {words} during the {window:.2f} s probe", evidence
        return Status.WARN, f"link {link.link}: {words} during the {window:.2f} s probe", evidence
    recoveries = first.recovery
    if known(recoveries) and recoveries > 0:
        return Status.WARN, f"link {link.link}: {recoveries} recovery (retraining) since the driver loaded", evidence
    return None


def _nvlink_finding(gpu: Gpu) -> Finding | None:
    """The GPU's finding; None when its links are clean (or could not be read: the warning says so)."""
    links = [link for link in gpu.nvlinks if link.active] if isinstance(gpu.nvlinks, list) else []
    window = gpu.error_window_s if known(gpu.error_window_s) else None
    verdicts = [v for v in (_link_verdict(link, window) for link in links) if v is not None]
    if not verdicts:
        return None
    status = Status.FAIL if any(v[0] is Status.FAIL for v in verdicts) else Status.WARN
    shown = listed([v[1] for v in verdicts], limit=3, sep="; ")
    hint = (
        f"nvidia-smi nvlink -e -i {gpu.index}; reset the GPU (sudo nvidia-smi -r -i {gpu.index}) or reboot; "
        "if the links keep erroring, reseat or replace the GPU/baseboard."
    )
    evidence = {"links": [v[2] for v in verdicts], "window_s": window}
    message = f"NVLink errors on GPU {gpu.index}: {shown}"
    return Finding(NVLINK_ERRORS.code, status, gpu_subject(gpu.index), message, hint, evidence)


def pcie_allowance(gen: int, width: int, window_s: float) -> int:
    """DCGM's allowed PCIe replays for a window: its per-minute figure, never scaled below a minute."""
    per_minute = math.ceil(PCIE_GT_PER_S[min(max(gen, 1), 6)] * 1e9 * PCIE_BIT_ERROR_RATE * 60 * width)
    return math.ceil(per_minute * max(window_s, 60.0) / 60.0)


def _pcie_finding(gpu: Gpu) -> Finding | None:
    first, later, window = gpu.pcie_replays, gpu.pcie_replays_later, gpu.error_window_s
    if not (known(first) and known(later) and known(window)) or later <= first:
        return None
    gen, width = _pcie_gen_width(gpu)
    if not (known(gen) and known(width)):
        return None  # PCIE_READINGS names the link as unreadable
    rise = later - first
    allowed = pcie_allowance(gen, width, window)
    if rise <= allowed:
        return None
    evidence = {
        "replays_since_driver_load": later,
        "rise": rise,
        "window_s": window,
        "link": f"Gen{gen} x{width}",
        "allowed_per_minute": allowed,
    }
    message = (
        f"GPU {gpu.index} replayed {rise} PCIe packets in {window:.2f} s (DCGM allows {allowed} a minute "
        f"on Gen{gen} x{width}): a marginal link"
    )
    hint = "Check `sudo lspci -vvv` for AER errors; reseat the GPU and riser or try another slot."
    return Finding(PCIE_REPLAYS.code, Status.WARN, gpu_subject(gpu.index), message, hint, evidence)


def _nvlink_counters(gpu: Gpu) -> Any:
    """The GPU's NVLink error counters as one reading: its active links when every counter was read
    (both times), else the first failure, naming the links it hit. A GPU without NVLink has nothing
    to read ([]); NOT_SUPPORTED counters on NVLinks are a fact (Blackwell and later)."""
    links = gpu.nvlinks
    if not isinstance(links, list):
        return [] if links.reason == "unsupported" else links  # NOT_SUPPORTED: no NVLink at all
    active = [link for link in links if link.active]
    failed: dict[int, Missing] = {}
    for link in active:
        for reading in (link.errors, link.errors_later):
            counters = [getattr(reading, c) for c in COUNTERS] if isinstance(reading, NvLinkErrors) else [reading]
            first = next((m for c in counters if (m := unread(c)) is not None), None)
            if first is not None:
                failed.setdefault(link.link, first)
    if failed:
        reason = next(iter(failed.values()))
        where = ", ".join(str(n) for n, m in failed.items() if m.reason == reason.reason)
        return Missing(reason.reason, f"link {where}: {reason.detail}".rstrip(": "))
    firsts = [link.errors for link in active]
    if firsts and all(isinstance(m, Missing) for m in firsts):
        return firsts[0]  # NOT_SUPPORTED (a fact) or never collected (an old recording)
    return active


def _pcie_counter(gpu: Gpu) -> Any:
    """The PCIe replay counter as one reading: both readings, or the first that failed."""
    first, later = gpu.pcie_replays, gpu.pcie_replays_later
    missing = [v for v in (first, later) if isinstance(v, Missing)]
    return next((m for m in missing if unread(m) is not None), missing[0] if missing else later)


def _pcie_link_if_rose(gpu: Gpu) -> Any:
    """The link generation and width, needed only to judge a counter that rose: DCGM's allowance
    depends on them. Every GPU has a PCIe link, so NOT_SUPPORTED here is a missing reading too."""
    first, later = gpu.pcie_replays, gpu.pcie_replays_later
    if not (known(first) and known(later)) or later <= first:
        return NOT_COLLECTED  # not needed: neither a value nor a failure
    gen, width = _pcie_gen_width(gpu)
    return gen if not known(gen) else width


def _pcie_gen_width(gpu: Gpu) -> tuple[Any, Any]:
    gen = gpu.pcie_gen_current if known(gpu.pcie_gen_current) else gpu.pcie_gen_max
    width = gpu.pcie_width_current if known(gpu.pcie_width_current) else gpu.pcie_width_max
    return gen, width


NVLINK_READINGS = (Reading(NVLINK_ERRORS.code, "NVLink error counters", _nvlink_counters),)
PCIE_READINGS = (
    Reading(PCIE_REPLAYS.code, "PCIe replay counter", _pcie_counter),
    Reading(PCIE_REPLAYS.code, "PCIe link (to judge its replays)", _pcie_link_if_rose, True),
)


@check("link_errors", "NVLink and PCIe link errors", codes=CODES, needs="visible")
def link_errors(ctx: CheckContext) -> list[Finding]:
    gpus = readable(target_gpus(ctx))
    out = unreadable_findings(gpus, NVLINK_READINGS + PCIE_READINGS)
    nvlink = [f for f in (_nvlink_finding(g) for g in gpus) if f is not None]
    out.extend(nvlink)
    cov = coverage(gpus, NVLINK_READINGS)
    counted = [g for g in gpus if g.index in cov.read and _nvlink_counters(g)]
    if counted and not nvlink:
        links = sum(len(_nvlink_counters(g)) for g in counted)
        msg = f"no NVLink errors on {links} active link(s) of GPU {gpu_list([g.index for g in counted])}"
        out.append(Finding(NVLINK_ERRORS.code, Status.PASS, "host", msg, "", {"links": links}))
    elif cov.not_supported and not nvlink:
        why = "NVML documents the per-link counters as unsupported from Blackwell on"
        out.append(not_supported_finding(NVLINK_ERRORS.code, "NVLink error counters", cov.not_supported, why))
    pcie = [f for f in (_pcie_finding(g) for g in gpus) if f]
    out.extend(pcie)
    steady = coverage(gpus, PCIE_READINGS)
    if steady.read and not pcie:
        msg = f"PCIe replay counters steady on GPU {gpu_list(steady.read)}" + steady.not_supported_note()
        out.append(Finding(PCIE_REPLAYS.code, Status.PASS, "host", msg, "", {"gpus": steady.read}))
    elif steady.not_supported and not pcie:
        out.append(not_supported_finding(PCIE_REPLAYS.code, "PCIe replay counter", steady.not_supported))
    return out
