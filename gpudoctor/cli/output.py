"""Standard output for the commands: a write that fails (closed pipe, full disk, closed descriptor)
raises OutputError, and the exit code a command decided before it wrote stands."""

from __future__ import annotations

import errno
import sys
from typing import Any

import click

from gpudoctor.errors import EXIT_UNAVAILABLE


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
