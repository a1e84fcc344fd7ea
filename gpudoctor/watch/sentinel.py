"""The job's sentinel: stops a followed command's process group if gpudoctor dies without doing so.

`gpudoctor watch -- COMMAND` starts COMMAND in its own session and process group, and beside it
this small process, whose standard input is the read end of a pipe that only gpudoctor can write
to. The sentinel blocks reading it (no polling, no CPU):

- a line `=TOKEN` arrives first: the job's mark, a random value gpudoctor put in the job's
  environment (JOB_ENV) and nowhere else (not in any argv, which every user can read);
- a line `+PID START` arrives: a descendant of the job that left its process group (`setsid`),
  with its start time; the sentinel adds it to what it stops;
- a line `q` arrives: gpudoctor stopped (or saw the end of) the job itself; the sentinel exits;
- end of file: gpudoctor is gone (SIGKILL, a crash) with the job perhaps still running; the
  sentinel sends SIGTERM to the job's process group, to the descendants it was told about and to
  those it finds by the mark (and to theirs), waits up to GRACE seconds, sends SIGKILL to what is
  left, removes the job's step-channel directory if it was given one (gpudoctor.watch.steps), and
  exits.

The mark is how the sentinel finds descendants gpudoctor had no time to tell it about (one that
detached a moment before gpudoctor was killed: gpudoctor learns of descendants only at its next
process reading). A process inherits its parent's environment, so every descendant started the
usual way carries the mark, in its own session or not; `marked` reads /proc/PID/environ of the
processes of the job's user started since the job (one that cleared its environment, `env -i`,
is found only if it was told).

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
JOB_ENV = "GPUDOCTOR_JOB"  # the job's mark, in its environment and its descendants'


def marked(token: str, uid: int, since: float) -> list:  # type: ignore[type-arg]
    """Live processes of user `uid` (real and effective) started since `since` whose environment
    carries the job's mark `token`: the job's descendants, wherever they moved."""
    import psutil

    found = []
    if not token:
        return found
    for p in psutil.process_iter():
        try:
            uids = p.uids()
            if uids.real != uid or uids.effective != uid or p.create_time() < since - 0.05:
                continue
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(JOB_ENV) == token:
                found.append(p)
        except psutil.Error:
            continue
    return found


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


def _strays(told: dict[int, float], mark: tuple[str, int, float] | None = None) -> list:  # type: ignore[type-arg]
    """The told descendants still running as themselves (same start time), those carrying the job's
    `mark` (token, uid, job start), and their descendants."""
    import psutil

    found = {p.pid: p for p in (marked(*mark) if mark else [])}
    for p in list(found.values()):
        try:
            found.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.Error:
            continue
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


def _gone(pgid: int, started: float, told: dict[int, float], mark: tuple[str, int, float] | None = None) -> bool:
    return (_reused(pgid, started) or not _members(pgid)) and not _strays(told, mark)


def stop_group(
    pgid: int, started: float, grace_s: float, told: dict[int, float] | None = None, token: str = ""
) -> None:
    """SIGTERM the job's group, the told descendants and those carrying the job's mark `token`, wait
    up to `grace_s`, SIGKILL what is left; bounded in time."""
    import psutil

    told = told or {}
    mark = (token, os.getuid(), started) if token else None
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if _gone(pgid, started, told, mark):
            return
        for proc in _strays(told, mark):  # first: once their group is gone, their parents may be too
            try:
                proc.send_signal(sig)
            except psutil.Error:
                continue
        _signal(pgid, started, sig)
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            time.sleep(POLL_S)
            if _gone(pgid, started, told, mark):
                return


def read_orders(fd: int) -> tuple[dict[int, float], str] | None:
    """Read gpudoctor's lines until `q` (None: released) or end of file (the descendants told, and
    the job's mark)."""
    told: dict[int, float] = {}
    token = ""
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
            if line.startswith(b"="):
                token = line[1:].strip().decode("ascii", "replace")
            elif line.startswith(b"+"):
                try:
                    pid, start = line[1:].split()
                    told[int(pid)] = float(start)
                except ValueError:
                    continue
        if not chunk:
            return told, token


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
    orders = read_orders(0)
    if orders is None:
        return 0  # gpudoctor stopped the job itself
    told, token = orders
    stop_group(pgid, started, grace_s, told, token)
    if channel:
        remove_channel(channel)  # gpudoctor died without removing it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
