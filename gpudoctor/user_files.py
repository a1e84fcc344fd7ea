"""Reading a file the user named (a policy, a baseline report): one-line reasons, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class UserFileError(ValueError):
    """Why a named file cannot be used, in a few words ("no such file", "not valid JSON: ...")."""


def read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
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
