"""A process's arrival, as the step API says it (gpudoctor/training_step.py's beat and exit events) and as
watch records it (gpudoctor/watch/arrival.py): real processes on a real StepChannel, and damaged input."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpudoctor import training_step
from gpudoctor.training_step import ENV, EVENT, EVENT_MAGIC, EXITING, FAILED, INSIDE, JOINED, SOCKET_NAME
from gpudoctor.watch.arrival import LAUNCHER, RANK, Heard, JobProc, heard, merged
from gpudoctor.watch.model import Sample
from gpudoctor.watch.steps import StepChannel
from tests.helpers.channel import raw_channel
from tests.helpers.processes import clean_env, free_port


def wait_for(cond: Callable[[], object], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@contextlib.contextmanager
def channel_open() -> Iterator[StepChannel]:
    channel = StepChannel(accept=lambda pid: True)
    try:
        yield channel
    finally:
        channel.close()


def start(code: str, channel: StepChannel, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, **channel.env, "OMP_NUM_THREADS": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_process_says_it_joined_where_it_is_in_its_steps_and_how_it_exited() -> None:
    """Real torch.distributed (gloo, world size 1): the beat says 'not joined' from `import gpudoctor`,
    then the join, then inside step 1 while the step holds, outside after it, and the exit with its
    uncaught exception. The step path sends none of these: the records come from the beat and atexit."""
    code = (
        "import gpudoctor, sys, time\n"
        "print('imported', flush=True)\n"
        "sys.stdin.readline()\n"  # the test has seen 'not joined'
        "import torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}', rank=0, world_size=1)\n"
        "print('joined', flush=True)\n"
        "with gpudoctor.step():\n"
        "    sys.stdin.readline()\n"  # held inside step 1 until the test has seen it
        "sys.stdin.readline()\n"  # outside after step 1
        "raise RuntimeError('boom')\n"
    )
    with channel_open() as channel:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, **channel.env, "OMP_NUM_THREADS": "1", "RANK": "3"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "imported"

            def said() -> Heard | None:
                return channel.heard().get(proc.pid)

            wait_for(lambda: said() is not None)
            first = said()
            assert first is not None and (first.rank, first.joined, first.step, first.inside) == (3, False, 0, None)
            proc.stdin.write("\n")
            proc.stdin.flush()
            wait_for(lambda: (s := said()) is not None and s.joined)
            s = said()
            assert s is not None and (s.dist_rank, s.dist_world) == (0, 1)
            wait_for(lambda: (s := said()) is not None and s.inside is True)
            s = said()
            assert s is not None and s.step == 0 and s.since <= time.time()
            proc.stdin.write("\n")
            proc.stdin.flush()
            wait_for(lambda: (s := said()) is not None and s.inside is False and s.step == 1)
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.wait(timeout=60) == 1
            wait_for(lambda: (s := said()) is not None and s.exiting, timeout=10)
            s = said()
            assert s is not None and s.failed and s.step == 1 and s.joined
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _events(sock: socket.socket) -> list[tuple[int, int]]:
    """(pid, flags) of every event queued on `sock`, in order, until it has been quiet for 2 s."""
    sock.settimeout(2)
    got = []
    with contextlib.suppress(TimeoutError):
        while True:
            data = sock.recv(65536)
            if len(data) == EVENT.size and data[:4] == EVENT_MAGIC:
                _, pid, _, _, _, flags, _, _ = EVENT.unpack(data)
                got.append((pid, flags))
    return got


def test_the_exit_waits_for_a_watcher_whose_queue_is_full_rather_than_vanish(tmp_path: Path) -> None:
    """CI at stop 32: a finished job's rank was still held as alive ('heard'), its exit event lost. Under
    load the watcher's thread was behind its queue of 10 datagrams (net.unix.max_dgram_qlen) when the rank
    exited, and the exit event timed out after EXIT_SEND_S and was dropped. Here another sender fills the
    queue, the job exits, and the watcher reads nothing for 1 s: the exit event still arrives, last."""
    directory, sock = raw_channel(tmp_path)
    path = str(directory / SOCKET_NAME)
    code = (
        "import socket, gpudoctor\n"
        f"s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.connect({path!r}); s.setblocking(False)\n"
        "for _ in range(20):\n"
        "    try: s.send(b'filler')\n"
        "    except BlockingIOError: break\n"
        "print('full', flush=True)\n"
    )
    job = subprocess.Popen(
        [sys.executable, "-c", code], env=clean_env(**{ENV: str(directory)}), stdout=subprocess.PIPE, text=True
    )
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "full"
        time.sleep(1.0)  # the job is in its exit now, the queue full: its exit must wait, not drop
        events = _events(sock)
        assert job.wait(timeout=30) == 0
        assert events and events[-1] == (job.pid, events[-1][1]) and events[-1][1] & EXITING
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        sock.close()


def test_nothing_is_said_after_the_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The beat is a daemon thread: it ran on while atexit said the exit, and an event it sent after it had
    the watcher hold the exited process as alive again. Once the exit is said, the beat's event is refused."""
    directory, sock = raw_channel(tmp_path)
    monkeypatch.setattr(training_step, "BEAT_S", 3600.0)  # this test's publisher has no beat of its own
    monkeypatch.setattr(training_step, "EXIT_WAIT_S", 0.5)  # read only after: the exit waits for a reader
    pub = training_step._Publisher(str(directory))
    monkeypatch.setattr(training_step, "_publisher", pub)
    try:
        pub.last_flush()  # what atexit runs
        assert not training_step._say(pub, None, (0, None), False, time.time())  # what the beat sends next
        assert _events(sock) == [(os.getpid(), EXITING)]
    finally:
        pub.sock.close()
        sock.close()


