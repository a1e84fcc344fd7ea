"""Reading a file the user named (a policy, a baseline report): one-line reasons, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class UserFileError(ValueError):
    """Why a named file cannot be used, in a few words ("no such file", "not valid JSON: ...")."""


# A policy or a saved report is kilobytes; a file this large is something else (a log, /dev/zero).
MAX_BYTES = 32 << 20


def read_text(path: str | Path) -> str:
    """The file's text: a regular file only (a FIFO would block, /dev/zero never end), at most MAX_BYTES."""
    from gpudoctor.safe_io import InputFileError
    from gpudoctor.safe_io import read_text as read_regular

    try:
        return read_regular(path, MAX_BYTES)
    except InputFileError as exc:
        raise UserFileError(exc.strerror) from None
    except FileNotFoundError:
        raise UserFileError("no such file") from None
    except IsADirectoryError:
        raise UserFileError("is a directory") from None
    except PermissionError:
        raise UserFileError("permission denied") from None
    except UnicodeDecodeError:
        raise UserFileError("not UTF-8 text") from None
    except OSError as exc:
        raise UserFileError(exc.strerror or str(exc)) from None


def _no_constants(name: str) -> Any:
    raise UserFileError(f"not valid JSON: {name} is not a number JSON allows")


def read_json(path: str | Path) -> Any:
    """The file's JSON; NaN and Infinity (Python's extension, not JSON) are refused."""
    text = read_text(path)
    try:
        return json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise UserFileError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise UserFileError("not valid JSON: nested too deeply") from None
