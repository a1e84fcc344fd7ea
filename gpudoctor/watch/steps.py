"""The watcher's end of the training-step channel (`gpudoctor.step()`, gpudoctor/training_step.py).

`watch -- COMMAND` makes a private directory (mkdtemp: mode 0700, a random name, in
$XDG_RUNTIME_DIR when that is a private directory of ours, else the temp directory), binds a
unix datagram socket in it (mode 0600), and gives its path to the command in GPUDOCTOR_STEPS.
Nobody else can reach the socket (they cannot enter the directory), and a record counts only
if the kernel says (SO_PASSCRED) that it comes from a process of the followed job under our own
user: the PID and rank inside the record are never trusted for that.

A thread receives the records as they come (the kernel queues only a few datagrams: 10 by
default), adds them up per rank, and `take()` hands the sampler one RankReading per rank per
interval. The directory and the socket are removed on close.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import stat
import struct
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import psutil

from gpudoctor.training_step import ENV, EVENT, EVENT_MAGIC, MAGIC, RECORD, SOCKET_NAME
from gpudoctor.watch.arrival import MAX_ENDED, Heard, heard
from gpudoctor.watch.bounds import MAX_RANKS, MAX_STEP_NUMBER, MAX_STEP_S
from gpudoctor.watch.data_model import MAX_PAYLOAD, DataInbox, DataReading, is_data
from gpudoctor.watch.model import RankReading, plural
from gpudoctor.watch.sentinel import CHANNEL_PREFIX

CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
# The step record before GDS2 (it had no step time of the waited steps): a job may import an older
# gpudoctor than the watcher's. Its waited steps are taken at the record's mean step time.
MAGIC_V1 = b"GDS1"
RECORD_V1 = struct.Struct("<4siIIIIQdddd")
WAKE = b"wake"  # sent to ourselves by close()
ERROR_FILE = "torchelastic_error.json"  # torchrun's TORCHELASTIC_ERROR_FILE, in the same private directory
MAX_STEPS_PER_RECORD = 1_000_000  # more than any loop runs between two records: a damaged record
# Bounds on what a record may say beyond a recorded reading's (MAX_STEP_S, MAX_STEP_NUMBER: bounds.py;
# heuristics): an end more than a day from our own clock (the job runs on this machine) is no end of a
# recent step.
MAX_CLOCK_SKEW_S = 86_400.0
ROUNDING = 1 + 1e-9  # a part summed apart from its whole may round a hair above it
MAX_RANK = 1 << 20  # torch's world sizes stay far below a million ranks
# The publisher sends at most one record per FLUSH_S (~20 a second) plus a last one at exit; a process
# sending more is flooding the watcher's thread: records beyond RATE a second (after a BURST) are
# dropped and counted. Ranks followed at once: the job's processes, each one key, at most MAX_RANKS
# (gpudoctor.watch.bounds: a recorded sample with more is refused too); past them the least recently
# heard rank is forgotten (it sent nothing since), so a job whose processes come and go is never refused.
RATE = 100.0
BURST = 200.0
# What each process last said (arrival, joining, exit) is held while it lives and, once it said it exited,
# for the latest MAX_ENDED processes (gpudoctor/watch/arrival.py; the tracker keeps as many): how a rank
# ended is the clue to a failed job. A multiprocessing child that exits without having joined a group or
# stepped (a DataLoader worker started with spawn imports the script: each sends an exit) is no rank:
# nothing of it is held once it exited.
STEP, DATA, EVENTS = "step record", "data datagram", "event record"  # what the channel may ignore


@dataclass
class _Acc:
    """One rank's steps since the last take(), and its last step for good."""

    rank: int | None
    pid: int
    heard: float = 0.0  # when its first record arrived (epoch s): a process started later is another
    steps: int = 0
    sum_step: float = 0.0
    max_step: float = 0.0
    waited: int = 0
    sum_wait: float = 0.0
    sum_waited_step: float = 0.0  # the step time of the steps that measured an input wait
    last_step: int | None = None
    last_end: float | None = None

    def reading(self) -> RankReading:
        step_s = self.sum_step / self.steps if self.steps else None
        return RankReading(
            pid=self.pid,
            rank=self.rank,
            steps=self.steps,
            step_s=None if step_s is None else round(step_s, 6),
            step_max=round(self.max_step, 6) if self.steps else None,
            wait_s=round(self.sum_wait / self.waited, 6) if self.waited else None,
            waited=self.waited if self.waited else None,
            wait_step_s=round(self.sum_waited_step / self.waited, 6) if self.waited else None,
            last_step=self.last_step,
            last_end=None if self.last_end is None else round(self.last_end, 6),
        )


