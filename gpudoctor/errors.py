"""Exit codes and the one error type the CLI turns into a one-line message.

Exit codes (README, `--help`):
  0  nothing at or above --fail-on
  1  a finding at or above --fail-on (default: fail; an `error` finding counts as fail)
  2  usage error: bad option, unknown code, unusable input file (corrupt snapshot...)
  3  gpudoctor could not run at all (internal error, output not writable, no data source)
  129  hung up (SIGHUP)
  130  interrupted (Ctrl-C, SIGTERM)
"""

from __future__ import annotations

import json

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_HANGUP = 129
EXIT_INTERRUPTED = 130


def shown(value: object, limit: int = 40) -> str:
    """A value from a user's file or call, as a one-line message quotes it: its repr, cut short.

    A 400-digit number or a megabyte string is not printed whole; its length is said instead."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 10]}... ({len(text)} characters)"


class UserError(Exception):
    """An error the user can act on; printed as one line, never as a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE, kind: str = "input") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.kind = kind  # "usage", "input", "internal", "unavailable", "interrupted" (report schema)


def wants_json(argv: list[str]) -> bool:
    """--json given to gpudoctor itself, not to a command it follows (`watch -- cmd --json`)."""
    ours = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in ours


def error_document(argv: list[str], kind: str, message: str, exit_code: int) -> str:
    """The JSON document of a run that could not report (schema: report.schema.json, `error`)."""
    command = next((a for a in argv if not a.startswith("-")), "")
    doc = {"schema_version": 1, "command": command, "exit_code": exit_code, "error": {"kind": kind, "message": message}}
    return json.dumps(doc, indent=2) + "\n"
