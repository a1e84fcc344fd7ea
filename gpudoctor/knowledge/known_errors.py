"""Known failure texts of CUDA/NCCL/c10d, turned into a kind the checks explain (torch-free)."""

from __future__ import annotations

import re

# (kind, pattern); the first match wins, so the specific causes come before "timeout".
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("port_in_use", re.compile(r"address already in use|errno: 98|EADDRINUSE", re.I)),
    ("fabric_manager", re.compile(r"error \(?802\)?|system not yet initialized|cudaErrorSystemNotReady", re.I)),
    ("devices_busy", re.compile(r"all CUDA-capable devices are busy or unavailable", re.I)),
    (
        "shm",
        re.compile(
            r"posix_fallocate failed|Error while creating shared memory segment|/dev/shm.*No space left|"
            r"No space left on device.*shm|unable to (?:allocate|create) shared memory",
            re.I,
        ),
    ),
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError", re.I)),
    # A peer went away: this rank is a victim, the cause is on the other side.
    (
        "peer_lost",
        re.compile(
            r"Connection reset by peer|Connection closed by peer|remote process exited|"
            r"Broken pipe|remote worker",
            re.I,
        ),
    ),
    ("timeout", re.compile(r"timed out|timeout|Socket Timeout|DistStoreError: .*wait", re.I)),
]


def classify(text: str) -> str | None:
    """The kind of a known failure found in `text` (an exception message or a log), or None."""
    for kind, pattern in _PATTERNS:
        if pattern.search(text):
            return kind
    return None
