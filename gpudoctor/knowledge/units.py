"""Sizes and lists as gpudoctor writes them: one convention, one formatter.

Convention: sizes are binary and labelled so. 1 KiB = 1024 bytes, 1 MiB = 2**20, 1 GiB = 2**30.
Every size gpudoctor reads is binary already: NVML and nvidia-smi count GPU memory in MiB, the
kernel reports RAM, cgroup limits and /dev/shm in bytes, and `docker --memory 32g` or
`--shm-size=1g` mean GiB. So a 16376 MiB RTX 4080 is "16 GiB", never a decimal "17 GB".

How a size is written (`size`):

- 10 GiB and more: whole GiB ("80 GiB", "1152 GiB");
- 1 GiB up to 10 GiB: one decimal, without a trailing ".0" ("1 GiB", "7.5 GiB");
- 1 MiB up to 1 GiB: whole MiB ("64 MiB", "512 MiB");
- below 1 MiB: whole KiB ("64 KiB"), and bytes below 1 KiB.

Bandwidths stay decimal (GB/s = 10**9 bytes per second), as NVIDIA and nccl-tests write them.
JSON evidence keys ending in `_gb` (e.g. `usable_ram_gb`, kept for compatibility) hold GiB.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


def _trim(value: float) -> str:
    """One decimal, without a trailing '.0'."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def size(n_bytes: float) -> str:
    """A size in bytes, written by the convention above."""
    n = float(n_bytes)
    if abs(n) >= GIB:
        gib = n / GIB
        return f"{gib:.0f} GiB" if abs(gib) >= 9.95 else f"{_trim(gib)} GiB"
    if abs(n) >= MIB:
        return f"{n / MIB:.0f} MiB"
    if abs(n) >= KIB:
        return f"{n / KIB:.0f} KiB"
    return f"{n:.0f} B"


def size_mib(n_mib: float) -> str:
    """A size NVML gives in MiB (GPU memory), written like `size`."""
    return size(n_mib * MIB)


def size_gib(n_gib: float) -> str:
    """A size held in GiB (e.g. --ram-per-gpu), written like `size`."""
    return size(n_gib * GIB)


def gpu_list(indices: list[int]) -> str:
    """NVML indices as nvidia-smi numbers them, in that order: '0, 1, 5'."""
    return ", ".join(str(i) for i in sorted(indices))


def listed(items: list[str], limit: int = 4, sep: str = ", ") -> str:
    """The first `limit` items, then how many more: 'a, b, c, d, +2 more'."""
    shown = sep.join(items[:limit])
    return f"{shown}{sep}+{len(items) - limit} more" if len(items) > limit else shown
