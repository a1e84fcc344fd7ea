"""Stopping process groups that gpudoctor started, without ever signalling anyone else's.

A child started with `start_new_session=True` leads its own process group (pgid == pid). While
that leader has not been reaped (it runs, or it is a zombie nobody waited for), the kernel keeps
its PID, and so the group ID, reserved: `os.killpg(pid, sig)` reaches exactly our group. Once the
leader is reaped, the number comes free again as soon as the group is empty, and may go to an
unrelated process. So after reaping, what is left of the group (grandchildren) is found by
scanning for members and signalled one by one through psutil (which checks PID + start time),
and not at all when a live process holds the number as its own PID (the number was reused: a
group of ours would have kept it reserved).

The sequence (`terminate_groups`): SIGTERM every group, wait up to `grace_s` for leaders and
members to end, SIGKILL what is left, then reap the leaders (up to `reap_s`). At most
`grace_s + reap_s` (plus a scan or two) in all.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess  # lazy below: `check --quick` imports this module but never stops a rank

    import psutil

TERM_GRACE_S = 2.0  # between SIGTERM and SIGKILL
REAP_S = 5.0  # after SIGKILL, how long to wait for each leader's exit status
_POLL_S = 0.05


def leader_exited(proc: subprocess.Popen[Any]) -> bool:
    """Whether the group leader has ended, WITHOUT reaping it (its PID stays reserved)."""
    if proc.returncode is not None:
        return True
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # not Linux: poll() reaps; members are then found by scanning
        return proc.poll() is not None
    try:
        info = waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped elsewhere (another thread's wait())
        return True
    return info is not None


def _scan(procs: Sequence[subprocess.Popen[Any]]) -> dict[int, list[psutil.Process]]:
    """One pass over the process table: the live (non-zombie) members of each group we lead,
    the leaders themselves excluded."""
    import psutil  # lazy: `check --quick` imports this module but never stops a rank

    ours = set()
    for proc in procs:
        if proc.returncode is not None and psutil.pid_exists(proc.pid):
            continue  # leader reaped and its PID in use again: that group is not ours
        ours.add(proc.pid)
    found: dict[int, list[psutil.Process]] = {pgid: [] for pgid in ours}
    if not ours:
        return found
    for p in psutil.process_iter():
        if p.pid in ours:
            continue
        try:
            pgid = os.getpgid(p.pid)
            if pgid in ours and p.status() != psutil.STATUS_ZOMBIE:
                found[pgid].append(p)
        except (OSError, psutil.Error):
            continue
    return found


def group_members(proc: subprocess.Popen[Any]) -> list[psutil.Process]:
    """The live members of the group `proc` leads, the leader itself excluded."""
    return _scan([proc]).get(proc.pid, [])


def signal_group(proc: subprocess.Popen[Any], sig: signal.Signals, members: list[psutil.Process] | None = None) -> None:
    """Send `sig` to the group `proc` leads: killpg while the leader is unreaped, else to each member."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, sig)
            return
        except (ProcessLookupError, PermissionError):
            pass  # the leader was reaped in between (another thread): fall back to the members
    import psutil

    for member in group_members(proc) if members is None else members:
        try:
            member.send_signal(sig)  # psutil refuses if the PID now belongs to another process
        except psutil.Error:
            continue


def _still_running(procs: Sequence[subprocess.Popen[Any]]) -> list[subprocess.Popen[Any]]:
    members = _scan(procs)
    return [p for p in procs if not leader_exited(p) or members.get(p.pid)]


def terminate_groups(
    procs: Sequence[subprocess.Popen[Any]],
    grace_s: float = TERM_GRACE_S,
    reap_s: float = REAP_S,
    first: signal.Signals = signal.SIGTERM,
) -> set[int]:
    """SIGTERM (or `first`) each process group, wait up to `grace_s`, SIGKILL what is left, reap the leaders.

    Returns the PIDs of the leaders that were still running when this was called (stopped by
    us, rather than ended by themselves).
    """
    stopped = {p.pid for p in procs if not leader_exited(p)}
    live = _still_running(procs)
    for sig, wait_s in ((first, grace_s), (signal.SIGKILL, 0.0)):
        for p in live:
            signal_group(p, sig)
        end = time.monotonic() + wait_s
        while live and time.monotonic() < end:
            time.sleep(_POLL_S)
            live = _still_running(live)
        if not live:
            break
    import subprocess

    end = time.monotonic() + reap_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    return stopped


def terminate_group(
    proc: subprocess.Popen[Any],
    grace_s: float = TERM_GRACE_S,
    reap_s: float = REAP_S,
    first: signal.Signals = signal.SIGTERM,
) -> bool:
    """`terminate_groups` for one group; True when it was still running (stopped by us)."""
    return proc.pid in terminate_groups([proc], grace_s, reap_s, first)
