"""Every file gpudoctor writes goes through here: safe against a planted symlink on a shared machine.

gpudoctor often runs as root on shared servers, and its outputs (snapshots, reports, JUnit,
recordings, metrics) are written to paths like /tmp/report.json that another user could have
prepared. The rules, for every output:

- A symbolic link at the path is refused, never followed or resolved: a link planted at
  /tmp/report.json -> /etc/shadow must not let gpudoctor overwrite the target (CWE-59).
- A regular file is never opened for writing in place (a hard link planted in a world-writable
  directory would point at someone else's file). The output is written to a temporary file
  created beside it with O_CREAT|O_EXCL|O_NOFOLLOW under an unpredictable name (`mkstemp`), then
  renamed over the path: readers see the old file or the new one, never half of one.
- A FIFO or a character device (`/dev/null`, a pipe made with mkfifo) is written in place, as
  `>` would, opened with O_NOFOLLOW and without O_CREAT.
- Permissions are those of a file the shell would create (0666 less the umask), or the mode of
  the file being replaced when the caller owns it, less setuid/setgid/sticky: a file another user
  planted (`chmod 6777`) must not make root's report world-writable or set-id.
- A FIFO another user owns in a directory every user can write (/tmp, /scratch) is refused: what
  gpudoctor writes would stream to whoever planted it (the kernel's fs.protected_fifos rule, which
  an open without O_CREAT does not get).

`write_text` is for documents written whole; `open_stream` for files written line by line
(`watch --record`): the stream is a new file from its first byte, renamed into place at once,
so it never truncates an existing inode either. `open_append` is for a file another program made
for gpudoctor to add to (the GitHub runner's step summary): a regular file only (a FIFO would
block or stream to whoever reads it), never created, never through a link, never a file with
other hard links, never another user's file in a folder others can write (fs.protected_regular).

`read_text` is for input files (snapshots, recordings): only a regular file is read (a FIFO
would block until someone writes to it, `/dev/zero` never ends), opened without blocking, and
never more than a cap, so a wrong path is one clear message instead of a hang or a full memory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from pathlib import Path
from typing import IO

FIFO_READER_GRACE_S = 2.0  # how long a FIFO output waits for its reader to open it

__all__ = [
    "InputFileError",
    "check_target",
    "open_append",
    "open_input",
    "open_stream",
    "read_bytes",
    "read_stdin_bytes",
    "read_stdin_text",
    "read_text",
    "write_text",
]

MIB = 1 << 20
# Text no UTF-8 file can hold (a lone surrogate read from a JSON escape "\ud800", a file name that is
# not UTF-8) is written as "?", as the terminal shows it (cli/main.py), never an error after the work.
UNENCODABLE = "replace"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_target(path: str | Path) -> os.stat_result | None:
    """lstat of `path` (None: absent), refusing what gpudoctor never writes through: a link, a directory.

    Callers that must refuse a bad target before work starts (`watch --record` before the followed
    command) call this early; the writers below call it again when they write.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "is a symbolic link (gpudoctor does not write through links; name its target)")
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory")
    _refuse_planted_fifo(Path(path), st)
    return st


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _planted(path: Path, st: os.stat_result) -> bool:
    """Another user's file in a directory other users can write, which its owner does not own: the rule
    of the kernel's fs.protected_fifos=2 and fs.protected_regular=2 (Documentation/admin-guide/sysctl/fs.rst),
    applied whatever the sysctls say."""
    if st.st_uid == os.geteuid():
        return False
    try:
        parent = os.stat(path.parent if str(path.parent) else ".")
    except OSError:
        return False
    return bool(parent.st_mode & (stat.S_IWOTH | stat.S_IWGRP)) and st.st_uid != parent.st_uid


def _refuse_planted_fifo(path: Path, st: os.stat_result) -> None:
    if stat.S_ISFIFO(st.st_mode) and _planted(path, st):
        raise PermissionError(
            errno.EPERM,
            f"is a FIFO owned by user {_user(st.st_uid)} in a directory other users can write "
            "(gpudoctor does not stream its output to another user's pipe)",
        )


def _in_place(st: os.stat_result | None) -> bool:
    return st is not None and (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode))


