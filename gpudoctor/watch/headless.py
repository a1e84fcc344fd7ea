"""`watch --no-tui` (or no terminal): one line per interval, or JSON lines with --json."""

from __future__ import annotations

import json
import queue
import sys
import time
from typing import IO

from gpudoctor.watch.analysis import RankStats, Verdict
from gpudoctor.watch.model import LOST, Sample
from gpudoctor.watch.recording import dumps
from gpudoctor.watch.session import End, Session, Update, say
from gpudoctor.watch.sources import Notice


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def text_line(update: Update) -> str:
    s = update.sample
    clock = time.strftime("%H:%M:%S", time.localtime(s.t))

    def col(fn):  # type: ignore[no-untyped-def]
        return " ".join("LOST" if g.state == LOST else fn(g) for g in s.gpus)

    parts = [clock]
    if s.gpus:
        parts += [
            f"util% [{col(lambda g: _num(g.util))}]",
            f"mem GiB [{col(lambda g: _num(None if g.mem_used is None else g.mem_used / 1024, '{:.1f}'))}]",
            f"W [{col(lambda g: _num(g.power))}]",
        ]
    if s.ranks:
        stats = update.builder.balance.ranks
        parts.append(f"step ms [{' '.join(_rank_ms(stats.get((r.rank, r.pid))) for r in s.ranks)}]")
    parts.append(f"cpu {_num(s.cpu)}%")
    if update.verdicts:
        parts.append("| " + "; ".join(f"{v.code} {v.name} {_who(v)}" for v in update.verdicts))
    return "  ".join(parts)


def _rank_ms(stats: RankStats | None) -> str:
    return "-" if stats is None or stats.step_s is None else f"{1000 * stats.step_s:.0f}"


def _who(v: Verdict) -> str:
    """The verdict's subject in the terse form of this line: "gpu 3", "rank 1"."""
    if v.ranks:
        return v.subject
    return f"gpu {','.join(map(str, v.gpus))}"


def json_line(update: Update) -> str:
    doc = {
        "kind": "sample",
        **update.sample.to_json(),
        "verdicts": [
            {
                "code": v.code,
                "name": v.name,
                "gpus": list(v.gpus),
                "ranks": [{"rank": r.rank, "pid": r.pid} for r in v.ranks],
                "message": v.message,
            }
            for v in update.verdicts
        ],
    }
    return dumps(doc, separators=(",", ":"))


def run_headless(session: Session, out: IO[str], *, as_json: bool = False, duration: float | None = None) -> str:
    """Consume samples until the source or the job ends, or `duration` passes; returns why it ended.

    Notices (a skipped gap in a replay...) go to stderr (session.err), so --json output stays samples only."""
    deadline = None if duration is None else time.monotonic() + duration
    stale_reported = False
    while True:
        wait = session.stale_after
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
            if wait <= 0:
                return "duration"
        try:
            item = session.queue.get(timeout=wait)
        except queue.Empty:
            quiet = time.monotonic() - session.last_arrival
            if quiet >= session.stale_after and not stale_reported:
                stale_reported = True
                if as_json:
                    doc = {"kind": "stale", "t": round(time.time(), 3), "seconds": round(quiet, 1)}
                    out.write(json.dumps(doc) + "\n")
                else:
                    out.write(f"{time.strftime('%H:%M:%S')}  stale: no reading for {quiet:.0f} s (NVML stalled?)\n")
                out.flush()
            continue
        if isinstance(item, End):
            return item.reason
        if isinstance(item, Notice):
            say(session.err or sys.stderr, f"gpudoctor: {item.text}")
            continue
        assert isinstance(item, Sample)
        stale_reported = False
        update = session.handle(item)
        out.write((json_line(update) if as_json else text_line(update)) + "\n")
        out.flush()
