"""Readings NVML could not give, told apart from facts, and the one way a check says so.

A snapshot field the probe could not read is a `Missing` with a reason, and the reasons mean
different things (gpudoctor/probe/nvml.py maps NVML's return codes to them):

- "not_collected": the probe never asked (a recording from an older gpudoctor). Silent.
- "unsupported": NVML answered NOT_SUPPORTED. For an optional feature (NVLink, MIG, ECC, GSP
  firmware, InfoROM, power capping) that is a fact about the GPU: it has no such thing. For a
  reading every NVIDIA GPU has (memory size, VBIOS, compute capability, PCIe link, compute mode:
  `always_there`) it is not a fact, just a reading that is missing.
- anything else ("error", "no_permission", "gpu_lost", ...): the read failed and the value is
  unknown.

A check that cannot read what it judges says so with `unreadable_finding` (a warning naming the
field, the GPUs and why), and never passes on a guess. Not a check module (not in CHECK_MODULES).
"""

from __future__ import annotations

from typing import Any

from gpudoctor.checks.targets import gpu_list
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.snapshot import Missing

# How each reason reads in a message.
REASON_TEXT = {
    "error": "NVML error",
    "no_permission": "no permission",
    "gpu_lost": "GPU lost",
    "unsupported": "not reported by NVML",
}


def unread(value: Any, *, always_there: bool = False) -> Missing | None:
    """The Missing of a reading that was tried and gave no value (see the module docstring);
    None for a value, for a field never collected, and for NOT_SUPPORTED where that is a fact."""
    if not isinstance(value, Missing) or value.reason == "not_collected":
        return None
    if value.reason == "unsupported" and not always_there:
        return None
    return value


def _hint(reasons: set[str], first: int, many: bool) -> str:
    if "no_permission" in reasons:
        return (
            "Run gpudoctor with access to /dev/nvidia* (as root, or in a container with the devices passed "
            f"through) so NVML can read them; `nvidia-smi -q -i {first}` shows what the driver itself reports."
        )
    if reasons == {"gpu_lost"}:
        return "The GPU stopped answering the driver: see GD827 (power-cycle the node)."
    if reasons == {"unsupported"}:
        return (
            f"This driver's NVML does not report it for {'these GPUs' if many else 'this GPU'}: compare with "
            f"`nvidia-smi -q -i {first}`, and "
            "update the driver if nvidia-smi shows it."
        )
    return (
        f"Read the NVML error in the evidence and compare with `nvidia-smi -q -i {first}`; a GPU that fails "
        f"basic queries may need a reset (sudo nvidia-smi -r -i {first}) or a reboot."
    )


def unreadable_finding(code: str, what: str, where: dict[int, Missing], judged: str = "not checked") -> Finding:
    """One warning: `what` could not be read on the GPUs in `where` (NVML index -> its Missing),
    so the check could not judge it there. `judged` says what that leaves out."""
    by_reason: dict[str, list[int]] = {}
    for index, missing in sorted(where.items()):
        by_reason.setdefault(missing.reason, []).append(index)
    parts = "; ".join(
        f"GPU {gpu_list(indices)} ({REASON_TEXT.get(reason, reason)})" for reason, indices in by_reason.items()
    )
    indices = sorted(where)
    subject = gpu_subject(indices[0]) if len(indices) == 1 else "host"
    evidence = {
        "field": what,
        "unreadable": {str(i): f"{m.reason}: {m.detail}" if m.detail else m.reason for i, m in sorted(where.items())},
    }
    message = f"{what} unreadable on {parts}: {judged}"
    return Finding(code, Status.WARN, subject, message, _hint(set(by_reason), indices[0], len(indices) > 1), evidence)
