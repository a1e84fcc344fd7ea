"""Driver facts: versions from NVML and /proc, and the fabric manager's systemd state."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
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
    content = read_text(root, "/proc/driver/nvidia/version")
    if isinstance(content, Missing):
        return content
    match = _MODULE_VERSION.search(content)
    if match is None:
        return Missing("error", "/proc/driver/nvidia/version: no version in it")
    return match.group(1)


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