def test_a_multiprocessing_child_stays_silent_until_it_joins_or_steps(tmp_path: Path) -> None:
    """A DataLoader worker started with spawn imports the script (and gpudoctor) again: it must not be
    heard as a rank of its own. Multiprocessing names it a child only after that import, so a script slow
    to import (here 1.5 s: three beats) had the worker's beat take it for no child and say hello (CI at
    stop 32: a finished job still held a worker as alive)."""
    script = tmp_path / "job.py"
    script.write_text(
        "import multiprocessing as mp, time\n"
        "import gpudoctor\n"
        "if __name__ == '__mp_main__':\n"
        "    time.sleep(1.5)\n"  # the spawned child, importing the script
        "def work():\n"
        "    time.sleep(1.5)\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=work)\n"
        "    p.start(); print(p.pid, flush=True); p.join(); print(p.exitcode, flush=True)\n"
    )
    with channel_open() as channel:
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            env={**os.environ, **channel.env, "OMP_NUM_THREADS": "1", "RANK": "0"},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        seen: set[int] = set()
        while proc.poll() is None:  # what the watcher holds while the child lives, not only at the end
            seen.update(channel.heard())
            time.sleep(0.05)
        assert proc.returncode == 0 and proc.stdout.read().strip() == "0"  # the child ran its work
        time.sleep(0.3)
        seen.update(channel.heard())
    assert proc.pid in seen and child not in seen


def record(**fields: int | float) -> bytes:
    values = {"pid": 1, "rank": 0, "dist_rank": -1, "dist_world": -1, "flags": 0, "step": 0, "since": 1.0}
    values.update(fields)
    return EVENT.pack(EVENT_MAGIC, *values.values())


def test_damaged_or_impossible_events_are_refused() -> None:
    plain = heard(9, record())
    assert plain is not None and (plain.rank, plain.joined, plain.inside, plain.step, plain.since) == (
        0,
        False,
        None,
        0,
        1.0,
    )
    ok = heard(9, record(flags=JOINED | INSIDE | 4 | EXITING | FAILED, dist_rank=2, dist_world=4, step=7))
    assert ok is not None and (ok.joined, ok.inside, ok.exiting, ok.failed, ok.dist_rank) == (True, True, True, True, 2)
    assert heard(9, record(since=float("nan"))) is None
    assert heard(9, record(since=-1.0)) is None
    assert heard(9, record(dist_rank=4, dist_world=4, flags=JOINED)) is None  # a rank outside its world
    assert heard(9, record(dist_world=0)) is None
    assert heard(9, b"GDX1" + record()[4:]) is None
    assert heard(9, record()[:-1]) is None


def test_the_job_in_a_recording_reads_back_equal_and_a_damaged_one_is_refused() -> None:
    procs = (
        JobProc(10, LAUNCHER, 100.0, world=4, nodes="2"),
        JobProc(
            11,
            RANK,
            101.0,
            rank=0,
            world=4,
            joined=True,
            step=3,
            inside=False,
            since=120.0,
            where="other",
            stack=("evaluate (train.py:9)", "main (train.py:20)"),
            at="evaluate (train.py:9)",
            trace_buffer=2000,
        ),
    )
    sample = Sample(130.0, (), job=procs)
    assert Sample.from_json(sample.to_json()) == sample
    bad = sample.to_json()
    bad["job"][1]["role"] = "boss"
    with pytest.raises(ValueError, match="unknown role"):
        Sample.from_json(bad)
    bad = sample.to_json()
    bad["job"][1]["stack"] = "evaluate"
    with pytest.raises(ValueError, match="stack"):
        Sample.from_json(bad)
    odd = sample.to_json()
    odd["job"][1]["where"] = "elsewhere"
    odd["job"][1]["step"] = -3
    odd["job"][1]["exit"] = "crashed\x1b[2J"  # only "normal" and "exception" are said at exit
    dropped: list[str] = []
    back = Sample.parse(odd, dropped)
    assert back.job is not None and back.job[1].where == "" and back.job[1].step is None and back.job[1].exit == ""
    assert len(dropped) == 3


def test_a_stack_line_cannot_reach_the_terminal_as_an_escape() -> None:
    p = JobProc(11, RANK, 1.0, stack=("f\x1b[2J (x.py:1)",), at="f\x1b[2J (x.py:1)")
    assert "\x1b" not in p.stack[0] and "\x1b" not in p.at


def test_what_a_rank_said_of_joining_outlasts_its_exit() -> None:
    """A rank stopped (Ctrl-C, torchrun's SIGTERM) while it waited to join says at exit that it is not in a
    process group; one that left after destroy_process_group says the same. Neither becomes unknown."""
    fresh = JobProc(11, RANK, 1.0, rank=1)  # as the process tree lists it: nothing said yet
    at_exit = Heard(11, 1, None, None, joined=False, inside=None, step=0, since=5.0, child=False, exiting=True)
    waiting = merged(fresh, at_exit, before=replace(fresh, joined=False))
    assert (waiting.joined, waiting.exit) == (False, "normal")
    left = merged(fresh, at_exit, before=replace(fresh, joined=True, dist_rank=1, dist_world=2))
    assert (left.joined, left.dist_rank) == (True, 1)
    assert merged(fresh, at_exit).joined is None  # never heard before its exit: it said nothing of joining
