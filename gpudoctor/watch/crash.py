"""How a followed job ended: the first rank that failed, and why (GD927).

Sources, best first:
1. torchrun's failure summary (torch/distributed/elastic/multiprocessing/errors/__init__.py,
   `_FAILURE_FORMAT_TEMPLATE`): after `Root Cause (first observed failure):` the failure with the
   smallest timestamp, with its global `rank`, `exitcode` (negative: the signal), `pid`, `error_file` and
   `traceback` (the rank's own traceback where the script's entry point uses `@record`; else a pointer to
   the docs). The ranks under `Failures:` killed with SIGTERM are torchrun's doing: victims.
2. The error file torchrun writes to TORCHELASTIC_ERROR_FILE (watch sets it in the command's
   environment, in its private directory, unless the user did): the root cause's message and traceback,
   where the script uses `@record`.
3. mp.spawn's `-- Process N terminated with the following error:` (torch/multiprocessing/spawn.py):
   N is the spawn index (the local rank), not a global rank.
4. Without those: the first rank that said at exit it was leaving on an uncaught exception (the step API).
5. No rank at all: the command's own output, if it holds a known error (torchrun's agent failing to bind
   its --master-port: EADDRINUSE).

The root cause's error is classified from its own text (the error file, the summary's traceback, the
lines torch prefixed with `[rankN]:`, else the command's other output) with the one classifier
gpudoctor's ranks use (gpudoctor/knowledge/known_errors.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpudoctor.knowledge.known_errors import BY_KIND, KnownError, identify
from gpudoctor.safety.redact import text as redact
from gpudoctor.safety.safe_text import printable
from gpudoctor.watch import job_codes as codes
from gpudoctor.watch.analysis import RankRef, Verdict
from gpudoctor.watch.arrival import JobProc

ROOT = "Root Cause (first observed failure):"
SHOWN = 160  # characters of the matched line in the verdict's message (all of it in --json's failure)
FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
SPAWN = re.compile(r"-- Process (\d+) terminated with the following error:")
SPAWN_EXIT = re.compile(r"process (\d+) terminated with (exit code (-?\d+)|signal (\w+))")
EXCEPTION = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b)(?::\s*(.*))?$")


@dataclass(frozen=True)
class Failure:
    """The first rank that failed."""

    source: str  # where we learnt it: "torchrun", "mp.spawn", "step API", "command"
    rank: int | None = None  # global rank (mp.spawn: the spawn index)
    local_rank: int | None = None
    pid: int | None = None
    exit_code: int | None = None  # negative: killed by that signal
    signal: str = ""
    error: str = ""  # its exception line ("RuntimeError: boom"), if it was found
    known: KnownError | None = None
    victims: tuple[int, ...] = field(default=())  # ranks torchrun stopped after it
    note: str = ""  # what explains it when it is itself a victim (another rank left first)

    @property
    def who(self) -> str:
        if self.source == "command":
            return "the command"
        if self.rank is None:
            return f"PID {self.pid}" if self.pid else "a rank"
        return f"process {self.rank} of mp.spawn" if self.source == "mp.spawn" else f"rank {self.rank}"

    @property
    def how(self) -> str:
        if self.exit_code is not None and self.exit_code < 0:
            return f"killed by {self.signal or f'signal {-self.exit_code}'}"
        return f"exit code {self.exit_code}" if self.exit_code is not None else "failed"

    @property
    def line(self) -> str:
        """The one line the summary and the exit say."""
        what = self.known.summary if self.known else (self.error or "no known error in its output")
        first = "" if self.source == "command" else " first"
        return f"{self.who} failed{first} ({self.how}): {what}" + (f"; {self.note}" if self.note else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "source": self.source,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "signal": self.signal or None,
            "error": self.error or None,
            "kind": self.known.kind if self.known else None,
            "title": self.known.title if self.known else None,
            "detail": (self.known.detail or None) if self.known else None,
            "matched": self.known.line if self.known else None,
            "fix": self.known.fix if self.known else None,
            "victims": list(self.victims),
        }


def _blocks(text: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """torchrun's summary: the root cause's fields and those of the other failures ({} if none)."""
    at = text.rfind(ROOT)
    if at < 0:
        return {}, []
    failures_at = text.rfind("Failures:", 0, at)
    others = _entries(text[failures_at:at]) if failures_at >= 0 else []
    roots = _entries(text[at + len(ROOT) :])
    return (roots[0] if roots else {}), others


def _entries(section: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    last = ""
    for line in section.splitlines():
        if re.match(r"^\[\d+\]:\s*$", line.strip()):
            current = {}
            out.append(current)
            continue
        if current is None:
            continue
        if line.startswith("====") or line.startswith("----"):
            current = None
            continue
        m = FIELD.match(line)
        if m is not None:
            last = m.group(1)
            current[last] = m.group(2).strip()
        elif last == "traceback" and line.startswith("  "):
            current["traceback"] = current.get("traceback", "") + "\n" + line[2:]
    return out


def _number(text: str, pattern: str) -> int | None:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else None


def classified(text: str) -> tuple[KnownError | None, str]:
    """The known error in `text` and its exception line; the exception line is shown as the matched line
    when it says the same (the last line of a traceback says more than a warning logged before it). What a
    rank printed goes into summaries and recordings: redacted (it can echo its environment) and one
    printable line, like every other text gpudoctor shows of a process."""
    error = exception_line(text)
    known = identify(text)
    if known is not None and error and BY_KIND[known.kind].pattern.search(error):
        known = replace(known, line=error)
    if known is not None:
        known = replace(known, line=_clean(known.line), detail=_clean(known.detail))
    return known, _clean(error)


def _clean(text: str) -> str:
    return printable(redact(text)) if text else text


def exception_line(text: str) -> str:
    """The last line that names an exception ("RuntimeError: boom"), trimmed."""
    found = ""
    for line in text.splitlines():
        m = EXCEPTION.match(line)
        if m is not None and "Traceback" not in line:
            found = line.strip()
    return found[:300]


def from_torchrun(text: str, error_file: str | None, rank_text: Callable[[int], str]) -> Failure | None:
    root, others = _blocks(text)
    if not root:
        return None
    rank = _number(root.get("rank", ""), r"^(\d+)")
    local = _number(root.get("rank", ""), r"local_rank:\s*(\d+)")
    exitcode = root.get("exitcode", "")
    m = re.match(r"^(-?\d+)", exitcode)
    code = int(m.group(1)) if m else None
    sig = re.search(r"\((SIG\w+)\)", exitcode)
    pid = _number(exitcode, r"pid:\s*(\d+)")
    own = "\n".join(
        t
        for t in (
            _error_file_text(error_file),
            root.get("traceback", "") if "To enable traceback" not in root.get("traceback", "") else "",
            rank_text(rank) if rank is not None else "",
        )
        if t
    )
    before = text[: text.rfind("ChildFailedError")] if "ChildFailedError" in text else text[: text.rfind(ROOT)]
    own = own or before  # no traceback, no prefixed lines: what the command printed before torchrun's summary
    known, error = classified(own)
    if known is None and code == -9:
        known = identify("Signal 9 (SIGKILL)")
    if known is None and code == -6:  # a C++ abort writes to the process's stderr, past torch's [rankN] prefix
        known, _ = classified(_not_other_ranks(before, rank))
    victims = tuple(
        r
        for o in others
        if (r := _number(o.get("rank", ""), r"^(\d+)")) is not None and "SIGTERM" in o.get("exitcode", "")
    )
    return Failure("torchrun", rank, local, pid, code, sig.group(1) if sig else "", error, known, victims)


def _not_other_ranks(text: str, rank: int | None) -> str:
    """`text` without the lines torch prefixed with another rank's `[rankN]:`: what this rank may have
    printed (its own lines, and the unprefixed ones C++ writes, which no rank can be told from)."""
    own = f"[rank{rank}]:"
    return "\n".join(line for line in text.splitlines() if not line.startswith("[rank") or line.startswith(own))


def _error_file_text(raw: str | None) -> str:
    """The message and traceback of torchrun's error file (JSON written by ErrorHandler), or ""."""
    if not raw:
        return ""
    try:
        doc = json.loads(raw)
        message = doc["message"]
        if isinstance(message, str):
            return message
        text = str(message.get("message", ""))
        stack = message.get("extraInfo", {}).get("py_callstack", "")
        return f"{stack}\n{text}" if isinstance(stack, str) else text
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007  (the last one is wanted)
        continue
    return found


