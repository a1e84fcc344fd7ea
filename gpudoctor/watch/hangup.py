"""A terminal that goes away ends `watch` as the SIGHUP it normally brings would.

When an SSH session drops or a tmux pane is killed, the kernel hangs up the terminal but sends
SIGHUP only to the session's leader (the login shell, or whatever tmux ran), which is expected to
pass it on to its jobs. Where nothing passes it on (a wrapper between the pane and gpudoctor, a
shell that does not forward it), gpudoctor gets no signal at all: its terminal just reads end of
file and refuses writes (EIO). The dashboard then never ended: Textual's input thread reads that
end of file in a loop at half a core and never tells the app (textual/drivers/linux_driver.py,
`run_input_thread`: an empty read is taken for piped input), and output to the dead terminal is
dropped. A headless `watch --no-tui > file` had nothing that could notice at all.

`HangupWatch` is a thread that polls the terminals among stdin, stdout and stderr for POLLHUP (a
hung-up tty reports it, and so does a pty whose other side closed: Linux n_tty_poll and
hung_up_tty_poll) and, once one hangs up, sends SIGHUP to gpudoctor's main thread: one way out
for the dashboard and the headless loop, the same as a real SIGHUP (exit 129, a followed command
stopped). It costs one poll() every POLL_S seconds.

It is not started when SIGHUP is ignored (`nohup gpudoctor watch ...`: the user asked to outlive
the terminal) or when no standard stream is a terminal (`setsid gpudoctor watch --no-tui
</dev/null >log 2>&1 &` outlives it too).
"""

from __future__ import annotations

import os
import select
import signal
import threading

POLL_S = 0.5  # the longest a hang-up goes unnoticed (a closing pty usually wakes the poll at once)
HUNG_UP = select.POLLHUP | select.POLLERR


def _terminals(fds: tuple[int, ...]) -> list[int]:
    out = []
    for fd in fds:
        try:
            if os.isatty(fd):
                out.append(fd)
        except OSError:
            continue
    return out


def _poll(fds: list[int], timeout_s: float) -> bool:
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
        self.fired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start watching; False (nothing started) without a terminal or when SIGHUP is ignored."""
        if not self.fds or signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
            return False
        self._thread = threading.Thread(target=self._run, name="gpudoctor-hangup", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            if not _poll(self.fds, POLL_S) or self._stop.is_set():
                continue
            self.fired = True
            # At the main thread: its blocking wait is interrupted and the handler runs at once.
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGHUP)
            return

    def stop(self) -> None:
        """No SIGHUP from now on (the thread ends within POLL_S; it is a daemon, nothing waits for it)."""
        self._stop.set()
