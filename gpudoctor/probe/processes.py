"""Compute processes on a GPU, with their owner and command line where we can see them.

Command lines are other people's: `command_line` redacts their secrets (gpudoctor.safety.redact) before
they reach a snapshot, a report or a recording, and marks where it did.

NVML's PIDs are ours in the host's PID namespace, and in a container on a driver that converts
them (open kernel modules since 535.113.01); on older drivers they are the host's. `probe.pids`
decides which local process a PID is, and leaves it unresolved rather than pin it on the wrong one.
"""

from __future__ import annotations

import pwd
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpudoctor.probe.device import DeviceReader, convert_value
from gpudoctor.probe.pids import PidView, pid_view
from gpudoctor.safety import redact
from gpudoctor.snapshot import GpuProcess, Missing

MIB = 1 << 20


def _owner(status_text: str) -> str | None:
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return str(uid)
    return None


def resolve(pid: int, root: Path, view: PidView) -> tuple[int | None, str | None, str | None]:
    """(local_pid, user, command) of the process NVML calls `pid`, or Nones where it is not ours to see."""
    local = view.local(pid, root)
    if local is None:
        return None, None, None
    proc = root / "proc" / str(local)
    try:
        status = (proc / "status").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, None, None
    user = _owner(status)
    try:
        raw = (proc / "cmdline").read_bytes()
        command = command_line(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a) or None
    except OSError:
        command = None
    if command is None:
        name = next((ln.split(":", 1)[1].strip() for ln in status.splitlines() if ln.startswith("Name:")), "")
        command = f"[{name}]" if name else None
    return local, user, command


def command_line(args: Iterable[str], limit: int = 300) -> str:
    """A process's argv as one line, its secrets redacted (`[redacted]`): findings are one-line
    messages, and `python -c "..."` arguments carry newlines. Whitespace runs become one space;
    a long line is cut with '...'."""
    text = " ".join(" ".join(arg.split()) for arg in redact.argv(_first_chars(args, 4 * limit)))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_chars(args: Iterable[str], budget: int) -> list[str]:
    """The arguments cut to `budget` characters in all, before redaction: another user's process
    may carry a 128 KiB argument, and redacting what is never shown would cost seconds each."""
    out = []
    for arg in args:
        if budget <= 0:
            break
        out.append(arg[:budget])
        budget -= len(arg) + 1
    return out


def from_nvml(raw: Any, root: Path, view: PidView) -> list[GpuProcess]:
    """NVML's process structs (nvmlDeviceGetComputeRunningProcesses) as resolved GpuProcesses.

    Also what the watch sampler uses, so both see the same owner and command, or none.
    """
    out = []
    for p in raw:
        pid = int(p.pid)
        used = getattr(p, "usedGpuMemory", None)
        local_pid, user, command = resolve(pid, root, view)
        out.append(
            GpuProcess(
                pid=pid,
                used_memory_mib=None if used is None else int(used) // MIB,
                local_pid=local_pid,
                user=user,
                command=command,
            )
        )
    return sorted(out, key=lambda p: p.pid)


def processes(reader: DeviceReader, root: Path, isolated: bool | Missing) -> list[GpuProcess] | Missing:
    raw = reader.call("nvmlDeviceGetComputeRunningProcesses")
    view = pid_view(root, isolated)
    return convert_value(raw, lambda r: from_nvml(r, root, view), "nvmlDeviceGetComputeRunningProcesses")