def from_spawn(text: str) -> Failure | None:
    m = _last(SPAWN, text)
    if m is not None:
        known, error = classified(text[m.end() :])
        return Failure("mp.spawn", int(m.group(1)), int(m.group(1)), error=error, known=known)
    e = _last(SPAWN_EXIT, text)
    if e is None:
        return None
    code = int(e.group(3)) if e.group(3) else None
    sig = e.group(4) or ""
    known = identify(e.group(0)) if sig == "SIGKILL" else None
    return Failure(
        "mp.spawn",
        int(e.group(1)),
        int(e.group(1)),
        exit_code=code if code is not None else -1,
        signal=sig,
        known=known,
    )


def from_ranks(procs: Sequence[JobProc], text: str, rank_text: Callable[[int], str]) -> Failure | None:
    """The first rank that said it exited on an uncaught exception (no launcher summary)."""
    failed = [p for p in procs if p.exit == "exception"]
    if not failed:
        return None
    first = min(failed, key=lambda p: p.ended or 0.0)
    own = rank_text(first.rank) if first.rank is not None else ""
    known, error = classified(own or text)
    return Failure("step API", first.rank, first.local_rank, first.pid, error=error, known=known)


def from_command(text: str, exit_code: int | None) -> Failure | None:
    """No rank failed that we know of: the command itself did (torchrun's agent could not bind its port,
    a launcher's own error); only a known error is worth saying."""
    known, error = classified(text)
    if known is None:
        return None
    return Failure("command", exit_code=exit_code, error=error, known=known)


