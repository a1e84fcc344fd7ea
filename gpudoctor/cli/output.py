"""Standard output for the commands: a write that fails (closed pipe, full disk, closed descriptor)
raises OutputError, and the exit code a command decided before it wrote stands."""

from __future__ import annotations

import errno
import sys
import time
from typing import Any

import click

from gpudoctor.errors import EXIT_UNAVAILABLE
from gpudoctor.safety.safe_text import printable


class OutputError(Exception):
    """Standard output cannot be written. Not an OSError, so click does not swallow it."""

    def __init__(self, errno_: int | None, reason: str) -> None:
        super().__init__(reason)
        self.errno = errno_


class GuardedStdout:
    """sys.stdout whose write failures (closed pipe, full disk, closed descriptor) raise OutputError."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _guard(self, method: str, *args: Any) -> Any:
        if self._stream is None:
            raise OutputError(errno.EBADF, "standard output is closed")
        try:
            return getattr(self._stream, method)(*args)
        except OSError as exc:
            raise OutputError(exc.errno, exc.strerror or str(exc)) from None
        except ValueError as exc:  # writing to a stream already closed
            raise OutputError(errno.EBADF, str(exc)) from None

    def write(self, text: str) -> int:
        return self._guard("write", text)

    def flush(self) -> None:
        if self._stream is not None:  # nothing can be pending on a closed stdout
            self._guard("flush")

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Verdict:
    """The exit code a command has decided before it writes its output: a reader that closes the
    pipe early (`gpudoctor check | head`) does not change it."""

    code = 0


def print_report(
    report: Any, as_json: bool, verbose: int, outputs: Any, quiet: bool = False, color: str = "auto"
) -> None:
    """Side outputs, then the report; an output that failed is a line on stderr and exit 3."""
    problems = outputs.write(report, sys.stderr)
    Verdict.code = EXIT_UNAVAILABLE if problems else report.exit_code  # what a closed pipe still exits with
    if as_json:
        from gpudoctor.render.json import dumps, report_document

        click.echo(dumps(report_document(report)), nl=False)
    else:
        from gpudoctor.render.text import TextOptions, make_console, render_report  # rich: the text report only

        render_report(report, make_console(color), options=TextOptions(verbose=verbose, quiet=quiet))
    for problem in problems:
        click.echo(f"gpudoctor: {problem}", err=True)
    sys.exit(Verdict.code)


class ProgressLine:
    """How far a long read has come, on stderr, rewritten in place: only on a terminal (a log or a pipe
    gets nothing), only once the work has taken SHOW_AFTER_S, at most twice a second; `done()` clears it,
    so what the command prints after starts on a clean line."""

    SHOW_AFTER_S = 1.0  # a heuristic: a command this quick needs no progress
    EVERY_S = 0.5  # a heuristic: often enough to see it move, seldom enough not to flicker

    def __init__(self, what: str, stream: Any = None, clock: Any = time.monotonic) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.what = printable(what)[:60]  # a file name may hold escape sequences: never sent to the terminal
        self.clock = clock
        self.start = self.last = clock()
        self.shown = False
        try:
            self.on = bool(self.stream.isatty())
        except (AttributeError, OSError, ValueError):  # closed, or no terminal to ask
            self.on = False

    def __call__(self, share: float) -> None:
        now = self.clock()
        if not self.on or now - self.start < self.SHOW_AFTER_S or (self.shown and now - self.last < self.EVERY_S):
            return
        self.last = now
        self._write(f"\r{self.what}: {share:.0%} read")
        self.shown = True

    def done(self) -> None:
        if self.shown:
            self._write("\r\x1b[K")  # the line erased
            self.shown = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: the command's own output decides
            self.on = False
