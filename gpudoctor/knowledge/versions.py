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
