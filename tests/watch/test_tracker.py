"""The job's processes as the tracker lists them (gpudoctor/watch/tracker.py), on real processes: a rank is
the top process carrying RANK, and a stack is read only of the process that was listed, never of another
that took its number after it ended."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from gpudoctor.probe import stacks as probe_stacks
from gpudoctor.probe.job_procs import ProcFacts
from gpudoctor.watch import tracker as tracker_module
from gpudoctor.watch.arrival import RANK, Heard, JobProc
from gpudoctor.watch.tracker import JobTracker
from tests.helpers.processes import clean_env


def observed(tracker: JobTracker, pid: int) -> tuple[JobProc, ...]:
    """The tracker's list once it holds `pid`, observed sample after sample as watch does (a child just
    started may not have reached exec yet: it still shows this process's environment), within 10 s."""
    deadline = time.monotonic() + 10
    while not (listed := tracker.observe([pid], None, {}, time.time())) and time.monotonic() < deadline:
        time.sleep(0.05)
    return listed


def test_a_process_read_between_fork_and_exec_is_read_again_and_listed_as_its_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its first reading (its parent's command line, no RANK) is not kept for its whole life."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=clean_env(RANK="3"))
    real = tracker_module.facts
    reads: list[int] = []

    def facts(pid: int) -> ProcFacts | None:
        reads.append(pid)
        found = real(pid)
        if found is None or len(reads) > 1:
            return found
        return ProcFacts(pid, os.getpid(), found.started, tuple(sys.argv), {})  # before exec: the parent's

    monkeypatch.setattr(tracker_module, "facts", facts)
    tracker = JobTracker()
    try:
        deadline = time.monotonic() + 10
        while real(child.pid) is None or "RANK" not in real(child.pid).env:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the child never showed RANK"
            time.sleep(0.05)
        assert tracker.observe([child.pid], None, {}, time.time()) == ()  # it looks like pytest for now
        listed = tracker.observe([child.pid], None, {}, time.time())
        assert [(p.role, p.rank) for p in listed] == [(RANK, 3)]
        assert reads == [child.pid, child.pid]
    finally:
        tracker.close()
        child.kill()
        child.wait()


def test_a_rank_that_has_ended_is_never_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []

    def dump(pid: int, **_: object) -> probe_stacks.Stack:
        read.append(pid)
        return probe_stacks.Stack(note="test")

    monkeypatch.setattr(probe_stacks, "dump", dump)
    monkeypatch.setattr(tracker_module, "RESTACK_S", 0.0)  # asked again at once, not 10 s later
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=clean_env(RANK="3"))
    tracker = JobTracker()
    try:
        assert [(p.role, p.rank) for p in observed(tracker, child.pid)] == [(RANK, 3)]
        tracker.want_stacks([child.pid])
        deadline = time.monotonic() + 10
        while not read and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read == [child.pid]  # alive: read
        child.kill()
        child.wait()
        read.clear()
        tracker.want_stacks([child.pid])  # asked again after it ended (its number may be anyone's now)
        time.sleep(0.5)
        assert read == []
    finally:
        tracker.close()
        if child.poll() is None:
            child.kill()
            child.wait()


def _hello(pid: int) -> Heard:
    """What a rank's beat says once it imported gpudoctor: here, not joined."""
    return Heard(pid, 3, None, None, False, None, 0, time.time(), False)


def _wait_reads(read: list[int], n: int) -> None:
    deadline = time.monotonic() + 10
    while len(read) < n and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_stack_read_before_the_rank_said_hello_is_read_again_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found under load (test_job_life's MASTER_PORT job): a rank's stack read while it still imported (not
    heard yet) is not shown once it says hello (another state), and it was not read again for RESTACK_S
    (10 s): the rank had no whereabouts, GD920 named it without any, and GD923 came 10 s late. Here RESTACK_S
    is an hour and nothing but the hello changes: the stack is read again as soon as it is asked for."""
    read: list[int] = []

    def dump(pid: int, **_: object) -> probe_stacks.Stack:
        read.append(pid)
        return probe_stacks.Stack(note=f"read {len(read)}")

    monkeypatch.setattr(probe_stacks, "dump", dump)
    monkeypatch.setattr(tracker_module, "RESTACK_S", 3600.0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=clean_env(RANK="3"))
    tracker = JobTracker(join_after_s=0.0)  # a process waiting at all has its stack read ahead
    try:
        assert [(p.role, p.rank) for p in observed(tracker, child.pid)] == [(RANK, 3)]
        tracker.want_stacks([child.pid])  # read while silent (a verdict named it, or another rank spoke)
        _wait_reads(read, 1)
        (silent,) = tracker.observe([child.pid], None, {}, time.time())
        assert read == [child.pid] and silent.stack_note == "read 1"
        (heard,) = tracker.observe([child.pid], None, {child.pid: _hello(child.pid)}, time.time())
        assert heard.joined is False and heard.stack_note == ""  # the silent one's stack is not where it is now
        _wait_reads(read, 2)  # asked for by observe (it waits before step 1): read again, not an hour later
        assert read == [child.pid, child.pid]
        (now,) = tracker.observe([child.pid], None, {child.pid: _hello(child.pid)}, time.time())
        assert now.stack_note == "read 2"
    finally:
        tracker.close()
        child.kill()
        child.wait()


def test_a_stack_read_while_the_rank_said_hello_is_not_kept_as_where_it_is_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """py-spy is slow on a loaded machine: a rank that says hello while its stack is read may have been caught
    before (importing). That stack belongs to the state before the read, not to the one after it."""
    read: list[int] = []
    release = threading.Event()

    def dump(pid: int, **_: object) -> probe_stacks.Stack:
        read.append(pid)
        if len(read) == 1:
            assert release.wait(10)  # the read in progress while the rank says hello
        return probe_stacks.Stack(note=f"read {len(read)}")

    monkeypatch.setattr(probe_stacks, "dump", dump)
    monkeypatch.setattr(tracker_module, "RESTACK_S", 3600.0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=clean_env(RANK="3"))
    tracker = JobTracker(join_after_s=0.0)
    try:
        assert [(p.role, p.rank) for p in observed(tracker, child.pid)] == [(RANK, 3)]
        tracker.want_stacks([child.pid])
        _wait_reads(read, 1)
        tracker.observe([child.pid], None, {child.pid: _hello(child.pid)}, time.time())  # during the read
        release.set()
        deadline = time.monotonic() + 10
        while child.pid in tracker._pending and time.monotonic() < deadline:
            time.sleep(0.02)
        (heard,) = tracker.observe([child.pid], None, {child.pid: _hello(child.pid)}, time.time())
        assert heard.stack_note != "read 1"  # taken before the hello: not shown as where it is now
        _wait_reads(read, 2)
        (now,) = tracker.observe([child.pid], None, {child.pid: _hello(child.pid)}, time.time())
        assert read == [child.pid, child.pid] and now.stack_note == "read 2"
    finally:
        release.set()
        tracker.close()
        child.kill()
        child.wait()
