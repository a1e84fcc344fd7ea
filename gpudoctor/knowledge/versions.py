"""Version numbers as NVIDIA, CUDA and torch write them: one parser, one formatter."""

from __future__ import annotations

import re

_DOTTED_RE = re.compile(r"\d+(?:\.\d+)+")
_NUMBER_RE = re.compile(r"\d+")


def version_tuple(text: str) -> tuple[int, ...] | None:
    """'550.54.15' -> (550, 54, 15): the first dotted number in the text (so 'x86_64 Kernel Module
    550.54.15' reads as the driver), else the first number, else None."""
    match = _DOTTED_RE.search(text) or _NUMBER_RE.search(text)
    if match is None:
        return None
    return tuple(int(p) for p in match.group(0).split("."))


def version_text(version: tuple[int, ...]) -> str:
    """(550, 40, 7) -> '550.40.07': NVIDIA pads the parts after the branch to two digits."""
    return ".".join([str(version[0])] + [f"{p:02d}" for p in version[1:]])


# NVIDIA's Linux driver branches are numbered from R1xx up (R375, R470, R550, R580); CUDA majors stay far
# below (13 in 2025). nvmlSystemGetNVMLVersion writes "<CUDA major>.<driver version>": "12.550.54.15",
# "11.470.86" for the two-part driver 470.86, "11.450.36.06" (JuliaGPU/CUDA.jl's NVML wrapper splits it
# the same way). A leading part below this is that CUDA major, never a driver branch.
_FIRST_DRIVER_BRANCH = 100


def driver_version(text: str) -> tuple[int, ...] | None:
    """A Linux driver version however NVML, nvidia-smi or the kernel write it, as a tuple without
    trailing zeros: '550.54.15', '470.86' (two parts), NVML's own '12.550.54.15' / '11.470.86' (the
    CUDA major first), '/proc/driver/nvidia/version' lines ('NVRM version: NVIDIA UNIX x86_64 Kernel
    Module  470.86  ...'), 'libnvidia-ml.so.550.54.15'. Equal drivers compare equal in every form."""
    parts = version_tuple(text)
    if parts is None:
        return None
    if len(parts) >= 3 and parts[0] < _FIRST_DRIVER_BRANCH:
        parts = parts[1:]  # NVML's CUDA-major prefix
    while len(parts) > 1 and parts[-1] == 0:
        parts = parts[:-1]
    return parts
