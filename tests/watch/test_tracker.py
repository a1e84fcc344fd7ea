"""The job's processes as the tracker lists them (gpudoctor/watch/tracker.py), on real processes: a rank is
the top process carrying RANK, and a stack is read only of the process that was listed, never of another
that took its number after it ended."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpudoctor.probe import stacks as probe_stacks
from gpudoctor.watch import tracker as tracker_module
from gpudoctor.watch.arrival import RANK
from gpudoctor.watch.tracker import JobTracker
from tests.helpers.processes import clean_env


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
        listed = tracker.observe([child.pid], None, {}, time.time())
        assert [(p.role, p.rank) for p in listed] == [(RANK, 3)]
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
