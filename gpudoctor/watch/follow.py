"""Following a job: start a command (or attach to a PID) and track its process tree.

A started command runs in its own process group, so stopping it reaches torchrun and every
rank it spawned; on Linux it also gets SIGTERM if gpudoctor itself dies (PR_SET_PDEATHSIG).
No process outlives gpudoctor: `stop()` sends SIGTERM to the group, waits, then SIGKILL.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import threading

import psutil

from gpudoctor.errors import EXIT_USAGE, UserError
from gpudoctor.procs import terminate_group

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class Job:
    def __init__(self, proc: subprocess.Popen[bytes] | None, root: psutil.Process, command: str) -> None:
        self._popen = proc
        self.root = root
        self.command = command
        self._lock = threading.Lock()
        self._tree: frozenset[int] = frozenset({root.pid})
        self.exit_code: int | None = None

    @classmethod
    def start(cls, argv: list[str]) -> Job:
        try:
            proc = subprocess.Popen(
                argv,
                start_new_session=True,  # its own process group: stop() reaches every rank
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
            )
        except FileNotFoundError:
            raise UserError(f"command not found: {argv[0]}", EXIT_USAGE, "usage") from None
        except PermissionError:
            raise UserError(f"command not executable: {argv[0]}", EXIT_USAGE, "usage") from None
        return cls(proc, psutil.Process(proc.pid), " ".join(argv))

    @classmethod
    def attach(cls, pid: int) -> Job:
        try:
            proc = psutil.Process(pid)
            command = " ".join(proc.cmdline()) or proc.name()
        except psutil.NoSuchProcess:
            raise UserError(f"no process with PID {pid}", EXIT_USAGE, "usage") from None
        except psutil.AccessDenied:
            command = f"PID {pid}"
        return cls(None, proc, command)

    @property
    def owned(self) -> bool:
        return self._popen is not None

    def pids(self) -> frozenset[int]:
        """The job's process tree as last refreshed (root included)."""
        with self._lock:
            return self._tree

    def refresh(self) -> frozenset[int]:
        tree = {self.root.pid}
        try:
            tree.update(c.pid for c in self.root.children(recursive=True))
        except psutil.Error:
            pass
        with self._lock:
            self._tree = frozenset(tree)
        return self._tree

    def poll(self) -> int | None:
        """The exit code once the job has ended (0 for an attached PID, whose code we cannot know)."""
        if self.exit_code is not None:
            return self.exit_code
        if self._popen is not None:
            code = self._popen.poll()
            if code is not None:
                self.exit_code = code if code >= 0 else 128 - code  # killed by a signal: shell convention
        elif not self.root.is_running() or self.root.status() == psutil.STATUS_ZOMBIE:
            self.exit_code = 0
        return self.exit_code

    def wait(self) -> None:
        """Block until the job ends (run on a helper thread)."""
        if self._popen is not None:
            self._popen.wait()
        else:
            try:
                self.root.wait()
            except psutil.Error:
                pass

    def stop(self, grace_s: float = 5.0) -> None:
        """End a job we started: SIGTERM its process group, then SIGKILL what is left (never
        another group that took over a reused PID: see gpudoctor.procs)."""
        if self._popen is None:
            return
        terminate_group(self._popen, grace_s=grace_s)
        self.poll()
