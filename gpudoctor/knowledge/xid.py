"""NVIDIA XID error codes: what NVIDIA says to do about each, and what gpudoctor makes of it.

The table is NVIDIA's XID catalog for Ampere and later ("Analyzing Xid Errors with the Xid
Catalog", docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): each XID has a
"Resolution Bucket (Immediate Action)". The buckets below are the catalog's as NVIDIA's own
NVSentinel ships them (`distros/kubernetes/nvsentinel/charts/gpu-health-monitor/
xiderrorsmapping.csv`); tests/reference/xid_catalog.csv holds that file and a test keeps this
table equal to it. What each bucket tells the operator to do is the catalog's "Resolution Bucket
Reference", quoted in tests/reference/xid_catalog.md.

gpudoctor's reading of the buckets (`kind`):

- "hardware": the GPU needs a reset, a reboot, a power cycle, a drain or the vendor
  (RESET_GPU, RESTART_BM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR,
  CHECK_MECHANICALS, RESTART_VM, UPDATE_SWFW, CHECK_UVM, UNEXPECTED_ERR_REPORT_ISSUE): fails.
- "contained": 63 (a row remap recorded, bucket IGNORE) and 94 (a contained ECC error, bucket
  RESTART_APP) are memory faults the driver already handled: the GPU stays usable, but the
  memory is wearing; they warn.
- "application": RESTART_APP, the program's fault (13, 31, ...): warns.
- "secondary": 45 (WORKFLOW_XID_45), a cleanup after another error: act on that one.
- "recovery": 154, the driver announcing a new GPU recovery action; the action it names decides.
- "informational": IGNORE, no action needed; "other": not in the catalog.

This module is the one classification of XIDs; `check` and `watch` both read it.
"""

from __future__ import annotations

import re
from typing import Literal

XidClass = Literal["hardware", "application", "other"]
Kind = Literal["hardware", "contained", "application", "secondary", "recovery", "informational", "other"]


def _ranges(*spans: tuple[int, int] | int) -> frozenset[int]:
    out: set[int] = set()
    for span in spans:
        if isinstance(span, int):
            out.add(span)
        else:
            out.update(range(span[0], span[1] + 1))
    return frozenset(out)


# The catalog's immediate-action bucket of every XID it lists (1-162).
BUCKETS: dict[str, frozenset[int]] = {
    "UNEXPECTED_ERR_REPORT_ISSUE": _ranges(
        (1, 7),
        (9, 10),
        12,
        (15, 24),
        (26, 30),
        (33, 36),
        42,
        47,
        (49, 53),
        (55, 59),
        61,
        65,
        73,
        81,
        87,
        (90, 91),
        108,
        (111, 118),
        (122, 125),
        138,
        142,
    ),  # fmt: skip
    "RESTART_APP": _ranges(
        8,
        11,
        13,
        25,
        (31, 32),
        (39, 41),
        60,
        (68, 72),
        (75, 77),
        80,
        (82, 86),
        (88, 89),
        94,
        (96, 105),
        (126, 135),
        139,
    ),  # fmt: skip
    "IGNORE": _ranges(14, (37, 38), (43, 44), 63, (66, 67), (92, 93), (106, 107), 121, 137, 141, (152, 153), 157, 161),
    "WORKFLOW_XID_45": _ranges(45),
    "RESET_GPU": _ranges(46, 62, 64, 95, (109, 110), (119, 120), 136, 140, 143, (155, 156), 158, 162),
    "WORKFLOW_XID_48": _ranges(48),
    "CHECK_MECHANICALS": _ranges(54),
    "WORKFLOW_NVLINK_ERR": _ranges(74),
    "UPDATE_SWFW": _ranges(78),
    "RESTART_BM": _ranges(79, 160),
    "WORKFLOW_NVLINK5_ERR": _ranges((144, 150)),
    "RESTART_VM": _ranges(151),
    "RECOVERY_ACTION": _ranges(154),  # the catalog: "follow guidance as it applies to another Xid"
    "CHECK_UVM": _ranges(159),
}
BUCKET_OF = {xid: bucket for bucket, xids in BUCKETS.items() for xid in xids}

