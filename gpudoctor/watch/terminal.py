"""The terminal `watch` runs in: noticing that it went away, and writing to it without getting stuck.

**A terminal that goes away ends watch as the SIGHUP it normally brings would.** When an SSH session
drops or a tmux pane is killed, the kernel hangs the terminal up but sends SIGHUP only to the
session's leader (the login shell, or whatever tmux ran), which is expected to pass it on to its
jobs. Where nothing passes it on (a wrapper between the pane and gpudoctor, a shell that does not
forward it), gpudoctor gets no signal at all: its terminal just reads end of file and refuses
writes (EIO). The dashboard then never ended: Textual's input thread reads that end of file in a
loop at half a core and never tells the app (textual/drivers/linux_driver.py, `run_input_thread`:
an empty read is taken for piped input), and output to the dead terminal was dropped. A headless
`watch --no-tui > file` had nothing that could notice at all.

`HangupWatch` is a thread that polls the terminals among stdin, stdout and stderr for POLLHUP (a
hung-up tty reports it, and so does a pty whose other side closed: Linux n_tty_poll and
hung_up_tty_poll) and, once one hangs up, sends SIGHUP to gpudoctor's main thread: one way out
for the dashboard and the headless loop, the same as a real SIGHUP (exit 129, a followed command
stopped). It costs one poll() every POLL_S seconds. It is not started when SIGHUP is ignored
(`nohup gpudoctor watch ...`: the user asked to outlive the terminal) or when no standard stream
is a terminal (`setsid gpudoctor watch --no-tui </dev/null >log 2>&1 &` outlives it too).

**Output that cannot get stuck.** A terminal that is not read (an SSH connection that stalls, a
tmux server that is stopped) fills up: Textual's writer thread blocks in write(), its queue of 30
frames fills, and the event loop blocks in the next frame's put() for as long as the terminal is
not read: SIGTERM, which the loop handles, was then never acted on. `TerminalOutput` writes through
a file description of its own opened non-blocking (never the shared one: O_NONBLOCK set on that
would reach the shell and the followed command), waits for the terminal to take the rest as
long as the dashboard runs, but once gpudoctor is told to stop, a terminal that takes nothing for
STALL_S seconds gets nothing more. A write that fails (EIO, EPIPE: the terminal is gone) drops
the output from then on instead of raising: Textual's writer thread would die of it and the app
then block for good on its full queue (Textualize/textual#6692).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from typing import IO, Any

POLL_S = 0.5  # the longest a hang-up goes unnoticed (a closing pty usually wakes the poll at once)
HUNG_UP = select.POLLHUP | select.POLLERR
STALL_S = 0.5  # once stopping: a terminal that takes no output for this long gets no more


def _terminals(fds: tuple[int, ...]) -> list[int]:
    out = []
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.isatty(fd):
                out.append(fd)
    return out


def _hung_up(fds: list[int], timeout_s: float) -> bool:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, 0)  # no events asked for: POLLHUP and POLLERR are always reported
    try:
        return any(mask & HUNG_UP for _, mask in poller.poll(timeout_s * 1000))
    except InterruptedError:
        return False


class HangupWatch:
    """Sends SIGHUP to the main thread once a terminal among `fds` hangs up; `stop()` ends the watch."""

    def __init__(self, fds: tuple[int, ...] = (0, 1, 2)) -> None:
        self.fds = _terminals(fds)
        self._stop = threading.Event()

    def start(self) -> bool:
        """Start watching; False (nothing started) without a terminal or when SIGHUP is ignored."""
        if not self.fds or signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
            return False
        threading.Thread(target=self._run, name="gpudoctor-hangup", daemon=True).start()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            if _hung_up(self.fds, POLL_S) and not self._stop.is_set():
                # At the main thread: its blocking wait is interrupted and the handler runs at once.
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGHUP)
                return

    def stop(self) -> None:
        """No SIGHUP from now on (the thread ends within POLL_S; a daemon, nothing waits for it)."""
        self._stop.set()


def _own_description(fd: int) -> int | None:
    """The terminal behind `fd` opened again, non-blocking, for writing (None: it cannot be)."""
    try:
        return os.open(os.ttyname(fd), os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None


class TerminalOutput:
    """A terminal stream for Textual's writer thread whose writes never raise, and never block for
    good once `stopping` is set (see the module's docstring)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.gone = False  # output is dropped from now on
        self.stopping = False  # set from a signal handler: do not wait for a terminal that is not read
        self._stalled_since: float | None = None
        try:
            self._fd = _own_description(stream.fileno())
        except (OSError, ValueError):
            self._fd = None
        self._encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> None:
        if self.gone:
            return
        if self._fd is None:  # not a terminal we could open again: plain writes (these may block)
            try:
                self._stream.write(text)
            except (OSError, ValueError):
                self.gone = True
            return
        data = memoryview(text.encode(self._encoding, "replace"))
        while data and not self.gone:
            try:
                data = data[os.write(self._fd, data) :]
                self._stalled_since = None
            except BlockingIOError:
                self._wait_writable()
            except OSError:
                self.gone = True

    def _wait_writable(self) -> None:
        if self.stopping:
            now = time.monotonic()
            if self._stalled_since is None:
                self._stalled_since = now
            elif now - self._stalled_since >= STALL_S:
                self.gone = True  # nobody reads it: the rest (restoring the screen) cannot arrive anyway
                return
        assert self._fd is not None
        with contextlib.suppress(OSError, ValueError):
            select.select([], [self._fd], [], 0.1)  # a short wait: `stopping` is looked at again soon

    def flush(self) -> None:
        if self._fd is None and not self.gone:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.gone = True

    def close(self) -> None:
        fd, self._fd = self._fd, None
        self.gone = True
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
