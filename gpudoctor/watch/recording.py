"""Recordings: JSON lines, a header line then one sample per line, flushed per sample.

A kill loses at most the line being written. Reading skips a damaged line (not JSON, NaN or
Infinity, not a sample) and goes on, saying which lines it skipped; a line cut off at the end
(the kill) ends the replay there. A reading outside its physical range is dropped and said.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import math
import os
import re
import stat
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from gpudoctor.errors import EXIT_UNAVAILABLE, EXIT_USAGE, UserError
from gpudoctor.safety.safe_io import MIB, check_target, open_input, open_stream
from gpudoctor.watch.bounds import MAX_GPUS, MAX_RANKS
from gpudoctor.watch.model import Sample, plural

FORMAT = "gpudoctor-watch"
FORMAT_VERSION = 1
_OUR_HEADER = re.compile(r'^\s*\{\s*"format"\s*:\s*' + re.escape(json.dumps(FORMAT)))  # the writer puts it first
MAX_LISTED = 10  # damaged line numbers listed by name; more are counted
MAX_EXAMPLES = 3  # out-of-range readings quoted in the damage note; more are counted


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def loads(text: str) -> Any:
    """json.loads that refuses NaN, Infinity and -Infinity (Python's json accepts them; JSON does not)."""
    return json.loads(text, parse_constant=_refuse_constant)


def _why_damaged(exc: Exception) -> str:
    """A damaged line's reason, in one short phrase (never Python's advice on its own limits)."""
    if isinstance(exc, json.JSONDecodeError):
        return "not JSON"
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return f"a number of more than {sys.get_int_max_str_digits()} digits"  # json's int() refused it
    return str(exc)[:120]


def dumps(doc: Any, **kwargs: Any) -> str:
    """json.dumps that never writes NaN or Infinity: a non-finite float becomes null."""
    return json.dumps(finite(doc), allow_nan=False, **kwargs)


def finite(value: Any) -> Any:
    """`value` with every non-finite float (NaN, +-inf) replaced by None, in dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


@dataclass
class Recording:
    path: str
    header: dict[str, Any]
    samples: list[Sample]
    damage: str | None = None  # why reading stopped early, in the user's words
    meta: dict[str, Any] = field(default_factory=dict)
    end: Sample | None = None  # the job's last words (RecordingStream.end)


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
        line = dumps({"format": FORMAT, "version": FORMAT_VERSION, **header}, separators=(",", ":")) + "\n"
        try:
            # The header is written before the file takes its name: a full disk leaves no empty file.
            self._file: IO[str] = open_stream(path, first=line)  # closed in close()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise UserError(f"cannot write recording {path}: {reason}", EXIT_UNAVAILABLE, "unavailable") from None

    def _write(self, doc: dict[str, Any]) -> bool:
        if self.error is not None:
            return False
        try:
            self._file.write(dumps(doc, separators=(",", ":")) + "\n")
            self._file.flush()
        except OSError as exc:
            self._fail(exc)
            return False
        return True

    def _fail(self, exc: OSError) -> None:
        self._reason = exc.strerror or str(exc)
        self.error = f"recording {self.path} stopped after {plural(self.samples, 'sample')}: {self._reason}"
        try:
            self._file.close()  # flushes what is left over, which fails the same way
        except OSError:
            pass

    def write(self, sample: Sample) -> None:
        """Append one sample; after a failure this does nothing (see `error`)."""
        if self._write(sample.to_json()):
            self.samples += 1

    def write_end(self, end: Sample) -> None:
        """The last line: the steps and data the job sent after the last sample (Sample.end), so a report
        counts what `watch` counted live; not counted as a sample. Nothing said: no line."""
        if end.ranks or end.data:
            self._write(end.to_json())

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


def check_record_target(path: str, force: bool = False) -> None:
    """`--record FILE` never overwrites a file that holds something, unless told to (--force).

    An empty file is replaced by the recording; a FIFO or a device (/dev/null) is written in place;
    a symbolic link or a directory is refused (gpudoctor.safety.safe_io).
    """
    try:
        st = check_target(path)
    except OSError as exc:
        raise UserError(f"cannot record to {path}: {exc.strerror}", EXIT_UNAVAILABLE, "unavailable") from None
    if st is None:
        # Checked here, before a followed job starts, not when the file is first written.
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise UserError(f"cannot record to {path}: no directory {parent}", EXIT_UNAVAILABLE, "unavailable")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(f"cannot record to {path}: {parent} is not writable", EXIT_UNAVAILABLE, "unavailable")
        return
    if stat.S_ISREG(st.st_mode) and st.st_size > 0 and not force:
        raise UserError(f"{path} exists; use --force to overwrite it, or --record another file", EXIT_USAGE, "usage")


GZIP_MAGIC = b"\x1f\x8b"
SAMPLE_PREFIX = "sample:"  # `report sample:straggler`: a recording shipped with gpudoctor


def _open_text(path: str) -> tuple[IO[str], IO[bytes]]:
    """A recording as text, and the file beneath (how far it is read); a gzip-compressed one (the shipped
    samples, `gzip run.jsonl`) is read as is."""
    raw = open_input(path)  # a regular file: /dev/zero or a FIFO would never end
    try:
        compressed = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
    except OSError:
        raw.close()
        raise
    if compressed:
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8", errors="replace"), raw
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace"), raw


def shipped_samples() -> list[str]:
    """The names of the recordings shipped with gpudoctor (package data, gpudoctor/watch/samples)."""
    from importlib import resources

    folder = resources.files("gpudoctor.watch") / "samples"
    names = [e.name for e in folder.iterdir()] if folder.is_dir() else []
    return sorted(n.split(".")[0] for n in names if n.endswith(".jsonl.gz"))


def recording_path(arg: str) -> str:
    """FILE as given, or for `sample:NAME` (when no file has that name) the shipped recording NAME."""
    if os.path.exists(arg) or not arg.startswith(SAMPLE_PREFIX):
        return arg
    from importlib import resources

    name = arg[len(SAMPLE_PREFIX) :]
    if name not in shipped_samples():
        known = ", ".join(f"{SAMPLE_PREFIX}{n}" for n in shipped_samples()) or "none"
        raise UserError(f"no shipped recording {arg!r}; there are: {known}", EXIT_USAGE, "usage")
    return str(resources.files("gpudoctor.watch") / "samples" / f"{name}.jsonl.gz")


# A sample line of 8 GPUs with their processes and ranks is 4 KiB; one of MAX_GPUS GPUs and MAX_RANKS
# ranks with their job processes and data readings about 3 MiB. A longer line is damage (or a
# decompression bomb), skipped without holding it in memory. Within it, json.loads makes up to ~24
# bytes of objects per byte of text ("{}" is a 64-byte dict): more objects and lists than a sample of
# that size holds (about 6 per rank) refuse the line before it is parsed, so a line costs at most
# ~100 MiB of memory (issue 24: 417 MB for a 1.5 MB gzip).
MAX_LINE = 4 * MIB
MAX_CONTAINERS = 1 << 17
MAX_BLANK = 1000  # blank lines in a row: `watch --record` writes none (a heuristic bound)
# Damaged lines before the first sample: a file whose first MAX_DAMAGED_FIRST lines after its header
# hold no sample is no recording (a heuristic bound: `watch --record` writes whole lines, and a damaged
# stretch later in a long recording is read through, keeping the samples after it; cost stays linear
# and memory fixed, as only a count and the first line numbers are kept).
MAX_DAMAGED_FIRST = 1000
TOO_LONG = f"\x00longer than {MAX_LINE // MIB} MiB"  # no JSON line can contain a NUL: never parsed


def _lines(f: IO[str]) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, ended with a newline); a line over MAX_LINE comes as TOO_LONG."""
    number = 0
    while True:
        line = f.readline(MAX_LINE + 1)  # MAX_LINE characters and the newline: at the bound is taken
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE and not line.endswith("\n"):
            while line and not line.endswith("\n"):  # the rest of it, a piece at a time
                line = f.readline(MAX_LINE)
            yield number, TOO_LONG, True
            continue
        yield number, line.rstrip("\n"), line.endswith("\n")


def _beyond_bounds(doc: Any) -> str | None:
    """Why a sample line is more than one machine's (too many GPUs or ranks), or None: counted from the
    parsed lists alone, before any reading is made."""
    if not isinstance(doc, dict):
        return None
    for name, label, most in (("gpus", "GPUs", MAX_GPUS), ("ranks", "ranks", MAX_RANKS)):
        found = doc.get(name)
        if isinstance(found, list) and len(found) > most:
            return f"{len(found)} {label}, at most {most}"
    return None


class RecordingStream:
    """A recording read as it is iterated, one sample in memory at a time.

    Opening reads and checks the header (a bad file raises UserError, exit 2). Iterating
    yields the samples, skipping damaged lines; `damage` then says which (in the user's words).
    Use it as a context manager, or iterate it to the end, to close the file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.samples = 0  # yielded so far
        self._skipped: list[int] = []  # damaged lines skipped: the first MAX_LISTED numbers
        self._skipped_n = 0  # and how many in all
        self._first_skip = ""  # what was wrong with the first of them
        self._dropped = 0  # readings outside the physical range, dropped
        self._dropped_examples: list[str] = []
        # Lines holding bytes that are not UTF-8, read as U+FFFD (the line is kept: a damaged byte in a GPU's
        # name should not cost its readings); our writer escapes every non-ASCII character, so a raw U+FFFD
        # in the text is one of those bytes, or a writer that is not ours. Counted, the first named.
        self._replaced = 0
        self._first_replaced = 0
        self._stopped: str | None = None  # why reading ended before the end of the file
        # Why the file's bytes could not be read on (a corrupt compressed stream, an I/O error):
        # the samples before are kept, but the file is damaged input (report exits 2). A file cut
        # off (a kill mid-write, EOFError for a compressed one) is not: it ends where it ends.
        self.unreadable: str | None = None
        # Lines beyond the bounds of one machine (gpudoctor.watch.bounds): refused before their readings
        # are made, counted, said; input no machine wrote, so bad input too (report exits 2).
        self.refused = 0
        self._first_refusal = ""
        # The GPUs the recording has shown so far: a recording is one machine's, so more than MAX_GPUS
        # distinct indices in all refuse the lines that bring them (the summary keeps one row per GPU).
        self._gpus: set[int] = set()
        # The job's last words (Sample.end): not a sample, kept aside for the summary (the last, if several).
        self.end: Sample | None = None
        try:
            self._file, self._raw = _open_text(path)  # closed in close()
            self._size = os.fstat(self._raw.fileno()).st_size
            self._lines = _lines(self._file)
            first = next(self._lines, None)
        except (OSError, EOFError, zlib.error) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise UserError(f"cannot read recording {path}: {reason}", EXIT_USAGE, "input") from None
        try:
            self.header = self._check_header(first)
        except UserError:
            self.close()
            raise

    def _check_header(self, first: tuple[int, str, bool] | None) -> dict[str, Any]:
        path = self.path
        if first is None:
            raise UserError(f"recording {path} is empty", EXIT_USAGE, "input")
        text = first[1].removeprefix("\ufeff")  # a byte order mark an editor put there says nothing
        try:
            header = loads(text)
        except (ValueError, RecursionError) as exc:  # not JSON, or a value json will not read (NaN, 5,000 digits)
            if not _OUR_HEADER.search(text):
                header = None
            else:  # our header, damaged (cut off, a value json will not read): say what is wrong, not that none is
                why = "nested too deeply" if isinstance(exc, RecursionError) else _why_damaged(exc)
                message = f"the header line of recording {path} is damaged ({why})"
                raise UserError(message, EXIT_USAGE, "input") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise UserError(f"{path} is not a gpudoctor watch recording (no header line)", EXIT_USAGE, "input")
        version = header.get("version")
        if type(version) is not int or version != FORMAT_VERSION:  # true == 1 in Python, not in a format
            written = json.dumps(version)  # as the file has it (true, not True)
            shown = written if len(written) <= 24 else written[:20] + "..."
            raise UserError(
                f"recording {path} has format version {shown}; this gpudoctor reads version {FORMAT_VERSION}",
                EXIT_USAGE,
                "input",
            )
        return header

    def __iter__(self) -> Iterator[Sample]:
        blank, path = 0, self.path
        try:
            while True:
                try:
                    item = next(self._lines, None)
                except (OSError, EOFError, zlib.error) as exc:  # EOFError: a compressed recording cut off
                    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
                    kept = plural(self.samples, "sample")
                    self._stopped = f"reading {self.path} failed ({reason}); kept the {kept} before it"
                    if not isinstance(exc, EOFError):
                        self.unreadable = reason
                    return
                if item is None:
                    return
                number, text, complete = item
                if not text.strip() and complete:
                    blank += 1
                    if blank > MAX_BLANK:  # a recording has none: a stream of newlines is not one (minutes to read)
                        self._stopped = f"{path} has more than {MAX_BLANK} blank lines from line {number - blank + 1}"
                        self._stopped += f" (a recording has none); kept the {plural(self.samples, 'sample')} before"
                        self.unreadable = "blank lines"
                        return
                    continue
                blank = 0
                if "\ufffd" in text:  # free for an ASCII line: its widest character is narrower
                    self._replaced += 1
                    self._first_replaced = self._first_replaced or number
                dropped: list[str] = []
                if text == TOO_LONG:
                    if self._skip(number, TOO_LONG[1:]):
                        return
                    continue
                try:
                    containers = text.count("{") + text.count("[")  # a string's brackets count too: only more
                    if containers > MAX_CONTAINERS:
                        doc, beyond = None, f"{containers} objects and lists, at most {MAX_CONTAINERS}"
                    else:
                        doc = loads(text)
                        beyond = _beyond_bounds(doc)
                    if beyond is None:
                        sample = Sample.parse(doc, dropped)
                        beyond = self._new_gpus(sample)
                    if beyond is not None:
                        if not self.refused:
                            self._first_refusal = f"line {number}: {beyond}"
                        self.refused += 1
                        continue
                except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
                    if not complete:  # the last line, cut off mid-write (a kill): the replay ends here
                        self._stopped = (
                            f"line {number} of {self.path} is damaged (cut off mid-line); "
                            f"kept the {plural(self.samples, 'sample')} before it"
                        )
                        return
                    if self._skip(number, _why_damaged(exc)):
                        return
                    continue
                if dropped:
                    self._dropped += len(dropped)
                    room = MAX_EXAMPLES - len(self._dropped_examples)
                    self._dropped_examples.extend(f"line {number}: {d}" for d in dropped[:room])
                if sample.end:
                    self.end = sample
                    continue
                self.samples += 1
                yield sample
        finally:
            self.close()

    def _skip(self, number: int, why: str) -> bool:
        """Count damaged line `number`; True: stop reading (no sample before MAX_DAMAGED_FIRST of them)."""
        if not self._skipped_n:
            self._first_skip = why
        self._skipped_n += 1
        if len(self._skipped) < MAX_LISTED:
            self._skipped.append(number)
        if self.samples or self._skipped_n < MAX_DAMAGED_FIRST:
            return False
        self._stopped = f"stopped reading {self.path} at line {number}: {MAX_DAMAGED_FIRST} damaged lines and no sample"
        self.unreadable = "no sample"
        return True

    def _new_gpus(self, sample: Sample) -> str | None:
        """Why `sample` is refused as beyond one machine over the whole recording (its GPUs would make
        more than MAX_GPUS distinct GPUs in all), or None; its GPUs are then the recording's."""
        seen = self._gpus
        new = [g.index for g in sample.gpus if g.index not in seen]
        if not new:
            return None
        fresh = set(new)
        if len(seen) + len(fresh) > MAX_GPUS:
            return f"GPU {min(fresh)} would be GPU {len(seen) + len(fresh)} of the recording, at most {MAX_GPUS}"
        seen |= fresh
        return None

    @property
    def usable(self) -> bool:
        """The file held a sample, or nothing wrong: a recording of damaged or refused lines alone is
        bad input (complete once iteration has ended)."""
        return bool(self.samples) or not (self._skipped_n or self.refused or self.unreadable)

    @property
    def damage(self) -> str | None:
        """What was wrong with the file, in the user's words; None for a sound recording.

        Complete only once iteration has ended."""
        parts = []
        if self._skipped_n:
            shown = ", ".join(map(str, self._skipped))
            more = f" and {self._skipped_n - len(self._skipped)} more" if self._skipped_n > len(self._skipped) else ""
            if self._skipped_n == 1:
                parts.append(f"line {shown} of {self.path} is damaged ({self._first_skip}); skipped it")
            else:
                parts.append(
                    f"lines {shown}{more} of {self.path} are damaged (first: {self._first_skip}); skipped them"
                )
        if self._dropped:
            parts.append(
                f"ignored {plural(self._dropped, 'reading')} outside the physical range "
                f"({'; '.join(self._dropped_examples)}{'; ...' if self._dropped > len(self._dropped_examples) else ''})"
            )
        if self._replaced:
            which = f"line {self._first_replaced}" + (f" and {self._replaced - 1} more" if self._replaced > 1 else "")
            parts.append(f"{which} held bytes that are not UTF-8, read as U+FFFD")
        if self.refused:
            lines = "line" if self.refused == 1 else "lines"
            parts.append(
                f"refused {self.refused} {lines} beyond one machine's bounds "
                f"({self._first_refusal}{'; ...' if self.refused > 1 else ''})"
            )
        if self._stopped:
            parts.append(self._stopped)
        return "; ".join(parts) or None

    @property
    def bad_input(self) -> bool:
        """The file is damaged input (`report` and `watch --replay` exit 2 after using what they could):
        its bytes stopped reading, lines were refused as beyond the bounds of one machine, or no line
        held a sample though some were there."""
        return self.unreadable is not None or bool(self.refused) or not self.usable

    def read_share(self) -> float:
        """How much of the file is read, 0 to 1 (of its bytes as stored: a compressed one's too)."""
        try:
            return min(1.0, self._raw.tell() / self._size) if self._size else 1.0
        except (OSError, ValueError):  # closed
            return 1.0

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
    return Recording(path, stream.header, samples, stream.damage, end=stream.end)
