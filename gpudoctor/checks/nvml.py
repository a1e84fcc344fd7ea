"""GD1 (driver/NVML): can gpudoctor talk to the NVIDIA driver at all?"""

from __future__ import annotations

from gpudoctor.findings import Finding, Status
from gpudoctor.registry import CheckContext, Code, check

NVML_UNAVAILABLE = Code(
    "GD101",
    "nvml-unavailable",
    "The NVIDIA driver answers through NVML",
    what="Initialises NVML (libnvidia-ml, part of the NVIDIA driver) and lists the GPUs it sees.",
    why="Without a working driver no GPU can be used: PyTorch sees zero CUDA devices and a "
    "multi-GPU launch fails or silently falls back to CPU.",
    fix="Install the NVIDIA driver (e.g. `apt install nvidia-driver-550`, or your distribution's "
    "package) and reboot, or load the module with `modprobe nvidia`. In a container, run it with "
    "the NVIDIA runtime (`docker run --gpus all ...`). After a driver upgrade that reports a "
    "'Driver/library version mismatch', reboot so the kernel module matches the library.",
)

# What each NVML init failure means, in the user's words: (message, hint).
_EXPLAIN = {
    "no_library": (
        "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) was not found",
        "Install the NVIDIA driver; in a container use the NVIDIA container runtime (`--gpus all`).",
    ),
    "no_driver": (
        "no NVIDIA driver: the NVIDIA kernel module is not loaded",
        "Load it with `sudo modprobe nvidia`, or reinstall the driver and reboot.",
    ),
    "version_mismatch": (
        "NVIDIA driver/library version mismatch: the kernel module and libnvidia-ml differ",
        "The driver was upgraded while the old kernel module stayed loaded: reboot "
        "(or unload and reload the nvidia modules). Pin the driver to stop unattended upgrades.",
    ),
    "no_permission": (
        "no permission to use the NVIDIA driver (/dev/nvidia* not accessible)",
        "Add the user to the group owning /dev/nvidia* (often `video`), or run in a container "
        "with the devices passed through.",
    ),
}


def explain_init_failure(status: str, detail: str = "") -> tuple[str, str]:
    """(message, hint) for a failed NVML init status; `gpudoctor watch` says the same words."""
    return _EXPLAIN.get(status, (f"NVML failed to initialise: {detail or status}", NVML_UNAVAILABLE.fix))


def _no_gpu(ctx: CheckContext, message: str, hint: str, evidence: dict[str, object]) -> Finding:
    """No usable GPU: a failure, unless the user asked for CPU ranks (then reported, not failing)."""
    if ctx.options.device == "cpu":
        return Finding("GD101", Status.SKIP, "host", f"{message} (not needed for --device cpu)", hint, evidence)
    return Finding("GD101", Status.FAIL, "host", message, hint, evidence)


@check("nvml", "NVIDIA driver and NVML", codes=[NVML_UNAVAILABLE])
def nvml_available(ctx: CheckContext) -> list[Finding]:
    driver = ctx.snapshot.driver
    evidence = {"nvml_status": driver.nvml_status}
    if driver.nvml_detail:
        evidence["detail"] = driver.nvml_detail
    if driver.nvml_status != "ok":
        message, hint = explain_init_failure(driver.nvml_status, driver.nvml_detail)
        return [_no_gpu(ctx, message, hint, evidence)]
    count = len(ctx.snapshot.gpus)
    evidence["gpus"] = count
    if count == 0:
        return [
            _no_gpu(
                ctx,
                "the NVIDIA driver is loaded but reports no GPUs",
                "Check `nvidia-smi`; in a container pass the GPUs through (`--gpus all`); on "
                "NVSwitch systems make sure nvidia-fabricmanager is running.",
                evidence,
            )
        ]
    version = driver.driver_version if isinstance(driver.driver_version, str) else "unknown"
    return [Finding("GD101", Status.PASS, "host", f"driver {version}, {count} GPU(s) seen by NVML", "", evidence)]
