"""A running Python process's stack, read from outside without stopping it: `py-spy dump --nonblocking`.

py-spy (https://github.com/benfred/py-spy, MIT) reads another process's memory (process_vm_readv), which
the kernel allows like ptrace: a process of the same user, unless Yama's ptrace_scope restricts it
(https://www.kernel.org/doc/html/latest/admin-guide/LSM/Yama.html: 1 = only a parent may trace, 2 = only
with CAP_SYS_PTRACE, 3 = nobody). `--nonblocking` reads without pausing the target ("Don't pause the
python process when collecting samples", `py-spy dump --help`): a stuck process's stack does not move
anyway. It is optional (`pip install py-spy`, or gpudoctor's `stacks` extra): without it, or where the
kernel would refuse, `why_not` says so in the user's words and nothing is run.

py-spy is looked for beside this interpreter (the same virtual environment), then on PATH. Its output is
parsed as JSON; only each frame's function, file and line are kept (never its locals).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from gpudoctor.safety.safe_text import printable

YAMA = "/proc/sys/kernel/yama/ptrace_scope"
CAP_SYS_PTRACE = 19  # linux/capability.h
DUMP_TIMEOUT_S = 10.0
MAX_OUTPUT = 4 << 20  # a dump of a process with hundreds of threads is well under this


@dataclass(frozen=True)
class Stack:
    frames: tuple[tuple[str, str, int], ...] = ()  # (function, short file, line), innermost first
    files: tuple[str, ...] = ()  # each frame's full file name (to tell the user's own code)
    note: str = ""  # why there is no stack


def py_spy() -> str | None:
    """The py-spy executable: beside this interpreter, else on PATH; None if there is none."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("py-spy")


def _capable() -> bool:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def ptrace_scope() -> int | None:
    """Yama's ptrace_scope (0-3), or None when the kernel has no Yama (the classic same-user rule)."""
    try:
        with open(YAMA, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def why_not(pid: int) -> str | None:
    """Why the stack of `pid` cannot be read here (None: it can be tried)."""
    if sys.platform != "linux":
        return "reading another process's stack is supported on Linux only"
    if py_spy() is None:
        return "py-spy is not installed (`pip install py-spy` shows where each stuck rank is)"
    capable = _capable()
    scope = ptrace_scope()
    if scope == 3:
        return "the kernel forbids tracing processes (kernel.yama.ptrace_scope = 3)"
    if scope == 2 and not capable:
        return (
            "only root may read another process's stack here (kernel.yama.ptrace_scope = 2): "
            "`sudo py-spy dump --pid PID`"
        )
    if scope == 1 and not capable:
        return (
            "only a process's parent may read its stack here (kernel.yama.ptrace_scope = 1): "
            "`sudo py-spy dump --pid PID`, or `sudo sysctl kernel.yama.ptrace_scope=0`"
        )
    try:
        uids = psutil.Process(pid).uids()
    except psutil.Error:
        return "the process has gone"
    if not capable and (uids.real != os.geteuid() or uids.effective != os.geteuid()):
        return "the process runs as another user"
    return None


def dump(
    pid: int,
    timeout: float = DUMP_TIMEOUT_S,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
    tries: int = 3,
) -> Stack:
    """The main thread's stack of `pid` (or why not), read with `py-spy dump --nonblocking --json`.
    `on_start` gets the py-spy process as it starts (so that a caller closing down can kill it). Reading
    without pausing the process can catch its memory mid-change ("Failed to get stack traces"): tried
    again, `tries` times in all."""
    stack = Stack()
    for _ in range(max(1, tries)):
        stack = _dump_once(pid, timeout, on_start)
        if stack.frames or not stack.note.startswith("py-spy failed"):
            return stack
    return stack


def _dump_once(pid: int, timeout: float, on_start: Callable[[subprocess.Popen[bytes]], None] | None) -> Stack:
    reason = why_not(pid)
    exe = py_spy()
    if reason is not None or exe is None:
        return Stack(note=reason or "py-spy is not installed")
    try:
        proc = subprocess.Popen(
            [exe, "dump", "--pid", str(pid), "--nonblocking", "--json"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        return Stack(note=f"py-spy could not run: {exc.strerror or exc}")
    if on_start is not None:
        on_start(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Stack(note=f"py-spy did not answer within {timeout:.0f} s")
    if proc.returncode != 0:
        first = next((x for x in err.decode("utf-8", "replace").splitlines() if x.strip()), "")
        return Stack(note=f"py-spy failed: {printable(first)[:200]}" if first else "py-spy failed")
    return parse(out[:MAX_OUTPUT])


def parse(raw: bytes) -> Stack:
    """py-spy's JSON (a list of threads, each with frames innermost first): the main thread's frames."""
    try:
        threads = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return Stack(note="py-spy's output could not be read")
    if not isinstance(threads, list) or not threads:
        return Stack(note="py-spy found no Python thread")
    main = next((t for t in threads if isinstance(t, dict) and t.get("thread_name") == "MainThread"), threads[0])
    frames, files = [], []
    for f in main.get("frames", []) if isinstance(main, dict) else []:
        if not isinstance(f, dict):
            continue
        name, short, line = f.get("name"), f.get("short_filename") or f.get("filename"), f.get("line")
        if isinstance(name, str) and isinstance(short, str) and isinstance(line, int):
            frames.append((printable(name)[:120], printable(short)[:200], line))
            full = f.get("filename")
            files.append(full if isinstance(full, str) else short)
    if not frames:
        return Stack(note="py-spy found no Python frame in the main thread")
    return Stack(tuple(frames), tuple(files))
