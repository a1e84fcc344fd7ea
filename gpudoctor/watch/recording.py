"""Recordings: JSON lines, a header line then one sample per line, flushed per sample.

A kill loses at most the line being written; reading stops at the first damaged line
and says where, so a truncated recording replays up to the damage.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from gpudoctor.errors import EXIT_UNAVAILABLE, EXIT_USAGE, UserError
from gpudoctor.watch.model import Sample

FORMAT = "gpudoctor-watch"
FORMAT_VERSION = 1


@dataclass
class Recording:
    path: str
    header: dict[str, Any]
    samples: list[Sample]
    damage: str | None = None  # why reading stopped early, in the user's words
    meta: dict[str, Any] = field(default_factory=dict)


class RecordWriter:
    """Appends samples to a JSON-lines file; each line is flushed as soon as it is written.

    A file that cannot be opened, or whose header line cannot be written, is a UserError
    (exit 3). A write that fails later (disk full, quota, file size limit) does not end the
    watch: recording stops, `error` says why in the user's words, and the file keeps every
    line written before (the damaged last line reads back as damage).
    """

    def __init__(self, path: str, header: dict[str, Any]) -> None:
        self.path = path
        self.samples = 0  # written in full
        self.error: str | None = None  # why recording stopped early
        try:
            self._file: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
        except OSError as exc:
            raise UserError(f"cannot write recording {path}: {exc.strerror}", EXIT_UNAVAILABLE, "unavailable") from None
        if not self._write({"format": FORMAT, "version": FORMAT_VERSION, **header}):
            raise UserError(f"cannot write recording {path}: {self._reason}", EXIT_UNAVAILABLE, "unavailable")

    def _write(self, doc: dict[str, Any]) -> bool:
        if self.error is not None:
            return False
        try:
            self._file.write(json.dumps(doc, separators=(",", ":")) + "\n")
            self._file.flush()
        except OSError as exc:
            self._fail(exc)
            return False
        return True

    def _fail(self, exc: OSError) -> None:
        self._reason = exc.strerror or str(exc)
        self.error = f"recording {self.path} stopped after {self.samples} samples: {self._reason}"
        try:
            self._file.close()  # flushes what is left over, which fails the same way
        except OSError:
            pass

    def write(self, sample: Sample) -> None:
        """Append one sample; after a failure this does nothing (see `error`)."""
        if self._write(sample.to_json()):
            self.samples += 1

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self._file.flush()
            try:
                os.fsync(self._file.fileno())
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EROFS):  # e.g. a pipe: nothing more to secure
                    raise
        except OSError as exc:
            self._fail(exc)
        finally:
            try:
                self._file.close()
            except OSError:
                pass


def _lines(f: IO[str]) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, ended with a newline)."""
    for number, line in enumerate(f, start=1):
        yield number, line.rstrip("\n"), line.endswith("\n")


class RecordingStream:
    """A recording read as it is iterated, one sample in memory at a time.

    Opening reads and checks the header (a bad file raises UserError, exit 2). Iterating
    yields the samples; reading stops at the first damaged line, and `damage` then says where
    (in the user's words). Use it as a context manager, or iterate it to the end, to close the file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.damage: str | None = None  # why reading stopped early; known once iteration ended
        self.samples = 0  # yielded so far
        try:
            self._file: IO[str] = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 (closed in close())
            self._lines = _lines(self._file)
            first = next(self._lines, None)
        except OSError as exc:
            raise UserError(f"cannot read recording {path}: {exc.strerror}", EXIT_USAGE, "input") from None
        try:
            self.header = self._check_header(first)
        except UserError:
            self.close()
            raise

    def _check_header(self, first: tuple[int, str, bool] | None) -> dict[str, Any]:
        path = self.path
        if first is None:
            raise UserError(f"recording {path} is empty", EXIT_USAGE, "input")
        try:
            header = json.loads(first[1])
        except json.JSONDecodeError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise UserError(f"{path} is not a gpudoctor watch recording (no header line)", EXIT_USAGE, "input")
        if header.get("version") != FORMAT_VERSION:
            raise UserError(
                f"recording {path} has format version {header.get('version')!r}; "
                f"this gpudoctor reads version {FORMAT_VERSION}",
                EXIT_USAGE,
                "input",
            )
        return header

    def __iter__(self) -> Iterator[Sample]:
        try:
            while True:
                try:
                    item = next(self._lines, None)
                except OSError as exc:
                    self.damage = (
                        f"reading {self.path} failed ({exc.strerror or exc}); kept the {self.samples} samples before it"
                    )
                    return
                if item is None:
                    return
                number, text, complete = item
                if not text.strip() and complete:
                    continue
                try:
                    sample = Sample.from_json(json.loads(text))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                    cut = "cut off mid-line" if not complete else "not a valid sample"
                    self.damage = (
                        f"line {number} of {self.path} is damaged ({cut}); kept the {self.samples} samples before it"
                    )
                    return
                self.samples += 1
                yield sample
        finally:
            self.close()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_recording(path: str) -> Recording:
    """A whole recording in memory (--replay); bad files raise UserError (exit 2), damage is reported."""
    stream = RecordingStream(path)
    samples = list(stream)
    return Recording(path, stream.header, samples, stream.damage)