def _open_in_place(path: Path) -> IO[str]:
    # O_NONBLOCK: opening a FIFO that nobody reads would wait forever (a FIFO planted at
    # /tmp/report.xml must not hang a CI job); without a reader it fails with ENXIO. A reader
    # started beside gpudoctor (`cat fifo & gpudoctor ... --junit fifo`) gets a short grace.
    deadline = time.monotonic() + FIFO_READER_GRACE_S
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            if time.monotonic() >= deadline:
                raise OSError(
                    errno.ENXIO, "is a FIFO that nothing reads (gpudoctor does not wait for a reader)"
                ) from None
            time.sleep(0.05)
    os.set_blocking(fd, True)  # the writes themselves wait for a slow reader, as `>` would
    # Between lstat and open the FIFO may have been swapped for a (hard link to a) regular file:
    # what was opened is checked again, so nobody's file is written in place.
    opened = os.fstat(fd)
    if not _in_place(opened):
        os.close(fd)
        raise OSError(errno.EAGAIN, "was replaced while being opened; not written")
    try:
        _refuse_planted_fifo(path, opened)  # a FIFO swapped in between lstat and open
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "w", encoding="utf-8", errors=UNENCODABLE)


TMP_SUFFIX = ".tmp"
TMP_RANDOM = 8  # the characters tempfile.mkstemp puts between prefix and suffix
LEFTOVER_TMP_AGE_S = 60.0  # heuristic: a write in progress takes far less; an older one was killed


def _sweep_beside(path: Path) -> None:
    """Remove temporary files of `path` that a killed gpudoctor left behind (SIGKILL between making
    one and renaming it: every cron run of `check --prometheus` could add one to node_exporter's
    directory). Only exactly our names (`.NAME.` + 8 random characters + `.tmp`), regular files
    of our own user, not links, untouched for a minute."""
    prefix = f".{path.name}."
    now = time.time()
    try:
        entries = [
            e
            for e in os.scandir(path.parent or ".")
            if e.name.startswith(prefix)
            and e.name.endswith(TMP_SUFFIX)
            and len(e.name) == len(prefix) + TMP_RANDOM + len(TMP_SUFFIX)
        ]
    except OSError:
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and now - st.st_mtime >= LEFTOVER_TMP_AGE_S:
                os.unlink(entry.path)
        except OSError:
            continue


def _new_beside(path: Path, st: os.stat_result | None) -> tuple[IO[str], Path]:
    """A new, empty, exclusively created file in `path`'s directory, and its name (leftovers of
    earlier killed writes of the same name swept first)."""
    import tempfile  # lazy: reading a snapshot (the start-up path) never writes

    _sweep_beside(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent or ".")
    keep = st is not None and stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
    mode = stat.S_IMODE(st.st_mode) & 0o777 if keep else 0o666 & ~_umask()
    try:
        os.fchmod(fd, mode)
        if keep and st is not None and st.st_gid != os.getegid():
            os.fchown(fd, -1, st.st_gid)  # the group that could read the old file still can
    except OSError:
        pass  # a filesystem without modes (vfat) keeps mkstemp's 0600, which is safe; a group we are not in
    return os.fdopen(fd, "w", encoding="utf-8", errors=UNENCODABLE), Path(tmp)


