"""What each way NVML can fail to start means, in the user's words: `check` (GD101) and `watch`
say the same sentence."""

from __future__ import annotations

INSTALL_DRIVER = (
    "Install the NVIDIA driver (e.g. `apt install nvidia-driver-550`, or your distribution's "
    "package) and reboot, or load the module with `modprobe nvidia`. In a container, run it with "
    "the NVIDIA runtime (`docker run --gpus all ...`). After a driver upgrade that reports a "
    "'Driver/library version mismatch', reboot so the kernel module matches the library."
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
    return _EXPLAIN.get(status, (f"NVML failed to initialise: {detail or status}", INSTALL_DRIVER))
