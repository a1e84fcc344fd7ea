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
field, the GPUs and why), and never passes on a guess. A reading NVML refused this user
(NO_PERMISSION) is the one exception to the warning: it "needs root", a skip that says to run
gpudoctor with sudo, since a healthy GPU read by a normal user must not fail a `--fail-on warn` gate
(tests/reference/gpu_first_contact.md). A check that reads several fields per GPU
lists them as `Reading`s: `unreadable_findings` gives its warnings, `coverage` the GPUs its pass
may name, and `not_supported_finding` the skip for GPUs that report none of them (a GeForce card
has no ECC counters: a fact, not a failure). `silent` tells a GPU that answered no reading at all
(GD827). Not a check module (not in CHECK_MODULES).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge.units import gpu_list
from gpudoctor.records import Record, record
from gpudoctor.snapshot import Gpu, Missing, known

# How each reason reads in a message.
REASON_TEXT = {
    "error": "NVML error",
    "no_permission": "needs root",
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


def reason_hint(reasons: set[str], first: int, many: bool) -> str:
    """What to do about readings that failed for `reasons` on GPU `first` (and others when `many`)."""
    if "no_permission" in reasons:
        return (
            "Run it as root (`sudo gpudoctor check`), or with access to /dev/nvidia* (a container with the "
            f"devices passed through), so NVML can read them; `nvidia-smi -q -i {first}` shows what the driver "
            "itself reports."
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
    hint = reason_hint(set(by_reason), indices[0], len(indices) > 1)
    if set(by_reason) == {"no_permission"}:
        message = f"{what} needs root on GPU {gpu_list(indices)}: {judged} (NVML refused this user)"
        return Finding(code, Status.SKIP, subject, message, hint, evidence)
    message = f"{what} unreadable on {parts}: {judged}"
    return Finding(code, Status.WARN, subject, message, hint, evidence)


@record
class Reading(Record):
    """One thing a check reads on every GPU: the code that judges it, its name in a message, and
    how to get it from a Gpu (a value, or the Missing that says why there is none)."""

    code: str
    label: str
    get: Callable[[Gpu], Any]
    always_there: bool = False

    def unread(self, gpu: Gpu) -> Missing | None:
        return unread(self.get(gpu), always_there=self.always_there)


def unreadable_findings(gpus: Sequence[Gpu], readings: Sequence[Reading], judged: str = "not checked") -> list[Finding]:
    """The warnings for the readings that failed: readings that failed on the same GPUs for the same
    reasons share one (a GPU that answers none of them is one warning, not six), under the code of
    the first of them."""
    groups: dict[tuple[tuple[int, str], ...], tuple[str, list[str], dict[int, Missing]]] = {}
    for reading in readings:
        where = {g.index: m for g in gpus if (m := reading.unread(g)) is not None}
        if where:
            key = tuple((i, m.reason) for i, m in sorted(where.items()))
            groups.setdefault(key, (reading.code, [], where))[1].append(reading.label)
    return [unreadable_finding(code, ", ".join(labels), where, judged) for code, labels, where in groups.values()]


@record
class Coverage(Record):
    """Which GPUs a check could judge, by what their readings gave (NVML indices)."""

    read: list[int]  # every reading a value, or a fact (NOT_SUPPORTED for an optional feature)
    partly: list[int]  # some readings a value, others failed
    unread: list[int]  # no value, and some readings failed
    not_supported: list[int]  # no value, none failed: NVML reports none of them for the GPU

    def passed(self, verdict: str) -> str:
        """`verdict` on the GPUs that were read, never on a guess: 'no X on GPU 0, 1, and none in what
        could be read on GPU 3'."""
        parts = [f"{verdict} on GPU {gpu_list(self.read)}"] if self.read else []
        if self.partly:
            parts.append(f"{'and none' if self.read else verdict} in what could be read on GPU {gpu_list(self.partly)}")
        return ", ".join(parts)

    @property
    def judged(self) -> list[int]:
        return sorted(self.read + self.partly)

    def not_supported_note(self) -> str:
        return f"; not supported on GPU {gpu_list(self.not_supported)}" if self.not_supported else ""


def coverage(gpus: Sequence[Gpu], readings: Sequence[Reading]) -> Coverage:
    out: dict[str, list[int]] = {"read": [], "partly": [], "unread": [], "not_supported": []}
    for g in gpus:
        values = [r.get(g) for r in readings]
        has_value = any(known(v) for v in values)
        failed = any(r.unread(g) is not None for r in readings)
        if has_value:
            out["partly" if failed else "read"].append(g.index)
        elif failed:
            out["unread"].append(g.index)
        elif any(isinstance(v, Missing) and v.reason == "unsupported" for v in values):
            out["not_supported"].append(g.index)
    return Coverage(**out)


def not_supported_finding(code: str, what: str, indices: list[int], why: str = "") -> Finding:
    """The skip for GPUs whose NVML reports none of what a check reads (NOT_SUPPORTED: the GPU or its
    driver has no such thing). Not a warning: nothing failed; but not a pass either."""
    subject = gpu_subject(indices[0]) if len(indices) == 1 else "host"
    message = f"{what}: not supported on GPU {gpu_list(indices)}, not checked" + (f" ({why})" if why else "")
    return Finding(code, Status.SKIP, subject, message, "", {"not_supported": indices})


# The fields of a Gpu that name it rather than read it, and the probe's own clock: what is left are
# the answers NVML gave (or did not give) about the GPU.
_NOT_ANSWERS = frozenset({"index", "uuid", "name", "pci_bus_id", "lost", "unreachable", "error_window_s"})


def silent(gpu: Gpu) -> Counter[str] | None:
    """For a GPU that gave NVML's handle but not one reading (every query failed), how many readings
    failed for each reason; None for a GPU that answered anything, or was never asked (an old
    recording). A lost or unreachable GPU is GD827's other case and is not looked at here."""
    values = [getattr(gpu, f.name) for f in dataclasses.fields(gpu) if f.name not in _NOT_ANSWERS]
    if any(known(v) for v in values):
        return None
    reasons = Counter(v.reason for v in values if v.reason != "not_collected")
    return reasons or None
