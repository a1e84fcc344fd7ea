"""Which process a key of the dashboard may signal (`t`, `i`): only the user's own, and only the very
process the table shows. No textual here: the checks alone, asked before the question and again
before the signal is sent."""

from __future__ import annotations

import os

import psutil

from gpudoctor.watch.model import ProcReading


def signal_target(p: ProcReading) -> psutil.Process | str:
    """The process a key may signal, or why not: only the user's own, and only the very process the
    table shows (its start time read, and the same now: a PID may have gone to another process)."""
    if p.note or not p.command:
        return f"PID {p.pid} is not visible here"
    if p.started is None:
        return f"PID {p.pid}: its start time could not be read, so it cannot be told from a process that took its PID"
    try:
        proc = psutil.Process(p.pid)  # psutil's send_signal checks this object's start time again
        if abs(proc.create_time() - p.started) > 0.05:
            return f"PID {p.pid} is another process now"
        if os.geteuid() != 0 and proc.uids().real != os.getuid():
            return f"PID {p.pid} belongs to {proc.username()}, not to you"
    except psutil.NoSuchProcess:
        return f"PID {p.pid} has ended"
    except psutil.Error as exc:
        return f"PID {p.pid}: {exc}"
    return proc


def may_signal(p: ProcReading) -> str | None:
    """Why the user may not signal this process (None: they may)."""
    target = signal_target(p)
    return target if isinstance(target, str) else None
