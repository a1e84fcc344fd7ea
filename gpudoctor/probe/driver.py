"""Driver facts: versions from NVML and /proc, and the fabric manager's systemd state."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpudoctor.probe.device import convert_value, text
from gpudoctor.probe.files import read_text
from gpudoctor.probe.nvml import Nvml
from gpudoctor.snapshot import Driver, Gpu, Missing

# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..." and the open
# modules' "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build ..."
_MODULE_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")

FABRIC_MANAGER_UNIT = "nvidia-fabricmanager"

# Runs `systemctl is-active <unit>` and returns its state; injectable for tests.
SystemctlRunner = Callable[[str], "str | Missing"]


def cuda_version(value: Any) -> str:
    """nvmlSystemGetCudaDriverVersion's 12040 -> '12.4'."""
    v = int(value)
    if v <= 0:
        raise ValueError("no CUDA version")
    return f"{v // 1000}.{(v % 1000) // 10}"


def kernel_module_version(root: Path) -> str | Missing:
    """The loaded kernel module's version: /proc/driver/nvidia/version, else the module's own
    /sys/module/nvidia/version (the kernel exports every module's MODULE_VERSION there)."""
    content = read_text(root, "/proc/driver/nvidia/version")
    if isinstance(content, Missing):
        sysfs = read_text(root, "/sys/module/nvidia/version")
        if isinstance(sysfs, str) and _SYSFS_VERSION.fullmatch(sysfs.strip()):
            return sysfs.strip()
        return content
    match = _MODULE_VERSION.search(content)
    if match is None:
        return Missing("error", "/proc/driver/nvidia/version: no version in it")
    return match.group(1)


_SYSFS_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?")

# Where the dynamic loader finds libnvidia-ml.so.1 (what pynvml and nvidia-smi open) on Debian/Ubuntu,
# RHEL/SUSE, and in containers of NVIDIA's runtime, after LD_LIBRARY_PATH: a heuristic list, the
# loader's own truth is ld.so.cache. The file the link names carries the version the package installed.
NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/powerpc64le-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
)
_LIBRARY_FILE = re.compile(r"libnvidia-ml\.so\.\d+\.\d+(?:\.\d+)?")


def nvml_library(root: Path, environ: Mapping[str, str]) -> tuple[str, str] | Missing:
    """The file libnvidia-ml.so.1 resolves to ("libnvidia-ml.so.550.107.02") and when it last changed
    (ISO 8601): the user-space half of the driver as the package manager left it on disk, whatever
    kernel module is loaded. Only a name of that form is kept (an allow-list, not the path)."""
    dirs = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d.startswith("/")]
    for directory in [*dirs, *NVML_LIBRARY_DIRS]:
        link = root / directory.lstrip("/") / NVML_LIBRARY
        if not link.exists():
            continue
        target = link.resolve()
        name = target.name
        if not _LIBRARY_FILE.fullmatch(name):
            return Missing("error", f"{NVML_LIBRARY} resolves to a file not named libnvidia-ml.so.<version>")
        changed = dt.datetime.fromtimestamp(target.stat().st_mtime, dt.timezone.utc)
        return name, changed.isoformat(timespec="seconds")
    return Missing("unsupported", f"{NVML_LIBRARY} is in none of the usual library directories")


def systemctl_is_active(unit: str) -> str | Missing:
    """systemd's state of `unit` ("active", "inactive", "failed", ...); never blocks over 1 s."""
    exe = shutil.which("systemctl")
    if exe is None:
        return Missing("unsupported", "systemctl not found (no systemd here)")
    try:
        done = subprocess.run([exe, "is-active", unit], capture_output=True, text=True, timeout=1.0, check=False)
    except subprocess.TimeoutExpired:
        return Missing("error", "systemctl is-active did not answer within 1 s")
    except OSError as exc:
        return Missing("error", f"systemctl: {exc.strerror or exc}")
    state = done.stdout.strip().splitlines()
    if state and state[0]:
        return state[0]
    err = done.stderr.strip().splitlines()
    return Missing("error", err[0] if err else f"systemctl exited {done.returncode}")


def has_nvswitch(gpus: list[Gpu]) -> bool:
    return any(isinstance(g.nvlinks, list) and any(link.remote_type == "switch" for link in g.nvlinks) for g in gpus)


def fabric_manager(gpus: list[Gpu], systemctl: SystemctlRunner) -> str | Missing:
    if not has_nvswitch(gpus):
        return Missing("unsupported", "no NVSwitch: the fabric manager is not needed")
    return systemctl(FABRIC_MANAGER_UNIT)


def read_driver(nvml: Nvml, root: Path) -> Driver:
    """Versions from an initialised NVML; fabric_manager is filled in once GPUs are known."""
    return Driver(
        nvml_status="ok",
        driver_version=convert_value(nvml.call("nvmlSystemGetDriverVersion"), text, "nvmlSystemGetDriverVersion"),
        cuda_driver_version=convert_value(
            nvml.call("nvmlSystemGetCudaDriverVersion"), cuda_version, "nvmlSystemGetCudaDriverVersion"
        ),
        nvml_version=convert_value(nvml.call("nvmlSystemGetNVMLVersion"), text, "nvmlSystemGetNVMLVersion"),
        kernel_module_version=kernel_module_version(root),
    )
