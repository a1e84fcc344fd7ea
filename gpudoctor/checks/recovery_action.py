"""GD828 (GPU health): the recovery action the driver asks for after a fault (reset, reboot, drain),
judged as DCGM's health watch does (knowledge/recovery_actions.py)."""

from __future__ import annotations

from operator import attrgetter

from gpudoctor.checks.lost_gpus import readable
from gpudoctor.checks.targets import target_gpus
from gpudoctor.checks.unread import Reading, coverage, not_supported_finding, unreadable_findings
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge.recovery_actions import recovery_hint, recovery_severity
from gpudoctor.snapshot import known

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
        status = Status(recovery_severity(action))
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