# What each bucket tells the operator to do (the catalog's Resolution Bucket Reference).
ACTIONS = {
    "RESET_GPU": "stop the GPU's processes and reset it (`sudo nvidia-smi -r -i <gpu>`); if it comes back, "
    "reboot; if it comes back after a reboot, replace the GPU",
    "RESTART_BM": "the GPU no longer answers on PCIe: power-cycle the machine (a warm reboot may not bring "
    "it back); if it recurs, the slot, riser or GPU is failing",
    "WORKFLOW_XID_48": "reset the GPU, then check the SRAM threshold flag (`nvidia-smi -q -d ECC`, GD829); "
    "with XID 63/64 follow the row-remap state (GD804/GD805); persistent errors mean an RMA",
    "WORKFLOW_NVLINK_ERR": "reset the GPU or reboot; `nvidia-smi nvlink -e` shows the erroring link; "
    "replace the hardware if it recurs",
    "WORKFLOW_NVLINK5_ERR": "reset the GPU or reboot; `nvidia-smi nvlink -e` shows the erroring link; "
    "replace the hardware if it recurs",
    "CHECK_MECHANICALS": "check the GPU's auxiliary power connectors and seating",
    "RESTART_VM": "restart the virtual machine",
    "UPDATE_SWFW": "update the driver (and vGPU software) and the firmware",
    "CHECK_UVM": "check the driver's unified-memory (UVM) setup; reset the GPU if it recurs",
    "UNEXPECTED_ERR_REPORT_ISSUE": "not expected on this GPU: collect `sudo nvidia-bug-report.sh` and contact "
    "NVIDIA or the system vendor",
    "RESTART_APP": "restart the application; the GPU needs nothing",
    "WORKFLOW_XID_45": "a cleanup after another error: act on the XID logged just before it",
    "IGNORE": "no action needed",
    "RECOVERY_ACTION": "take the recovery action it names",
}
HARDWARE_BUCKETS = frozenset(
    {
        "RESET_GPU",
        "RESTART_BM",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
        "CHECK_MECHANICALS",
        "RESTART_VM",
        "UPDATE_SWFW",
        "CHECK_UVM",
        "UNEXPECTED_ERR_REPORT_ISSUE",
    }
)
CONTAINED_XIDS = frozenset({63, 94})  # memory faults the driver handled: warn, not fail

# Short names of the XIDs users meet most (the catalog's descriptions, shortened).
XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after a previous error",
    46: "GPU stopped processing (timeout)",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    136: "link training failed",
    140: "unrecoverable ECC error",
    143: "GPU initialization error",
    154: "GPU recovery action changed",
}


def bucket(xid: int) -> str | None:
    """The catalog's immediate-action bucket, or None for an XID the catalog does not list."""
    return BUCKET_OF.get(xid)


def kind(xid: int) -> Kind:
    b = bucket(xid)
    if xid in CONTAINED_XIDS:
        return "contained"
    if b in HARDWARE_BUCKETS:
        return "hardware"
    if b == "RESTART_APP":
        return "application"
    if b == "WORKFLOW_XID_45":
        return "secondary"
    if b == "RECOVERY_ACTION":
        return "recovery"
    if b == "IGNORE":
        return "informational"
    return "other"


def classify(xid: int) -> XidClass:
    """The three classes `watch` shows: the catalog's hardware buckets, RESTART_APP, the rest."""
    b = bucket(xid)
    if b in HARDWARE_BUCKETS:
        return "hardware"
    if b == "RESTART_APP":
        return "application"
    return "other"


def contained(xid: int) -> bool:
    """A memory fault the driver contained or repaired (63, 94): the GPU stays usable."""
    return xid in CONTAINED_XIDS


# The buckets from the heaviest action to the lightest, to say the heaviest first.
_SEVERITY = [
    "RESTART_BM",
    "UNEXPECTED_ERR_REPORT_ISSUE",
    "CHECK_MECHANICALS",
    "WORKFLOW_XID_48",
    "WORKFLOW_NVLINK5_ERR",
    "WORKFLOW_NVLINK_ERR",
    "RESET_GPU",
    "RECOVERY_ACTION",
    "RESTART_VM",
    "UPDATE_SWFW",
    "CHECK_UVM",
    "RESTART_APP",
    "WORKFLOW_XID_45",
    "IGNORE",
]


def severity_rank(xid: int) -> int:
    b = bucket(xid)
    return _SEVERITY.index(b) if b in _SEVERITY else len(_SEVERITY)


def describe(xid: int) -> str:
    name = XID_NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


def action(xid: int) -> str:
    """What NVIDIA's catalog says to do first about this XID."""
    b = bucket(xid)
    return ACTIONS[b] if b else "not in NVIDIA's XID catalog: look it up at docs.nvidia.com/deploy/xid-errors"


# nvmlDeviceGpuRecoveryAction_t as nvidia-ml-py 13.615.71 defines it (nvml.h): the action the
# driver says a GPU needs. The meaning of each: NVIDIA's "GPU Memory Error Management", "Error
# Recovery and Response Flags"; Xid 154 logs a change of it.
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}


def recovery_name(code: int) -> str:
    return RECOVERY_ACTIONS.get(code, f"action_{code}")


# Xid 154's text, as the driver logs it (NVIDIA developer forum, RTX PRO 6000 report):
# "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
_RECOVERY_CHANGE = re.compile(r"changed from 0x([0-9a-fA-F]+)[^)]*\)\s*to 0x([0-9a-fA-F]+)")


def recovery_target(text: str) -> int | None:
    """The nvmlDeviceGpuRecoveryAction_t value an XID 154 line says the GPU now needs."""
    match = _RECOVERY_CHANGE.search(text)
    return int(match.group(2), 16) if match else None
