"""GD833 (GPU health): ECC on, now and after the next reboot, for the data-centre GPUs the run uses."""

from __future__ import annotations

from typing import Any

from gpudoctor.checks.lost_gpus import readable
from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge.gpu_products import ecc_expected_on
from gpudoctor.knowledge.units import gpu_list
from gpudoctor.snapshot import Gpu, known

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
