"""The GPU recovery actions the driver asks for after a fault (nvmlDeviceGpuRecoveryAction_t, by the
names knowledge/xid.py gives them): what each needs done, and how serious it is.

Read by GD828 (the action NVML reports now) and GD810 (an Xid 154 that logs a change of it).
"""

from __future__ import annotations

from typing import Literal

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


def recovery_severity(action: str) -> Literal["pass", "warn", "fail"]:
    """'pass' for no action, 'warn' for drain_p2p, 'fail' for every other (a finding's Status value)."""
    if action == "none":
        return "pass"
    return "warn" if action in WARN_ACTIONS else "fail"


def recovery_hint(action: str, gpu: int) -> str:
    return RECOVERY_HINTS.get(action, "look the action up in nvml.h (nvmlDeviceGpuRecoveryAction_t)").format(gpu=gpu)
