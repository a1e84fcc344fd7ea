"""Following a job: start a command (or attach to a PID) and track its process tree.

A started command runs in its own process group, so stopping it reaches torchrun and every
rank it spawned; on Linux it also gets SIGTERM if gpudoctor itself dies (PR_SET_PDEATHSIG).
No process outlives gpudoctor: `stop()` sends SIGTERM to the group (SIGHUP when gpudoctor's
terminal hung up: the job runs in a session of its own, so only gpudoctor can pass the hang-up on,
as a shell does for its jobs), waits, then SIGKILL. And
since PDEATHSIG reaches only the command itself, not the ranks it started, a sentinel process
(gpudoctor/watch/sentinel.py) waits beside the job on a pipe only gpudoctor writes to: if
gpudoctor dies without stopping the job (SIGKILL, a crash), the pipe ends and the sentinel stops
the job's whole process group, then exits.

A descendant can leave the group (`setsid`, a daemon that double-forks). So the whole tree is
followed too: gpudoctor becomes the job's child subreaper (PR_SET_CHILD_SUBREAPER: an orphaned
descendant is re-parented to gpudoctor, not to init, so it stays in the tree and is reaped here),
every descendant seen is recorded with its start time, and those outside the group are told to
the sentinel. `stop()` signals the group and every recorded or adopted descendant; the sentinel
does the same from its list. Both also find descendants by the job's mark: a random token in the
job's environment (sentinel.JOB_ENV), which every descendant inherits, so one that detached after
the last process reading is found too (only the sentinel and the job know the token).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

import psutil

from gpudoctor.errors import EXIT_USAGE, UserError, shown
from gpudoctor.probe.processes import command_line  # one line, secrets redacted: it goes into recordings
from gpudoctor.safety.procs import terminate_group
from gpudoctor.watch.output import StderrTail

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h, since Linux 3.4
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long (Job.stop and the sentinel alike)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def adopt_orphans() -> bool:
    """Make gpudoctor the child subreaper of what it starts (Linux): a descendant whose parent exits
    is re-parented to gpudoctor instead of init, so it stays in the followed tree. True if set."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Job:
    def __init__(
        self, proc: subprocess.Popen[bytes] | None, root: psutil.Process, command: str, display: str = ""
    ) -> None:
        self._popen = proc
        self.root = root
        self.command = command  # as the allow-list shows it: what recordings get
        self.display = display or command  # the user's own command whole: for the terminal only
        self._lock = threading.Lock()
        self._tree: frozenset[int] = frozenset({root.pid})
        self.exit_code: int | None = None
        self._sentinel: subprocess.Popen[bytes] | None = None
        self._sentinel_pipe: int | None = None  # the write end; closed (EOF) only if gpudoctor dies
        self.adopting = False  # gpudoctor is the subreaper of the job's orphans
        self._known: dict[int, psutil.Process] = {}  # descendants seen that still run (psutil checks the start time)
        self._told: set[int] = set()  # descendants outside the group already told to the sentinel
        self.stderr: StderrTail | None = None  # the command's stderr, passed through, its tail kept
        self.token = ""  # the job's mark in its environment (sentinel.JOB_ENV); "" for an attached PID

    @classmethod
    def start(
        cls,
        argv: list[str],
        env: dict[str, str] | None = None,
        adopt: bool = False,
        channel: str | None = None,
        keep_stderr: bool = False,
    ) -> Job:
        """Start `argv` in its own process group. `adopt`: become the subreaper of its orphans
        (the CLI does; it changes who reaps orphans for the whole gpudoctor process). `channel`: the
        job's step-channel directory, which the sentinel removes if gpudoctor dies. `keep_stderr`: its
        standard error goes through a pipe to ours, its tail kept (`Job.stderr`: why a rank failed)."""
        from gpudoctor.watch.sentinel import JOB_ENV

        adopting = adopt and adopt_orphans()
        token = secrets.token_hex(16)
        read_end, write_end = os.pipe() if keep_stderr else (None, None)
        try:
            proc = subprocess.Popen(
                argv,
                env={**(os.environ if env is None else env), JOB_ENV: token},
                stderr=write_end,
                start_new_session=True,  # its own process group: stop() reaches every rank
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
            )
        except (FileNotFoundError, PermissionError) as exc:
            for fd in (read_end, write_end):
                if fd is not None:
                    os.close(fd)
            what = "not found" if isinstance(exc, FileNotFoundError) else "not executable"
            raise UserError(f"command {what}: {shown(argv[0], 200)}", EXIT_USAGE, "usage") from None
        job = cls(proc, psutil.Process(proc.pid), command_line(argv), display=" ".join(argv))
        if write_end is not None and read_end is not None:
            os.close(write_end)  # the command holds it now: the pipe ends when the command's last writer does
            job.stderr = StderrTail(read_end)
        job.adopting, job.token = adopting, token
        job._start_sentinel(channel)
        return job

    def _start_sentinel(self, channel: str | None = None) -> None:
        """Start the process that stops the job's group if gpudoctor dies first (see sentinel.py).

        The pipe is created after the job started and is close-on-exec, so only gpudoctor holds
        its write end. Without a sentinel (it could not start) the job is still stopped by
        `stop()` and, for its root process, by PDEATHSIG.
        """
        if sys.platform == "win32":
            return
        from gpudoctor.watch import sentinel

        read_end, write_end = os.pipe()
        try:
            self._sentinel = subprocess.Popen(
                [
                    sys.executable,
                    "-I",  # isolated: the script's folder is not put on sys.path
                    os.path.abspath(sentinel.__file__),
                    str(self.root.pid),
                    repr(self.root.create_time()),
                    repr(STOP_GRACE_S),
                    *([channel] if channel else []),
                ],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a signal to gpudoctor's group does not end it with gpudoctor
                cwd="/",
            )
        except (OSError, psutil.Error):
            os.close(write_end)
            return
        finally:
            os.close(read_end)
        self._sentinel_pipe = write_end
        with contextlib.suppress(OSError):
            os.write(write_end, f"={self.token}\n".encode())  # the mark: through the pipe, never argv

    def _release_sentinel(self) -> None:
        """The job is stopped: tell the sentinel to exit without doing anything, and reap it."""
        fd, self._sentinel_pipe = self._sentinel_pipe, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, b"q\n")
            os.close(fd)
        if self._sentinel is not None:
            try:
                self._sentinel.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self._sentinel.kill()
                self._sentinel.wait()
            self._sentinel = None

    @classmethod
    def attach(cls, pid: int) -> Job:
        display = ""
        try:
            proc = psutil.Process(pid)
            argv = proc.cmdline()
            command = command_line(argv) or proc.name()
            if proc.uids().real == os.getuid():
                display = " ".join(" ".join(a.split()) for a in argv)  # the user's own: whole on the terminal
        except psutil.NoSuchProcess:
            raise UserError(f"no process with PID {pid}", EXIT_USAGE, "usage") from None
        except psutil.AccessDenied:
            command = f"PID {pid}"
        return cls(None, proc, command, display)

    @property
    def owned(self) -> bool:
        return self._popen is not None

    def pids(self) -> frozenset[int]:
        """The job's process tree as last refreshed (root included)."""
        with self._lock:
            return self._tree

    def _descendants(self) -> list[psutil.Process]:
        """The job's processes now: the root's tree, and (as subreaper) the orphans adopted from it."""
        found: dict[int, psutil.Process] = {}
        tops = [self.root]
        if self.adopting:
            mine = {self.root.pid, self._sentinel.pid if self._sentinel is not None else -1}
            with contextlib.suppress(psutil.Error):
                tops += [c for c in psutil.Process().children() if c.pid not in mine]
        for top in tops:
            try:
                if top.is_running():
                    found[top.pid] = top
                found.update((c.pid, c) for c in top.children(recursive=True))
            except psutil.Error:
                continue
        return list(found.values())

    def refresh(self) -> frozenset[int]:
        """Record the job's process tree (root included); returns it. Adopted orphans that ended
        are reaped here, and descendants that left the job's process group are told to the sentinel."""
        procs = self._descendants()
        tree = {self.root.pid, *(p.pid for p in procs)}
        with self._lock:
            self._tree = frozenset(tree)
            for p in procs:
                self._known.setdefault(p.pid, p)
            outside = [p for pid, p in self._known.items() if pid not in tree]
        # A descendant seen before and no longer in the tree is held while it runs (it may have left the
        # job, and stop() still stops it); one that ended is forgotten: a job whose processes come and go
        # (a DataLoader's spawned workers every epoch) is held by those alive, not by all it ever had.
        ended = [p.pid for p in outside if not _running(p)]
        if ended:
            with self._lock:
                for pid in ended:
                    self._known.pop(pid, None)
                    self._told.discard(pid)
        self._reap_adopted()
        if self._popen is not None:
            self._tell_sentinel([p for p in procs if p.pid != self.root.pid])
        return self._tree

    def owns(self, pid: int) -> bool:
        """Whether `pid` is one of the job's processes: in the tree as last recorded, or descended from
        the job's root (or, as subreaper, from gpudoctor but not the sentinel) now."""
        if pid in self.pids():
            return True
        try:
            ancestors = {p.pid for p in psutil.Process(pid).parents()}
        except psutil.Error:
            return False
        if self.root.pid in ancestors:
            return True
        sentinel = self._sentinel.pid if self._sentinel is not None else -1
        return self.adopting and os.getpid() in ancestors and sentinel not in ancestors

    def _reap_adopted(self) -> None:
        """Collect the exit status of adopted orphans (never of the root or the sentinel: theirs
        belongs to their Popen)."""
        if not self.adopting:
            return
        mine = {self.root.pid, self._sentinel.pid if self._sentinel is not None else -1}
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children():
                if child.pid in mine:
                    continue
                with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
                    if child.status() == psutil.STATUS_ZOMBIE:
                        os.waitpid(child.pid, os.WNOHANG)

    def held(self) -> int:
        """Descendants held now: those alive (in the tree or not), never all the job ever had."""
        with self._lock:
            return len(self._known)

    def _tell_sentinel(self, procs: list[psutil.Process]) -> None:
        """Descendants outside the job's group: the sentinel's killpg would miss them, so it gets their
        PIDs and start times (a line each) to stop them too if gpudoctor dies."""
        if self._sentinel_pipe is None:
            return
        lines = []
        for p in procs:
            if p.pid in self._told:
                continue
            try:
                if os.getpgid(p.pid) == self.root.pid:
                    continue
                lines.append(f"+{p.pid} {p.create_time()!r}\n")
            except (OSError, psutil.Error):
                continue
            self._told.add(p.pid)
        if lines:
            with contextlib.suppress(OSError):
                os.write(self._sentinel_pipe, "".join(lines).encode())

    def _strays(self) -> list[psutil.Process]:
        """Live descendants outside the job's process group (recorded, adopted or carrying the job's
        mark), which killpg misses; only those whose start time psutil knows, so that a signal
        reaches them and not a process that took a number since."""
        from gpudoctor.watch.sentinel import marked

        with self._lock:
            known = dict(self._known)
        known.update((p.pid, p) for p in self._descendants())
        with contextlib.suppress(psutil.Error):
            known.update((p.pid, p) for p in marked(self.token, os.getuid(), self.root.create_time()))
        out = []
        for pid, p in known.items():
            if pid == self.root.pid:
                continue
            try:
                p.create_time()  # raises when unknown: psutil could not tell a reused PID
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and os.getpgid(pid) != self.root.pid:
                    out.append(p)
            except (OSError, psutil.Error):
                continue
        return out

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

    def stop(self, grace_s: float = STOP_GRACE_S, sig: signal.Signals = signal.SIGTERM) -> None:
        """End a job we started: `sig` (SIGTERM; SIGHUP when gpudoctor's terminal hung up, as a shell
        passes it on to its jobs) to its process group and descendants, then SIGKILL what is left after
        `grace_s` (never another group that took over a reused PID: see gpudoctor.safety.procs); then release
        the sentinel."""
        if self._popen is None:
            return
        self.refresh()
        strays = self._strays()  # before the group ends: their parents may be in it
        deadline = time.monotonic() + grace_s
        for p in strays:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)  # psutil refuses a PID that now belongs to another process
        terminate_group(self._popen, grace_s=grace_s, first=sig)
        _, alive = psutil.wait_procs(strays, timeout=max(0.1, deadline - time.monotonic()) if strays else 0)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=2.0)
        self._reap_adopted()
        self._release_sentinel()  # not when stopping failed: then the sentinel's EOF stops the group
        self.poll()


def _running(p: psutil.Process) -> bool:
    """`p` still runs (the same process: psutil compares the start time), a zombie included."""
    try:
        return p.is_running()
    except psutil.Error:
        return True  # unknown: kept, as before
