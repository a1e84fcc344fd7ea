"""NVIDIA XID error codes: which ones mean the hardware is at fault, and what the common ones are.

The hardware set is Imbue's (the XIDs their fleet tooling treats as a failed GPU): 48, 56-58,
62-64, 68-77, 79-86, 88-89, 92, 94-105, 110-120, 122-125. XIDs 13, 31, 43 and 45 are raised
by applications (a bad kernel, an illegal address, a killed process) and do not condemn the GPU.

Two hardware XIDs record a fault the driver has already contained: 63 (a row remap or page
retirement was recorded: the bad row is replaced, at the latest after the next reset) and 94
(a contained ECC error: only the context that hit it was stopped). They still count as hardware
(they say the memory is wearing), but a GPU that logged them is usable: `contained()` says so,
and GD810 warns on them where it fails on the rest (64 remap failure, 95 uncontained ECC, ...).

This module is the one classification of XIDs; `check` and `watch` both read it.
"""

from __future__ import annotations

from typing import Literal

XidClass = Literal["hardware", "application", "other"]


def _ranges(*spans: tuple[int, int] | int) -> frozenset[int]:
    out: set[int] = set()
    for span in spans:
        if isinstance(span, int):
            out.add(span)
        else:
            out.update(range(span[0], span[1] + 1))
    return frozenset(out)


HARDWARE_XIDS = _ranges(48, (56, 58), (62, 64), (68, 77), (79, 86), (88, 89), 92, (94, 105), (110, 120), (122, 125))
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
CONTAINED_XIDS = frozenset({63, 94})  # hardware, but handled by the driver: warn, not fail

# Short names of the XIDs users meet most (NVIDIA's XID catalogue).
XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after a previous error",
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
}


def classify(xid: int) -> XidClass:
    if xid in HARDWARE_XIDS:
        return "hardware"
    if xid in APPLICATION_XIDS:
        return "application"
    return "other"


def describe(xid: int) -> str:
    name = XID_NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


def contained(xid: int) -> bool:
    """A hardware XID that records a fault the driver contained or repaired (63, 94)."""
    return xid in CONTAINED_XIDS
