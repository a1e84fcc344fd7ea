"""Small helpers shared by the health/config checks: which GPUs the run uses, version tuples."""

from __future__ import annotations

import re

from gpudoctor.registry import CheckContext
from gpudoctor.snapshot import Gpu

_DOTTED_RE = re.compile(r"\d+(?:\.\d+)+")
_NUMBER_RE = re.compile(r"\d+")


def target_gpus(ctx: CheckContext) -> list[Gpu]:
    """The GPUs the run will use (CUDA_VISIBLE_DEVICES resolved), in CUDA order."""
    return list(ctx.visible.gpus)


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


def gpu_list(indices: list[int]) -> str:
    """NVML indices as nvidia-smi numbers them, in that order: '0, 1, 5'."""
    return ", ".join(str(i) for i in sorted(indices))


def listed(items: list[str], limit: int = 4, sep: str = ", ") -> str:
    """The first `limit` items, then how many more: 'a, b, c, d, +2 more'."""
    shown = sep.join(items[:limit])
    return f"{shown}{sep}+{len(items) - limit} more" if len(items) > limit else shown
