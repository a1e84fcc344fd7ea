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


def nccl_int(value: str | None) -> int | None:
    """An integer environment variable as NCCL reads it (NCCL_PARAM: strtoll(str, NULL, 0)): leading
    space and a sign allowed, 0x hex and leading-0 octal, and whatever follows the digits ignored,
    so "4M" is 4 and "yes" is 0. None when unset or empty (NCCL then keeps its default)."""
    if value is None or not value.strip():
        return None
    text = value.lstrip()
    sign = -1 if text.startswith("-") else 1
    text = text[1:] if text[:1] in "+-" else text
    base, digits = 10, "0123456789"
    if text[:2].lower() == "0x" and len(text) > 2 and text[2] in "0123456789abcdefABCDEF":
        base, digits, text = 16, "0123456789abcdefABCDEF", text[2:]
    elif text.startswith("0"):
        base, digits = 8, "01234567"
    end = 0
    while end < len(text) and text[end] in digits:
        end += 1
    return sign * int(text[:end], base) if end else 0