def diagnose(
    text: str,
    error_file: str | None,
    procs: Sequence[JobProc],
    rank_text: Callable[[int], str],
    exit_code: int | None = None,
) -> Failure | None:
    """The first rank that failed, from the sources of the module docstring in order; else the command's
    own known error."""
    return (
        from_torchrun(text, error_file, rank_text)
        or from_spawn(text)
        or from_ranks(procs, text, rank_text)
        or from_command(text, exit_code)
    )


def explained(failure: Failure, procs: Sequence[JobProc]) -> Failure:
    """A victim's failure (its peer went away, it timed out) with what explains it: a rank that had already
    ended its loop normally (uneven steps), or that ended first."""
    if failure.known is None or not failure.known.victim:
        return failure
    left = [p for p in procs if p.exit == "normal" and p.rank != failure.rank and p.rank is not None]
    if left:
        first = min(left, key=lambda p: p.reached)
        note = f"{first.label} had ended its loop after step {first.reached} (uneven steps, GD926)"
        return replace(failure, note=note)
    return failure


def verdict(failure: Failure, procs: Sequence[JobProc]) -> Verdict:
    pid = failure.pid or next((p.pid for p in procs if p.rank == failure.rank and p.rank is not None), 0)
    message = failure.line
    if failure.known is not None and failure.known.line:
        shown = failure.known.line
        message += f" [{shown if len(shown) <= SHOWN else shown[: SHOWN - 3] + '...'}]"
    if failure.victims:
        message += f" (torchrun then stopped rank{'s' if len(failure.victims) > 1 else ''} "
        message += f"{','.join(map(str, failure.victims))})"
    if failure.known is not None:
        hint = failure.known.fix
    else:
        hint = "Read that rank's own traceback above torchrun's summary; rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL."
    ranks = (RankRef(failure.rank, pid),) if pid else ()
    return Verdict(codes.RANK_FAILED.code, codes.RANK_FAILED.name, (), message, hint, "fail", ranks=ranks)
