"""The job's sentinel: stops a followed command's process group if gpudoctor dies without doing so.

`gpudoctor watch -- COMMAND` starts COMMAND in its own session and process group, and beside it
this small process, whose standard input is the read end of a pipe that only gpudoctor can write
to. The sentinel blocks reading it (no polling, no CPU):

- a line `+PID START` arrives: a descendant of the job that left its process group (`setsid`),
  with its start time; the sentinel adds it to what it stops;
- a line `q` arrives: gpudoctor stopped (or saw the end of) the job itself; the sentinel exits;
- end of file: gpudoctor is gone (SIGKILL, a crash) with the job perhaps still running; the
  sentinel sends SIGTERM to the job's process group and to the descendants it was told about (and
  theirs), waits up to GRACE seconds, sends SIGKILL to what is left, removes the job's step-channel
  directory if it was given one (gpudoctor.watch.steps), and exits.

It never signals anything but the job's group and the descendants it was told about (each checked
against its recorded start time, so a reused PID is left alone): while the job's leader (PID == PGID, with the start
time gpudoctor recorded) is alive the group is reserved and `killpg` reaches exactly it; once the
leader is gone, the group's remaining members are signalled one by one through psutil (which checks
each PID's start time), and not at all if another process holds the number as its own PID (a group
of ours would have kept the number reserved). See gpudoctor.safety.procs for the same rule.

Run as a script (`python -I sentinel.py PGID START_TIME GRACE [CHANNEL_DIR]`), it imports only the standard
library, and psutil once it has work to do. It ignores SIGINT and SIGHUP (a closing terminal or a
Ctrl-C reach gpudoctor, which stops the job and then releases the sentinel) and runs in its own
session, so a signal to gpudoctor's process group does not take it down with gpudoctor.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 0.1
KILL_WAIT_S = 2.0  # after SIGKILL, how long to wait for the group to be gone before giving up


def _leader(pgid: int, started: float):  # type: ignore[no-untyped-def]
    """The job's leader if it still runs (same PID and start time), else None."""
    import psutil

    try:
        proc = psutil.Process(pgid)
        if abs(proc.create_time() - started) < 0.05 and os.getpgid(pgid) == pgid:
            return proc
    except (psutil.Error, OSError):
        pass
    return None


def _members(pgid: int) -> list:  # type: ignore[type-arg]
    """The live members of group `pgid` (the sentinel itself is in another group)."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (OSError, psutil.Error):
            continue
    return found


def _reused(pgid: int, started: float) -> bool:
    """Another process holds the group's number as its PID: the group is not (or no longer) ours."""
    import psutil

    return _leader(pgid, started) is None and psutil.pid_exists(pgid)


def _signal(pgid: int, started: float, sig: signal.Signals) -> None:
    import psutil

    if _leader(pgid, started) is not None:
        try:
            os.killpg(pgid, sig)
            return
        except OSError:
            pass  # the leader ended in between: fall back to the members
    if _reused(pgid, started):
        return
    for member in _members(pgid):
        try:
            member.send_signal(sig)  # psutil refuses if the PID now belongs to another process
        except psutil.Error:
            continue


def _strays(told: dict[int, float]) -> list:  # type: ignore[type-arg]
    """The told descendants still running as themselves (same start time), and their descendants."""
    import psutil

    found = {}
    for pid, started in told.items():
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - started) >= 0.05 or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            found[pid] = proc
            found.update((c.pid, c) for c in proc.children(recursive=True))
        except psutil.Error:
            continue
    return list(found.values())


def _gone(pgid: int, started: float, told: dict[int, float]) -> bool:
    return (_reused(pgid, started) or not _members(pgid)) and not _strays(told)


def stop_group(pgid: int, started: float, grace_s: float, told: dict[int, float] | None = None) -> None:
    """SIGTERM the job's group and the told descendants, wait up to `grace_s`, SIGKILL what is left;
    bounded in time."""
    import psutil

    told = told or {}
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if _gone(pgid, started, told):
            return
        for proc in _strays(told):  # first: once their group is gone, their parents may be too
            try:
                proc.send_signal(sig)
            except psutil.Error:
                continue
        _signal(pgid, started, sig)
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            time.sleep(POLL_S)
            if _gone(pgid, started, told):
                return


def read_orders(fd: int) -> dict[int, float] | None:
    """Read gpudoctor's lines until `q` (None: released) or end of file (the descendants told)."""
    told: dict[int, float] = {}
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            chunk = b""
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop() if chunk else b""  # a line not finished yet (at the end: every line counts)
        for line in lines:
            if line.strip() == b"q":
                return None
            if line.startswith(b"+"):
                try:
                    pid, start = line[1:].split()
                    told[int(pid)] = float(start)
                except ValueError:
                    continue
        if not chunk:
            return told


CHANNEL_PREFIX = "gpudoctor-steps-"  # gpudoctor.watch.steps' directory (mkdtemp prefix)


def remove_channel(directory: str) -> None:
    """The job's step-channel directory (ours, named by gpudoctor) and its socket, once the job is stopped."""
    try:
        st = os.lstat(directory)
        if not os.path.basename(directory).startswith(CHANNEL_PREFIX) or st.st_uid != os.geteuid():
            return
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    pgid, started, grace_s = int(argv[1]), float(argv[2]), float(argv[3])
    channel = argv[4] if len(argv) > 4 else None
    told = read_orders(0)
    if told is None:
        return 0  # gpudoctor stopped the job itself
    stop_group(pgid, started, grace_s, told)
    if channel:
        remove_channel(channel)  # gpudoctor died without removing it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
