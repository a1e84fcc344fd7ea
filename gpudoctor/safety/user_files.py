"""Reading a file the user named (a policy, a baseline report): one-line reasons, never a traceback."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any


class UserFileError(ValueError):
    """Why a named file cannot be used, in a few words ("no such file", "not valid JSON: ...").

    `untrusted`: the file was readable, but the caller's `trust` test refused it (read_text)."""

    def __init__(self, message: str, *, untrusted: bool = False) -> None:
        super().__init__(message)
        self.untrusted = untrusted


# A policy or a saved report is kilobytes; a file this large is something else (a log, /dev/zero).
MAX_BYTES = 32 << 20


def read_text(
    path: str | Path, trust: Callable[[os.stat_result], str | None] | None = None, follow: bool = True
) -> str:
    """The file's text: a regular file only (a FIFO would block, /dev/zero never end), at most MAX_BYTES.

    `trust(stat)` judges the file that is actually read (its owner and mode, fstat of the open file,
    so it cannot be swapped between the test and the read): a reason it returns is raised as an
    UserFileError with `untrusted` set. `follow=False`: a symbolic link is refused, not followed."""
    from gpudoctor.safety.safe_io import InputFileError
    from gpudoctor.safety.safe_io import read_text as read_regular

    try:
        if trust is None:
            return read_regular(path, MAX_BYTES, follow)
        return _read_trusted(path, trust)
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
        if exc.errno == errno.ELOOP and not follow:
            raise UserFileError("is a symbolic link (not followed here)") from None
        raise UserFileError(exc.strerror or str(exc)) from None


def _read_trusted(path: str | Path, trust: Callable[[os.stat_result], str | None]) -> str:
    """Open once, judge that open file, read it: nothing can be swapped in between."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the open
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) else "not a file"
            raise UserFileError(f"is {kind}, not a regular file")
        why = trust(st)
        if why is not None:
            raise UserFileError(why, untrusted=True)
        chunks, total = [], 0
        while total <= MAX_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_BYTES:
        raise UserFileError(f"is larger than {MAX_BYTES >> 20} MiB")
    return data.decode("utf-8")


MAX_LINKS = 40  # links followed on one path before giving up (Linux's own limit, ELOOP)


def owner_name(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name}"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _judge_dir(directory: str, st: os.stat_result, trusted: set[int] | None) -> str | None:
    """Why another user controls what `directory` holds (None: nobody but its owner does). A sticky
    directory that others can write (/tmp) lets nobody replace an entry that is not theirs: the
    entry itself is judged next."""
    writable = st.st_mode & (stat.S_IWOTH if trusted is None else stat.S_IWGRP | stat.S_IWOTH)
    if writable and not st.st_mode & stat.S_ISVTX:
        return f"its folder {directory} can be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    if trusted is not None and st.st_uid not in trusted:
        return f"it is reached through {directory}, owned by {owner_name(st.st_uid)}"
    return None


def untrusted_path(path: str | Path, trusted: set[int] | None, folders: bool = True) -> str | None:
    """Why the file at `path` is reached through a folder or link that someone other than the users
    `trusted` controls (None: it is not), judged as git's safe.directory judges a repository: every
    folder from / down, and every link on the way with the folders of its target, must be owned by a
    trusted user and writable by nobody else (a sticky folder excepted). `trusted=None`: only what
    EVERY user controls counts (a folder others can write that is not sticky). `folders=False`: the
    links alone are judged (a file named on purpose in a folder another user owns and writes)."""
    pending = list(Path(os.path.abspath(path)).parts[1:])
    current, links, judged = "/", 0, set()
    try:
        while pending:
            if folders and current not in judged:
                judged.add(current)
                why = _judge_dir(current, os.stat(current), trusted)
                if why is not None:
                    return why
            name = pending.pop(0)
            if name in ("", ".", ".."):
                current = os.path.dirname(current) if name == ".." else current
                continue
            entry = os.path.join(current, name)
            lst = os.lstat(entry)
            if not stat.S_ISLNK(lst.st_mode):
                if not pending:
                    return None  # the file itself: its reader judges it (owner, mode) on the open file
                current = entry
                continue
            if trusted is not None and lst.st_uid not in trusted:
                return f"it is reached through the link {entry}, owned by {owner_name(lst.st_uid)}"
            links += 1
            if links > MAX_LINKS:
                return f"it is reached through more than {MAX_LINKS} links"
            target = os.readlink(entry)
            current = "/" if os.path.isabs(target) else current
            pending = [p for p in Path(target).parts if p != "/"] + pending
    except OSError:
        return None  # (the file is opened next, and that says why it cannot be)
    return None


def _no_constants(name: str) -> Any:
    raise UserFileError(f"not valid JSON: {name} is not a number JSON allows")


def read_json(path: str | Path, follow: bool = True) -> Any:
    """The file's JSON; NaN and Infinity (Python's extension, not JSON) are refused."""
    text = read_text(path, follow=follow)
    try:
        return json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise UserFileError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise UserFileError("not valid JSON: nested too deeply") from None
