"""SIGTERM and SIGHUP end gpudoctor the way Ctrl-C does: cleanly, with a report of why.

A dropped SSH session sends SIGHUP; a scheduler or `timeout` sends SIGTERM. Python's default
for both is to die on the spot, leaving ranks to their death signal, the rank directory on
disk and no error document for a CI job to read. `install()` turns them into `Stopped`, a
KeyboardInterrupt, so every `finally` runs (ranks stopped, temporary files removed) and the CLI
ends with one line, the JSON error document under --json, and the exit code `exit_code` gives:
129 for SIGHUP (128 + 1, as shells report it), 130 for SIGTERM and Ctrl-C (README: interrupted).

`deferred()` holds these signals back while something that must not be cut short runs (starting
a rank, stopping ranks and removing their directory, writing the error document); one that
arrives meanwhile is acted on as soon as it ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpudoctor.errors import EXIT_HANGUP, EXIT_INTERRUPTED

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """gpudoctor was told to stop by a signal (SIGTERM, SIGHUP)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _signum(exc: BaseException | None) -> int | None:
    """The signal behind an interruption, also when click re-raised it as Abort (its __context__)."""
    while exc is not None:
        signum = getattr(exc, "signum", None)
        if signum is not None:
            return int(signum)
        exc = exc.__cause__ or exc.__context__
    return None


def exit_code(exc: BaseException) -> int:
    """129 for a hang-up, 130 for any other interruption (Ctrl-C, SIGTERM)."""
    return EXIT_HANGUP if _signum(exc) == signal.SIGHUP else EXIT_INTERRUPTED


def describe(exc: BaseException) -> str:
    """The one-line reason: "hung up (SIGHUP)", "terminated (SIGTERM)" or "interrupted"."""
    signum = _signum(exc)
    if signum == signal.SIGHUP:
        return "hung up (SIGHUP)"
    if signum == signal.SIGTERM:
        return "terminated (SIGTERM)"
    return "interrupted"


def _raise(signum: int, frame: Any) -> None:
    raise Stopped(signum)


def install() -> None:
    """Make SIGTERM and SIGHUP raise `Stopped` in the main thread (a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup gpudoctor ...` keeps ignoring SIGHUP
            signal.signal(sig, _raise)


@contextmanager
def deferred(act: bool = True) -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back for the duration (main thread); act on the first after
    (`act=False`: drop them, for a process that is on its way out already).

    The handlers are swapped for one that only records, rather than the signals masked: a mask is
    inherited by processes started meanwhile (the ranks would then ignore SIGTERM), and another
    thread would still take the signal and run the handler in the main thread. What arrived is
    then handled as it would have been: the previous handler is called (Ctrl-C raises
    KeyboardInterrupt, `install()`'s raises Stopped), a default action is carried out.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}
    for sig in HELD:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # ignored stays ignored (nohup)
            previous[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught and act:
            _deliver(caught[0], previous[caught[0]])


def _deliver(signum: int, handler: Any) -> None:
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action: the process ends by this signal
