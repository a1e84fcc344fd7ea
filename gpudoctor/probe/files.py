"""Guarded reads of procfs/sysfs files under a root directory (tests point it at tmp_path)."""

from __future__ import annotations

import errno
from pathlib import Path

from gpudoctor.snapshot import Missing


def missing_from_oserror(exc: OSError, path: Path | str) -> Missing:
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        return Missing("no_permission", f"{path}: permission denied")
    if isinstance(exc, FileNotFoundError):
        return Missing("unsupported", f"{path}: not present")
    return Missing("error", f"{path}: {exc.strerror or exc}")


def read_text(root: Path, relative: str) -> str | Missing:
    """The text of root/relative, or a Missing that says why it could not be read."""
    path = root / relative.lstrip("/")
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return missing_from_oserror(exc, "/" + relative.lstrip("/"))


def parse_cpulist(text: str) -> list[int]:
    """'0-55,112-167' (the kernel's cpulist format) -> [0, 1, ..., 167]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return sorted(set(cpus))
