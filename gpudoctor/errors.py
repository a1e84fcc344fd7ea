"""Exit codes and the one error type the CLI turns into a one-line message.

Exit codes (README, `--help`):
  0  nothing at or above --fail-on
  1  a finding at or above --fail-on (default: fail; an `error` finding counts as fail)
  2  usage error: bad option, unknown code, unusable input file (corrupt snapshot...)
  3  gpudoctor could not run at all (internal error, output not writable, no data source)
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """An error the user can act on; printed as one line, never as a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE, kind: str = "input") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.kind = kind  # "usage", "input", "internal", "unavailable", "interrupted" (report schema)
