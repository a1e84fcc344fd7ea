"""The job's processes as the tracker lists them (gpudoctor/watch/tracker.py), on real processes: a rank is
the top process carrying RANK, and a stack is read only of the process that was listed, never of another
that took its number after it ended."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpudoctor.probe import stacks as probe_stacks
from gpudoctor.probe.job_procs import ProcFacts
from gpudoctor.watch import tracker as tracker_module
from gpudoctor.watch.arrival import RANK, JobProc
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