def _private_base() -> str | None:
    """$XDG_RUNTIME_DIR if it is a private directory of ours (systemd makes it 0700), else None (tmp)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base:
        return None
    try:
        st = os.lstat(base)
    except OSError:
        return None
    ok = stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077
    return base if ok else None


# A process's start time (psutil: /proc's, in clock ticks since boot) against the wall clock when it was first
# heard: a heuristic allowance for the tick and for the boot time's rounding, well under a restart's seconds.
START_SLACK_S = 1.0


def _running(pid: int, heard: float) -> bool:
    """Whether process `pid`, first heard at `heard` (epoch s), still runs: not exited, not a zombie waiting
    for its parent, and not a newer process (or thread) that took its number since (review 7)."""
    try:
        p = psutil.Process(pid)
        return p.create_time() <= heard + START_SLACK_S and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class StepChannel:
    """Receives step records from the job's processes; see the module docstring."""

    clock = staticmethod(time.monotonic)  # the rate limit's clock

    def __init__(self, accept: Callable[[int], bool] | None = None) -> None:
        self.accept = accept  # pid -> is it one of the job's processes (None: nothing accepted yet)
        self.directory = tempfile.mkdtemp(prefix=CHANNEL_PREFIX, dir=_private_base())
        self.path = os.path.join(self.directory, SOCKET_NAME)
        self._lock = threading.Lock()
        # Least recently heard first (a rank past MAX_RANKS replaces the first that has nothing pending).
        self._ranks: OrderedDict[tuple[int | None, int], _Acc] = OrderedDict()
        # The latest arrival/stall event of each live process, and of the latest processes that exited (by
        # kernel PID; least recently heard first): see MAX_ENDED.
        self._heard: OrderedDict[int, Heard] = OrderedDict()
        self._ended: OrderedDict[int, Heard] = OrderedDict()
        self.ignored: Counter[str] = Counter()  # STEP, DATA, EVENTS from outside the job, or damaged
        self.dropped = 0  # records the ranks could not send (our queue was full)
        self.flooded = 0  # step records beyond RATE a second from one process, or beyond MAX_RANKS at once
        self._budget: dict[int, tuple[float, float]] = {}  # pid -> (records it may still send, when)
        self._members: OrderedDict[int, float | None] = OrderedDict()  # pid accepted -> its start time
        self._closed = threading.Event()
        self.data = DataInbox()  # what the ranks say about their data, loss and loader (training_data)
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.sock.bind(self.path)
            os.chmod(self.path, 0o600)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self.sock.settimeout(0.5)  # to notice close(); a blocked receive costs nothing
        except OSError:
            self._remove()
            raise
        self._thread = threading.Thread(target=self._run, name="gpudoctor-steps", daemon=True)
        self._thread.start()

    @property
    def rejected(self) -> int:
        """Datagrams ignored as from outside the job or damaged, of every kind."""
        return sum(self.ignored.values())

    def held(self) -> dict[str, int]:
        """What the channel holds per process now (bounded by the processes alive, not those ever seen)."""
        with self._lock:
            ranks, heard, ended = len(self._ranks), len(self._heard), len(self._ended)
        return {"ranks": ranks, "heard": heard, "ended": ended, "data": self.data.held()}

    @property
    def env(self) -> dict[str, str]:
        return {ENV: self.directory}

    @property
    def error_file(self) -> str:
        """Where torchrun may write the job's first failure (private like the socket; removed on close)."""
        return os.path.join(self.directory, ERROR_FILE)

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self._receive()
            except TimeoutError:
                continue
            except OSError:
                return  # closed

    def _receive(self) -> None:
        """One datagram (raises TimeoutError / BlockingIOError when there is none)."""
        # one byte more: a longer datagram shows
        size = max(RECORD.size, RECORD_V1.size, EVENT.size, MAX_PAYLOAD + 4) + 1
        data, ancdata, _, _ = self.sock.recvmsg(size, socket.CMSG_SPACE(CREDENTIALS.size))
        if self._closed.is_set() and data == WAKE:
            return
        pid = _sender(ancdata)
        if is_data(data):
            kind = DATA
        elif len(data) == EVENT.size and data[:4] == EVENT_MAGIC:
            kind = EVENTS
        else:
            kind = STEP
        if pid is None or not self._accepted(pid):
            self.ignored[kind] += 1
        elif kind == DATA:
            try:
                self.data.add(pid, data[4:])
            except ValueError:
                self.ignored[kind] += 1
        elif kind == EVENTS:
            self._add_event(pid, data)
        elif len(data) in (RECORD.size, RECORD_V1.size):
            self._add(pid, data)
        else:
            self.ignored[kind] += 1

    def _add_event(self, pid: int, data: bytes) -> None:
        got = heard(pid, data)  # the kernel's PID, not the record's
        if got is None:
            self.ignored[EVENTS] += 1
            return
        with self._lock:
            before = self._heard.pop(pid, None)
            self._ended.pop(pid, None)
            if got.exiting and not got.joined and before is not None and before.joined:
                # it left its group before exiting (destroy_process_group): it had joined, as said before
                got = replace(got, joined=True, dist_rank=before.dist_rank, dist_world=before.dist_world)
            if not got.exiting:
                self._heard[pid] = got
                if len(self._heard) > MAX_RANKS:
                    self._heard.popitem(last=False)  # a process silent the longest (killed without a word)
            elif got.joined or got.step or got.failed or not got.child:
                self._ended[pid] = got
                if len(self._ended) > MAX_ENDED:
                    self._ended.popitem(last=False)
            for key, acc in self._ranks.items():  # steps a fast loop had not sent yet when it stopped
                if key[1] == pid and got.step > (acc.last_step or 0):
                    acc.last_step = got.step
                    if got.inside is False:
                        acc.last_end = got.since
        if got.exiting:  # its data came before its exit (one socket, in order); its PID may be reused
            self.data.forget(pid)

    def forget_gone(self, keep: set[int], before: float) -> None:
        """The job's process tree, read after `before` (epoch s), holds `keep` (and the tracker lists them):
        a process heard before it and not there is gone without saying so (killed): what it said, and the
        rank it claimed, are forgotten. One heard since may be newer than the tree: kept until the next."""
        with self._lock:
            gone = [pid for pid, h in self._heard.items() if pid not in keep and h.at < before]
            for pid in gone:
                del self._heard[pid]
        for pid in gone:
            self.data.forget(pid)

    def heard(self) -> dict[int, Heard]:
        """The latest event of each process that sent one (arrival, joining, a state that held)."""
        with self._lock:
            return {**self._heard, **self._ended}

    def _accepted(self, pid: int) -> bool:
        accept = self.accept
        try:
            if accept is not None and accept(pid):
                if pid not in self._members:
                    self._members[pid] = _start_time(pid)
                    if len(self._members) > 2 * MAX_RANKS:
                        self._members.popitem(last=False)  # accepted the longest ago (processes come and go)
                self._members.move_to_end(pid)
                return True
        except Exception:  # noqa: BLE001  (a failing check rejects the record, never the thread)
            return False
        # Under load this thread reads a datagram seconds after it was sent: its sender, a job process whose
        # earlier datagrams were accepted, may have exited and been reaped since, and is nobody's descendant
        # any more. Its last steps and its exit were ignored as from outside the job (a restarted job's rank
        # counted 94 of its 100 steps, test_held at interval 3 under load). A PID accepted before is still
        # that process's while no other process holds it (the publisher's exit waits until the watcher took
        # its datagrams, so one of them was checked while it lived).
        started = self._members.get(pid)
        return started is not None and _start_time(pid) in (started, None)

    def _within_rate(self, pid: int, now: float) -> bool:
        """A token bucket per process: RATE records a second, BURST at once."""
        budget = self._budget
        left, since = budget.get(pid, (BURST, now))
        left = min(BURST, left + (now - since) * RATE)
        if len(budget) >= MAX_RANKS and pid not in budget:
            budget.clear()  # processes come and go (restarts): forget them all rather than grow
        budget[pid] = (left - 1, now) if left >= 1 else (left, now)
        return left >= 1

    def _add(self, pid: int, data: bytes) -> None:
        if len(data) == RECORD.size:
            magic, rank, _, count, waited, dropped, last, end, sum_step, max_step, sum_wait, waited_step = (
                RECORD.unpack(data)
            )
            expected = MAGIC
        else:
            magic, rank, _, count, waited, dropped, last, end, sum_step, max_step, sum_wait = RECORD_V1.unpack(data)
            waited_step = min(sum_step, max(sum_wait, sum_step * waited / count)) if count else 0.0
            expected = MAGIC_V1
        now = time.time()
        if not self._within_rate(pid, self.clock()):
            self.flooded += 1
            return
        numbers = (end, sum_step, max_step, sum_wait, waited_step)
        sane = (
            magic == expected
            and 0 < count <= MAX_STEPS_PER_RECORD
            and waited <= count
            and dropped <= MAX_STEPS_PER_RECORD
            and last <= MAX_STEP_NUMBER
            and rank < MAX_RANK
        )
        if not sane or not all(math.isfinite(x) and x >= 0 for x in numbers):
            self.ignored[STEP] += 1
            return
        if (
            max_step > MAX_STEP_S
            or sum_step > count * MAX_STEP_S
            or sum_wait > waited * MAX_STEP_S
            or waited_step > waited * MAX_STEP_S  # a recording's wait_step_s is held to a day too (bounds.py)
        ):
            self.ignored[STEP] += 1  # 1e308 is a float, not a step time: sums would overflow to inf
            return
        if waited_step > sum_step * ROUNDING or sum_wait > waited_step * ROUNDING:
            self.ignored[STEP] += 1  # a part of the steps' time (the waited steps', their wait) beyond its whole
            return
        if abs(end - now) > MAX_CLOCK_SKEW_S:
            self.ignored[STEP] += 1
            return
        key = (None if rank < 0 else rank, pid)  # the kernel's PID, not the record's
        with self._lock:
            self.dropped += dropped
            acc = self._ranks.get(key)
            if acc is None:
                # A new process for a rank number seen before (a restarted job): the old one is done, once it
                # has exited (two live processes with one number, two jobs under one watch, both step: review
                # 6 F8); a process that now says another rank number is that rank now (one key per process).
                carried: _Acc | None = None
                for old in [k for k in self._ranks if k[1] == pid or (k[0] is not None and k[0] == key[0])]:
                    if old[1] == pid or old[1] in self._ended or not _running(old[1], self._ranks[old].heard):
                        gone = self._ranks.pop(old)
                        if old[1] != pid and gone.steps:
                            carried = gone  # the rank's steps its old process made since the last take (review 7)
                if len(self._ranks) >= MAX_RANKS:
                    oldest = next(iter(self._ranks.values()))
                    if oldest.steps:  # MAX_RANKS ranks stepped since the last take: more at once than a job has
                        self.flooded += 1
                        return
                    self._ranks.popitem(last=False)  # the rank heard the least recently: gone quiet
                # the old process's uncollected steps are the rank's: counted in its row, as every process that
                # held it one after another
                fresh = _Acc(key[0], pid, now)
                acc = self._ranks[key] = fresh if carried is None else replace(carried, pid=pid, heard=now)
            else:
                self._ranks.move_to_end(key)
            acc.steps += count
            acc.sum_step += sum_step
            acc.max_step = max(acc.max_step, max_step)
            acc.waited += waited
            acc.sum_wait += sum_wait
            acc.sum_waited_step += waited_step
            acc.last_step, acc.last_end = last, end

    def take(self) -> tuple[RankReading, ...]:
        """One reading per rank for the interval since the last take (ranks that sent nothing this
        interval still report their last step: a stalled rank must stay visible)."""
        with self._lock:
            out = tuple(acc.reading() for _, acc in sorted(self._ranks.items(), key=lambda kv: _order(kv[0])))
            for acc in self._ranks.values():
                acc.steps = acc.waited = 0
                acc.sum_step = acc.max_step = acc.sum_wait = acc.sum_waited_step = 0.0
        return out

    def take_data(self) -> tuple[DataReading, ...]:
        """The data the ranks sent since the last call (gpudoctor/watch/data_model.py)."""
        return self.data.take()

    @property
    def note(self) -> str | None:
        """What went wrong with the channel, in the user's words (None: nothing)."""
        parts = []
        if self.ignored:
            kinds = [plural(n, kind) for kind, n in sorted(self.ignored.items())]
            parts.append(f"ignored {' and '.join(kinds)} from outside the job or damaged")
        if self.data.crowded:
            parts.append(
                f"ignored {plural(self.data.crowded, DATA)} from processes beyond the "
                f"{MAX_RANKS} that had sent data in the same interval"
            )
        if self.dropped:
            parts.append(f"{plural(self.dropped, 'step record')} could not be sent in time (the watcher was behind)")
        if self.flooded:
            parts.append(
                f"ignored {plural(self.flooded, 'step record')} beyond {RATE:.0f} a second from one process "
                f"(or from more than {MAX_RANKS} ranks stepping at once)"
            )
        return "; ".join(parts) or None

    def close(self) -> None:
        """Stop receiving, keep the records already sent (a job's last steps, sent as it exited), remove
        the socket and the directory."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as wake:
            wake.sendto(WAKE, self.path)  # ends the thread's wait now, not at its timeout
        self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            self.sock.setblocking(False)
            with contextlib.suppress(OSError):
                for _ in range(10_000):  # what is still queued
                    self._receive()
        with contextlib.suppress(OSError):
            self.sock.close()
        self._remove()

    def _remove(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.unlink(self.error_file)
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)


def _start_time(pid: int) -> float | None:
    """When process `pid` started (psutil's create time); None when no process has that number now."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _sender(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The sending process's PID as the kernel reports it, if it runs as our own user."""
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(cdata) >= CREDENTIALS.size:
            pid, uid, _ = CREDENTIALS.unpack(cdata[: CREDENTIALS.size])
            return pid if uid == os.geteuid() and pid > 0 else None
    return None


def _order(key: tuple[int | None, int]) -> tuple[bool, int, int]:
    return (key[0] is None, key[0] or 0, key[1])
