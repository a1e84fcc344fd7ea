"""`gpudoctor watch -- COMMAND`: a real child, GPU readings from the synthetic (fake) source."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpudoctor.watch.follow import Job
from tests.helpers.processes import GPUDOCTOR, GpudoctorCli, clean_env, marked
from tests.paths import REPO

FAKE = clean_env(GPUDOCTOR_WATCH_FAKE="healthy:8", PYTHONUNBUFFERED="1")


def test_follow_returns_the_child_exit_code_and_ends_with_it(gpudoctor_cli: GpudoctorCli, tmp_path: Path) -> None:
    ended = tmp_path / "ended"  # the child's last moment, by its own clock
    r = gpudoctor_cli(
        "watch",
        "--no-tui",
        "--interval",
        "0.2",
        "--process-interval",
        "0.5",
        "--",
        sys.executable,
        "-c",
        f"import time, sys; time.sleep(1.5); open({str(ended)!r}, 'w').write(repr(time.time())); sys.exit(7)",
        env=FAKE,
    )
    after = time.time() - float(ended.read_text())
    assert r.returncode == 7, r.stderr
    # Ended when the child ended (seen at the next process poll), not at some deadline. Counted from the
    # child's end, so that start-up on a loaded host does not count.
    assert after < 10
    assert "command exit code: 7" in r.stdout and "util%" in r.stdout


def test_follow_shows_only_the_gpus_the_job_uses_json(gpudoctor_cli: GpudoctorCli) -> None:
    # the fake source puts the job's PIDs on its first GPU(s): here one process, so GPU 0
    r = gpudoctor_cli(
        "watch",
        "--no-tui",
        "--json",
        "--interval",
        "0.2",
        "--process-interval",
        "0.5",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(2)",
        env=FAKE,
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[-1]["kind"] == "summary" and lines[-1]["exit_code"] == 0
    assert [g["index"] for g in lines[-1]["gpus"]] == [0]
    later = [x for x in lines if x["kind"] == "sample"][-1]
    assert [g["index"] for g in later["gpus"]] == [0]


def test_interrupting_gpudoctor_stops_the_child_and_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    script = (
        "import os, subprocess, sys, time\n"
        f"kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pidfile)!r}, 'w').write(f'{{os.getpid()}} {{kid.pid}}')\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpudoctor",
            "watch",
            "--no-tui",
            "--interval",
            "0.2",
            "--",
            sys.executable,
            "-c",
            script,
        ],
        env=FAKE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert all(psutil.pid_exists(p) for p in pids)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "stopped the command" in err
    assert _all_gone(pids)


def _all_gone(pids: list[int], within_s: float = 10.0) -> bool:
    """Every one of `pids` ended (or is a zombie) within `within_s` (polled: a loaded host is slow to reap)."""

    def alive() -> list[int]:
        out = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.NoSuchProcess:
                pass
        return out

    deadline = time.monotonic() + within_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive() == []


def test_sigterm_stops_the_child_too() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpudoctor",
            "watch",
            "--no-tui",
            "--interval",
            "0.2",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(300)",
        ],
        env=FAKE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    kids: list[psutil.Process] = []
    while not kids and time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children(recursive=True)
        time.sleep(0.1)
    assert kids
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)


def test_duration_ends_watching() -> None:
    proc = subprocess.Popen(
        [*GPUDOCTOR, "watch", "--no-tui", "--interval", "0.2", "--duration", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=FAKE,
        cwd=REPO,
    )
    killer = threading.Timer(60, proc.kill)  # a --duration not kept: killed, and the code below fails
    killer.start()
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first sample: watching has begun (start-up is over)
        begun = time.monotonic()
        out = first + proc.stdout.read()
        after = time.monotonic() - begun
        assert proc.wait() == 0
    finally:
        killer.cancel()
        proc.kill()
        proc.wait()
    # 1 s of watching, counted from its first sample: start-up on a loaded host does not count.
    assert after < 10 and out.count("util%") >= 3


def test_no_driver_is_exit_3_unless_a_command_is_followed(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    env = clean_env()  # no fake GPUs
    r = gpudoctor_cli("watch", "--no-tui", "--duration", "1", env=env)
    if r.returncode == 0:  # a machine with a GPU: this test is about machines without one
        pytest.skip("this machine has a GPU")
    assert r.returncode == 3
    assert r.stderr.strip().startswith("gpudoctor: no NVIDIA driver") and len(r.stderr.strip().splitlines()) == 1
    # nothing to follow but GPUs
    r = gpudoctor_cli("watch", "--no-tui", "--pid", str(os.getpid()), "--duration", "1", env=env)
    assert r.returncode == 3
    r = gpudoctor_cli("watch", "--no-tui", "--pid", "99999999", env=env)  # hostile review L9: said as itself
    assert r.returncode == 2 and r.stderr.strip() == "gpudoctor: no process with PID 99999999"
    # A command is followed without a GPU: its training steps and the host (GPU rows absent, said once).
    marker = tmp_path / "ran"
    r = gpudoctor_cli(
        "watch", "--no-tui", "--interval", "0.3", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')", env=env
    )
    assert r.returncode == 0 and marker.exists()
    assert r.stderr.count("no GPU to watch (no NVIDIA driver") == 1
    assert "showing the job's training steps, processes and the host" in r.stderr
    assert "summary: no GPU," in r.stdout


def test_usage_errors(gpudoctor_cli: GpudoctorCli) -> None:
    r = gpudoctor_cli("watch", "--pid", "1", "--", "true", env=FAKE)
    assert r.returncode == 2 and "either --pid or a command" in r.stderr
    r = gpudoctor_cli("watch", "--no-tui", "--", "/nonexistent/command", env=FAKE)
    assert r.returncode == 2 and "command not found" in r.stderr
    r = gpudoctor_cli("watch", "--gpus", "a,b", env=FAKE)
    assert r.returncode == 2 and "--gpus" in r.stderr


class StallingSource:
    """Two readings, then NVML 'hangs' for 3 s, then one more reading and the end."""

    label = "stalling"
    interval = 0.1

    def __init__(self) -> None:
        from gpudoctor.watch.synthetic import synthetic_run

        self.samples = synthetic_run("healthy", 3)
        self.i = 0

    def open(self) -> None: ...

    def close(self) -> None: ...

    def next(self, stop):  # type: ignore[no-untyped-def]
        if self.i >= len(self.samples):
            return None
        if self.i == 2:
            stop.wait(3.0)
        self.i += 1
        return self.samples[self.i - 1]


def test_a_stalled_reading_is_reported_as_stale_and_watching_goes_on() -> None:
    import io

    from gpudoctor.watch.headless import run_headless
    from gpudoctor.watch.session import Session

    session = Session(StallingSource())  # type: ignore[arg-type]
    out = io.StringIO()
    session.start()
    try:
        assert run_headless(session, out) == "source"
    finally:
        session.close()
    lines = out.getvalue().splitlines()
    assert [("stale" in x) for x in lines] == [False, False, True, False]
    assert "no reading for 2 s" in lines[2] or "no reading for 3 s" in lines[2]


def _start_job_then(sig: signal.Signals, tmp_path: Path) -> tuple[int | None, list[psutil.Process]]:
    """`watch -- sh -c 'sleep 100; echo x'` (sleep is a grandchild), then `sig` to gpudoctor."""
    marker = f"{os.getpid()}-{sig.name}-{time.monotonic_ns()}"
    env = {**FAKE, "GPUDOCTOR_WATCH_FAKE": "healthy:4", "GD_TEST_MARKER": marker}
    started = tmp_path / "started"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpudoctor",
            "watch",
            "--no-tui",
            "--interval",
            "0.5",
            "--",
            "sh",
            "-c",
            f"touch {started}; sleep 100; echo x",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        deadline = time.monotonic() + 20  # `sleep 100` has started (polled: a loaded CI host is slow)
        while not any("sleep" in " ".join(p.cmdline()) for p in marked(marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any("sleep" in " ".join(p.cmdline()) for p in marked(marker))
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        left = marked(marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = marked(marker)
        return code, left
    finally:
        for p in marked(marker):  # never leave a stray sleep behind a failing test
            p.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigkill_to_gpudoctor_leaves_no_process_of_the_job(tmp_path: Path) -> None:
    # PDEATHSIG reaches only `sh`; the sentinel stops the whole group, `sleep 100` included, then exits
    code, left = _start_job_then(signal.SIGKILL, tmp_path)
    assert code == -signal.SIGKILL
    assert [p.cmdline() for p in left] == []


def test_sighup_stops_the_job_like_sigterm_and_exits_129(tmp_path: Path) -> None:
    code, left = _start_job_then(signal.SIGHUP, tmp_path)
    assert code == 129
    assert [p.cmdline() for p in left] == []


def test_the_sentinel_stops_only_the_jobs_group_and_then_exits(tmp_path: Path) -> None:
    from gpudoctor.watch.follow import Job

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)  # another group: never touched
    job = Job.start(["sh", "-c", "sleep 60; echo x"])
    try:
        sentinel = job._sentinel
        assert sentinel is not None and sentinel.poll() is None
        assert os.getpgid(sentinel.pid) != os.getpgid(job.root.pid)  # never in the group it stops
        os.close(job._sentinel_pipe)  # what gpudoctor dying looks like to the sentinel: EOF
        job._sentinel_pipe = None
        assert sentinel.wait(timeout=10) == 0
        deadline = time.monotonic() + 5
        while job._popen.poll() is None and time.monotonic() < deadline:  # the leader: our child
            time.sleep(0.05)
        assert job.poll() == 128 + signal.SIGTERM
        assert bystander.poll() is None
    finally:
        job.stop(grace_s=1)
        bystander.kill()
        bystander.wait()


def test_stopping_the_job_releases_the_sentinel_without_it_signalling(tmp_path: Path) -> None:
    from gpudoctor.watch.follow import Job

    job = Job.start([sys.executable, "-c", "import time; time.sleep(60)"])
    sentinel = job._sentinel
    assert sentinel is not None
    job.stop(grace_s=1)
    assert sentinel.poll() == 0 and job._sentinel is None  # reaped, not left behind


def _dashboard_then(stop: bytes | signal.Signals) -> tuple[int, bytes, list[psutil.Process]]:
    """`watch -- sleep 100` with the dashboard on a pty; once a GPU row is drawn, `stop` it (a key
    written to the terminal, or a signal to gpudoctor). Returns the exit code, the screen, what is left."""
    import fcntl
    import pty
    import struct
    import termios
    import threading

    marker = f"{os.getpid()}-tui-{time.monotonic_ns()}"
    env = {**FAKE, "GPUDOCTOR_WATCH_FAKE": "healthy:4", "GD_TEST_MARKER": marker, "TERM": "xterm-256color"}
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 42, 150, 0, 0))
    cmd = [sys.executable, "-m", "gpudoctor", "watch", "--interval", "0.5", "--", "sleep", "100"]
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    screen = bytearray()

    def drain() -> None:  # the terminal must be read, or the app blocks on a full pty
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            screen.extend(data)

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while b"H100" not in screen and time.monotonic() < deadline:  # a GPU row is drawn
            time.sleep(0.1)
        assert b"H100" in screen
        if isinstance(stop, bytes):
            os.write(master, stop)
        else:
            proc.send_signal(stop)
        code = proc.wait(timeout=30)
        deadline = time.monotonic() + 5
        while b"gpudoctor: " not in screen and time.monotonic() < deadline:
            time.sleep(0.05)
        return code, bytes(screen), marked(marker)
    finally:
        for p in marked(marker):
            p.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_ctrl_c_in_the_dashboard_stops_the_job_and_exits_130() -> None:
    code, screen, left = _dashboard_then(b"\x03")  # Ctrl-C: in raw mode a key, not a signal
    assert code == 130
    assert b"gpudoctor: interrupted; stopped the command" in screen and b"Traceback" not in screen
    assert left == []


def test_sighup_and_sigterm_end_the_dashboard_cleanly() -> None:
    for sig, expected, said in ((signal.SIGHUP, 129, b"hung up"), (signal.SIGTERM, 130, b"interrupted")):
        code, screen, left = _dashboard_then(sig)
        assert code == expected, screen[-2000:]
        assert b"gpudoctor: " + said + b"; stopped the command" in screen and b"Traceback" not in screen
        assert left == []


SETSID_JOB = (
    "import subprocess, sys, time\n"
    "kid = subprocess.Popen(['setsid', 'sleep', '300'])\n"  # a grandchild that leaves the process group
    "open(sys.argv[1], 'w').write(str(kid.pid))\n"
    "time.sleep(float(sys.argv[2]))\n"
)


def _setsid_job(tmp_path: Path, parent_s: float, then: str = "") -> tuple[subprocess.Popen[bytes], psutil.Process]:
    """`watch -- sh -c 'python job.py; THEN'` whose python starts `sleep 300` in a session of its own
    and runs on for `parent_s`; returns gpudoctor and that grandchild once it runs and gpudoctor has had
    time to see it (process readings)."""
    script = tmp_path / "job.py"
    script.write_text(SETSID_JOB)
    pidfile = tmp_path / "kid"
    cmd = [sys.executable, "-m", "gpudoctor", "watch", "--no-tui", "--interval", "0.2", "--process-interval", "0.5"]
    job = f"{sys.executable} {script} {pidfile} {parent_s}{then}"
    proc = subprocess.Popen(
        [*cmd, "--", "sh", "-c", job],
        env={**FAKE, "GPUDOCTOR_WATCH_FAKE": "healthy:2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    kid = psutil.Process(int(pidfile.read_text()))
    assert os.getsid(kid.pid) != os.getsid(proc.pid) and os.getpgid(kid.pid) != os.getpgid(proc.pid)
    time.sleep(1.5)  # a few process readings: gpudoctor has recorded it
    return proc, kid


def _gone(p: psutil.Process, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@contextlib.contextmanager
def _setsid(
    tmp_path: Path, parent_s: float, then: str = ""
) -> Iterator[tuple[subprocess.Popen[bytes], psutil.Process]]:
    """_setsid_job, and nothing of it left behind whatever the test finds."""
    proc, kid = _setsid_job(tmp_path, parent_s, then)
    try:
        yield proc, kid
    finally:
        with contextlib.suppress(psutil.Error):
            kid.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_setsid_grandchild_is_stopped_when_the_command_ends(tmp_path: Path) -> None:
    with _setsid(tmp_path, parent_s=2.5) as (proc, kid):  # the command ends by itself, its grandchild runs on
        assert proc.wait(timeout=30) == 0
        assert _gone(kid), "the setsid grandchild outlived gpudoctor"


def test_a_setsid_grandchild_is_stopped_on_interrupt_even_after_its_parent_left(tmp_path: Path) -> None:
    with _setsid(tmp_path, parent_s=0.0, then="; sleep 300") as (proc, kid):  # its parent exits at once
        assert kid.ppid() == proc.pid  # an orphan re-parented to gpudoctor (child subreaper), not to init
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert _gone(kid), "the setsid grandchild outlived gpudoctor"


def test_the_sentinel_stops_a_setsid_grandchild_when_gpudoctor_is_killed(tmp_path: Path) -> None:
    with _setsid(tmp_path, parent_s=300) as (proc, kid):
        channel = psutil.Process(kid.ppid()).environ()["GPUDOCTOR_STEPS"]  # what the job was given
        assert os.path.isdir(channel)
        proc.kill()  # no chance to clean up: the sentinel does, from the descendants it was told about
        proc.wait(timeout=10)
        assert _gone(kid), "the setsid grandchild outlived gpudoctor"
        deadline = time.monotonic() + 10
        while os.path.exists(channel) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(channel)  # and the step channel's directory is not left behind


DETACH_JOB = (
    "import subprocess, sys, time\n"
    "kid = subprocess.Popen(['setsid', 'sleep', '300'])\n"  # leaves the job's group and session at once
    "open(sys.argv[1], 'w').write(str(kid.pid))\n"
    "time.sleep(300)\n"
)


def test_the_sentinel_stops_a_descendant_that_detached_just_before_gpudoctor_was_killed(tmp_path: Path) -> None:
    """Killed within a moment of the detach, gpudoctor never read the processes again to tell the
    sentinel: the sentinel finds the grandchild by the job's mark in its environment."""
    script, pidfile = tmp_path / "job.py", tmp_path / "kid"
    script.write_text(DETACH_JOB)
    cmd = [sys.executable, "-m", "gpudoctor", "watch", "--no-tui", "--interval", "60", "--process-interval", "60"]
    proc = subprocess.Popen(
        [*cmd, "--", sys.executable, str(script), str(pidfile)],
        env={**FAKE, "GPUDOCTOR_WATCH_FAKE": "healthy:2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    kid = None
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        kid = psutil.Process(int(pidfile.read_text()))
        assert os.getsid(kid.pid) != os.getsid(proc.pid)
        proc.kill()  # before any process reading could see the grandchild
        proc.wait(timeout=10)
        assert _gone(kid), "the grandchild that detached outlived gpudoctor"
    finally:
        if kid is not None:
            with contextlib.suppress(psutil.Error):
                kid.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_terminal_that_goes_away_ends_the_dashboard_and_the_job() -> None:
    """The SSH session or the tmux pane closes: writes to the terminal fail, then SIGHUP arrives.
    Textual's writer thread dies on the first failed write and the app used to block for good on its
    full output queue (Textualize/textual#6692), leaving gpudoctor and the job running."""
    import fcntl
    import pty
    import struct
    import termios

    marker = f"{os.getpid()}-gone-{time.monotonic_ns()}"
    env = {**FAKE, "GPUDOCTOR_WATCH_FAKE": "healthy:4", "GD_TEST_MARKER": marker, "TERM": "xterm-256color"}
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    cmd = [sys.executable, "-m", "gpudoctor", "watch", "--interval", "0.1", "--", "sleep", "100"]
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    try:
        seen = b""
        deadline = time.monotonic() + 30
        while b"/80G" not in seen and time.monotonic() < deadline:  # a GPU row is drawn
            seen = (seen + os.read(master, 65536))[-8192:]
        assert b"/80G" in seen
        os.close(master)  # the terminal is gone: every write now fails
        master = -1
        time.sleep(4)  # ~40 frames at 0.1 s: more than Textual's 30 queued writes
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=20) == 129
        deadline = time.monotonic() + 10
        while marked(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p.cmdline() for p in marked(marker)] == []
    finally:
        for p in marked(marker):
            p.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if master >= 0:
            os.close(master)


def test_a_recording_of_made_up_readings_says_so_and_a_bad_fake_count_is_a_usage_error(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    rec = tmp_path / "fake.jsonl"
    r = gpudoctor_cli(
        "watch",
        "--no-tui",
        "--interval",
        "0.2",
        "--duration",
        "1",
        "--record",
        str(rec),
        env={**FAKE, "GPUDOCTOR_WATCH_FAKE": "straggler:2"},
    )
    assert r.returncode == 0, r.stderr
    header = json.loads(rec.read_text().splitlines()[0])
    assert header["source"] == "synthetic:straggler"
    report = gpudoctor_cli("report", str(rec))
    assert report.returncode == 0 and "synthetic:straggler: made-up readings" in report.stdout.splitlines()[0]
    r = gpudoctor_cli("watch", "--no-tui", "--duration", "1", env={**FAKE, "GPUDOCTOR_WATCH_FAKE": "straggler:xx"})
    assert r.returncode == 2 and "GPUDOCTOR_WATCH_FAKE: 'xx' is not a GPU count" in r.stderr
    assert "internal error" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


class _Unidentified:
    """A descendant whose start time psutil could not read: a signal could reach a reused PID."""

    pid = 2**22 + 777

    def create_time(self) -> float:
        raise psutil.AccessDenied(self.pid)

    def is_running(self) -> bool:
        return True


def test_stopping_a_job_never_signals_a_descendant_whose_start_time_is_unknown() -> None:
    job = Job.start([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        job._known[_Unidentified.pid] = _Unidentified()  # type: ignore[assignment]
        assert all(p.pid != _Unidentified.pid for p in job._strays())
    finally:
        job.stop(grace_s=1.0)
    assert job.poll() is not None