def write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` whole: readers see the old file or the new one, never a part."""
    path = Path(path)
    st = check_target(path)
    if _in_place(st):
        with _open_in_place(path) as out:
            out.write(text)
        return
    out, tmp = _new_beside(path, st)
    try:
        with out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_stream(path: str | Path, first: str = "") -> IO[str]:
    """A text stream for a file written bit by bit (a recording): a new file, already in place.

    Whether an existing file may be replaced is the caller's decision (`watch --record` refuses a
    non-empty one without --force); this only makes sure the replacement is a new file and no link
    is followed. `first` (a header) is written and flushed before the new file takes the name: when
    that fails (a full disk) the error is raised and `path` is as it was, never left empty.
    """
    path = Path(path)
    st = check_target(path)
    if _in_place(st):
        out = _open_in_place(path)
        try:
            if first:
                out.write(first)
                out.flush()
        except BaseException:
            with contextlib.suppress(OSError):
                out.close()
            raise
        return out
    out, tmp = _new_beside(path, st)
    try:
        if first:
            out.write(first)
            out.flush()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            out.close()  # flushes what is left, which fails the same way
        tmp.unlink(missing_ok=True)
        raise
    return out


NOT_REGULAR = "not a regular file (gpudoctor appends to regular files only)"


def _refuse_append(path: Path, st: os.stat_result) -> None:
    """Why gpudoctor will not append to this (OSError), judged on what is there or was opened."""
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) else "not a file"
        raise OSError(errno.EINVAL, f"is {kind}, {NOT_REGULAR}")
    if st.st_nlink > 1:
        raise PermissionError(errno.EPERM, "has other hard links (gpudoctor does not append to a file named elsewhere)")
    if _planted(path, st):
        raise PermissionError(errno.EPERM, f"is owned by user {_user(st.st_uid)} in a directory other users can write")


def open_append(path: str | Path) -> IO[str]:
    """The existing regular file at `path`, opened to append to (see the module's rules); OSError
    with a one-line reason otherwise. Never blocks: a FIFO is refused, not waited on."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "is a symbolic link (gpudoctor does not write through links)") from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise OSError(errno.EINVAL, f"is a FIFO, {NOT_REGULAR}") from None
        raise
    try:
        _refuse_append(Path(path), os.fstat(fd))  # what was opened, not what was looked at
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "a", encoding="utf-8", errors=UNENCODABLE)


class InputFileError(OSError):
    """An input file gpudoctor will not read; str() is the one-line reason (no path)."""


def _open_regular(path: str | Path, follow: bool = True) -> int:
    """A read-only descriptor of the regular file at `path` (FIFO, device, directory refused);
    `follow=False`: a symbolic link is refused too (OSError ELOOP), in the same open."""
    # O_NONBLOCK: opening a FIFO for reading would wait for a writer; it is refused below instead.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) else "not a file"
            raise InputFileError(errno.EINVAL, f"is {kind}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd


def open_input(path: str | Path) -> IO[bytes]:
    """The regular file at `path` for reading as a stream (a recording: too large to read whole);
    a FIFO (which would block) or a device (`/dev/zero` never ends) is refused like `read_text`'s."""
    return os.fdopen(_open_regular(path), "rb")


def read_text(path: str | Path, limit: int, follow: bool = True) -> str:
    """The UTF-8 text of the regular file at `path`, refusing anything else and more than `limit` bytes.

    Raises FileNotFoundError, IsADirectoryError, PermissionError (as open does), InputFileError
    for a file that is not regular or too large, UnicodeDecodeError for a file that is not text.
    """
    return read_bytes(path, limit, follow).decode("utf-8")


def read_bytes(path: str | Path, limit: int, follow: bool = True) -> bytes:
    """The bytes of the regular file at `path`, with the refusals of `read_text` (a Python script:
    its encoding is the parser's to read, from its coding line or BOM); `follow=False` refuses a
    symbolic link (a file found in a directory other users write: the link's target is not theirs)."""
    fd = _open_regular(path, follow)
    try:
        return _read_all(fd, limit)
    finally:
        os.close(fd)


def read_stdin_text(limit: int) -> str:
    """Standard input's UTF-8 text to its end (`--snapshot -`), at most `limit` bytes, with the
    errors of `read_text`. A terminal or a closed standard input is refused rather than waited on;
    a non-blocking pipe is waited on like a blocking one; an in-memory `sys.stdin` (the Python API
    under a test harness) is read as it is."""
    return read_stdin_bytes(limit).decode("utf-8")


def read_stdin_bytes(limit: int) -> bytes:
    """Standard input's bytes to its end, at most `limit`, with the refusals of `read_stdin_text`."""
    import sys

    stream = sys.stdin
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):  # None, closed, or a Python object with no descriptor
        fd = -1
    if fd >= 0:
        if os.isatty(fd):
            raise InputFileError(errno.ENOTTY, "standard input is a terminal: pipe the input in")
        return _read_all(fd, limit)
    if stream is None or getattr(stream, "closed", True) or not hasattr(stream, "read"):
        raise InputFileError(errno.EBADF, "standard input is closed")
    data = stream.read(limit + 1)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if len(raw) > limit:
        raise InputFileError(errno.EFBIG, f"is larger than {limit // MIB} MiB")
    return raw


def _read_all(fd: int, limit: int) -> bytes:
    """Everything `fd` gives until its end, refusing more than `limit` bytes (InputFileError)."""
    import select

    chunks = []
    total = 0
    while total <= limit:  # the size stat gives may change while we read (a file being written)
        try:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        except BlockingIOError:  # a pipe its writer made non-blocking: wait for data, not spin
            select.select([fd], [], [])
            continue
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise InputFileError(errno.EFBIG, f"is larger than {limit // MIB} MiB")
    return b"".join(chunks)
