"""What each way NVML can fail to start means, in the user's words: `check` (GD101) and `watch`
say the same sentence."""

from __future__ import annotations

import datetime as dt

from gpudoctor.knowledge.versions import driver_version

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


# After a reboot the kernel loads the module its packages installed. A library older than the last
# boot that still differs from the loaded module therefore means the module on disk is not the
# library's version: a half-upgraded package set (the libraries upgraded, the kernel-module or DKMS
# package held back or failed to build), which another reboot does not change. illinois-scicomp/
# machine-shop-maintenance#70: "Tried rebooting the system, but still doesn't work", fixed by
# "sudo apt install --fix-broken"; oddmario/NVIDIA-Ubuntu-Driver-Guide#4: a minor update installed
# 550.107.02 beside the loaded 550.90.07, "usually rebooting will fix".
FINISH_UPGRADE = (
    "finish the upgrade so the kernel module package matches the libraries: `sudo apt install --fix-broken` "
    "(or reinstall one version's driver packages, e.g. `sudo apt install --reinstall nvidia-driver-{branch}`, "
    "RHEL: `sudo dnf distro-sync 'nvidia-*'`), check `dkms status` built the module for this kernel, then reboot"
)


def _earlier(first: str | None, then: str | None) -> bool:
    """Whether ISO 8601 time `first` is before `then` (False when either is missing or unreadable)."""
    try:
        return bool(first and then) and dt.datetime.fromisoformat(first) < dt.datetime.fromisoformat(then)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def explain_mismatch(
    module: str | None, library: str | None, library_changed: str | None, booted: str | None
) -> tuple[str, str] | None:
    """(message, hint) for "Driver/library version mismatch" naming both halves: the loaded kernel
    module's version, the user-space library's on disk (its file name) and which one is behind; None
    when the two versions are not both known. Times are ISO 8601 strings."""
    mod, lib = (driver_version(v) if v else None for v in (module, library))
    if mod is None or lib is None or module is None or library is None:
        return None
    lib_text = ".".join(library.split(".so.", 1)[-1:])  # "libnvidia-ml.so.550.107.02" -> "550.107.02"
    message = (
        f"NVIDIA driver/library version mismatch: the loaded kernel module is {module}, the NVML library "
        f"on disk is {lib_text} ({library})"
    )
    branch = lib_text.split(".")[0]
    if mod == lib:
        return message + " (the same version: another libnvidia-ml is loaded first)", (
            "An older or newer libnvidia-ml earlier on the library path wins (LD_LIBRARY_PATH, a container "
            "image's own copy): remove it so the driver's own library loads."
        )
    before_boot = _earlier(library_changed, booted)
    if before_boot:
        return (
            message + f"; the library was installed before the last boot ({booted}), so a reboot already "
            "loaded the module on disk: the kernel module package is behind the libraries (a half-upgraded "
            "package set), and rebooting again will not fix it",
            "A reboot does not fix a half-upgraded package set: " + FINISH_UPGRADE.format(branch=branch) + ".",
        )
    if lib > mod:
        hint = (
            f"The {lib_text} libraries were installed while the {module} module stayed loaded: reboot (or stop "
            "every GPU process and `sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe "
            f"nvidia`) to load the {lib_text} module. If the mismatch survives the reboot, the module package "
            "is behind: " + FINISH_UPGRADE.format(branch=branch) + ". Pin the driver packages against "
            "unattended upgrades (`sudo apt-mark hold 'nvidia-*' 'libnvidia-*'`)."
        )
        return message + f": the libraries were upgraded to {lib_text} after the module was loaded", hint
    return message + ": the library is older than the loaded module", (
        f"The library on disk is behind the {module} module: a partial downgrade, or a container image "
        "carrying its own libnvidia-ml (use the NVIDIA container toolkit, which mounts the host's). "
        + FINISH_UPGRADE.format(branch=module.split(".")[0]).capitalize()
        + "."
    )
