"""The files a `check` writes beside its report: JUnit, Prometheus, the GitHub summary.

Each is checked before the run (a planted link or a missing directory is refused before minutes
of active checks), written after it; one that fails then is one line on stderr and exit 3, and the
report itself is still printed, so nothing the run found is lost.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpudoctor.errors import EXIT_UNAVAILABLE, EXIT_USAGE, UserError
from gpudoctor.findings import Report
from gpudoctor.safety.safe_io import check_target


@dataclass
class Outputs:
    junit: str | None = None
    prometheus: str | None = None
    github: bool | None = None  # --github / --no-github; None: GITHUB_ACTIONS decides
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    # What the run reads, never overwritten by an output: "the --baseline file" -> path.
    inputs: Mapping[str, str | None] = field(default_factory=dict)

    def files(self) -> list[tuple[str, str, Callable[[Report, str], None]]]:
        out = []
        if self.junit:
            from gpudoctor.render.junit import write_junit

            out.append(("JUnit file", self.junit, write_junit))
        if self.prometheus:
            from gpudoctor.render.prometheus import write_prometheus

            out.append(("Prometheus file", self.prometheus, write_prometheus))
        return out

    def precheck(self) -> None:
        """Refuse, before any work, a target gpudoctor would not write (a link, a directory, no directory)."""
        self._distinct()
        for what, path, _ in self.files():
            try:
                st = check_target(path)
                parent = Path(path).parent
                if not parent.is_dir():
                    raise FileNotFoundError(2, f"no directory {str(parent)!r}")
                if st is not None and stat.S_ISREG(st.st_mode) and st.st_size:
                    _refuse_foreign(what, path)
                if st is None or stat.S_ISREG(st.st_mode):
                    _can_create_in(parent)  # a file is replaced through a new one beside it
            except OSError as exc:
                raise UserError(
                    f"cannot write {what} {path}: {exc.strerror}", EXIT_UNAVAILABLE, "unavailable"
                ) from None

    def _distinct(self) -> None:
        """Each output its own file, and never one of the run's inputs: one would silently replace the other."""
        named = [(OPTION[what], path) for what, path, _ in self.files()]
        for option, path in named:
            if path == "-":
                raise UserError(
                    f"{option} -: gpudoctor writes this to a file, not to standard output (which carries the "
                    "report); name a file",
                    EXIT_USAGE,
                    "usage",
                )
        inputs = {_identity(path): option for option, path in self.inputs.items() if path}
        seen: dict[tuple[object, ...], str] = {}
        for option, path in named:
            key = _identity(path)
            if key in inputs:
                raise UserError(
                    f"{option} {path} is {inputs[key]}: writing it would replace that input; name another file",
                    EXIT_USAGE,
                    "usage",
                )
            if key in seen:
                raise UserError(
                    f"{seen[key]} and {option} name the same file ({path}): each output needs a file of its own",
                    EXIT_USAGE,
                    "usage",
                )
            seen[key] = option

    def write(self, report: Report, err: IO[str]) -> list[str]:
        """Write every output; the one-line problems of those that failed."""
        problems = []
        for what, path, writer in self.files():
            try:
                writer(report, path)
            except OSError as exc:
                problems.append(f"cannot write {what} {path}: {write_failure(exc, Path(path).parent)}")
        from gpudoctor.render import github

        if github.enabled(self.github, self.environ):
            problem = github.publish(report, self.environ, err)
            if problem:
                problems.append(problem)
        return problems


# How each output begins (render/junit.py, render/prometheus.py): an existing file that does not is
# something else (a snapshot kept as evidence, a typo's victim), replaced only once the user removes it.
OWN_START = {"JUnit file": (b"<?xml", b"<testsuites"), "Prometheus file": (b"# HELP gpudoctor_",)}
OPTION = {"JUnit file": "--junit", "Prometheus file": "--prometheus"}


def _refuse_foreign(what: str, path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return  # (unreadable: the write says why, if it fails)
    try:
        head = os.read(fd, 64).lstrip()
    finally:
        os.close(fd)
    if not head.startswith(OWN_START[what]):
        raise UserError(
            f"{OPTION[what]} {path}: the file exists and is not a {what} gpudoctor wrote; name another file "
            "or remove it first",
            EXIT_USAGE,
            "usage",
        )


def _identity(path: str) -> tuple[object, ...]:
    """The same file, however it is named: its inode when it exists (hard links too), else its resolved path."""
    try:
        st = os.stat(path)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.realpath(path))


def write_failure(exc: OSError, directory: Path) -> str:
    """An OSError in words; "No such file or directory" for a directory that exists says what it means."""
    if exc.errno == errno.ENOENT and directory.is_dir():
        return f"the directory {directory} does not take new files (a virtual filesystem such as /proc or /sys?)"
    return exc.strerror or str(exc)


def _can_create_in(directory: Path) -> None:
    """Create and remove a file there, as writing will: /proc, a read-only mount or a full disk fail now."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".gpudoctor-", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise OSError(exc.errno, write_failure(exc, directory)) from None
    os.close(fd)
    os.unlink(name)
