"""`watch` ends when its terminal goes away, on SIGHUP and on SIGTERM: dashboard and headless alike.

Each test runs the real `gpudoctor watch` on a real pseudo-terminal. "The terminal goes away" is the
master side closing (what sshd or tmux do): the kernel hangs the terminal up, and sends SIGHUP only
to the session leader of a terminal it controls. So the tests start gpudoctor either as that leader
(`ctty=True`: the kernel's SIGHUP reaches it, as when tmux runs it directly) or with the terminal as
its standard streams only (`ctty=False`: no SIGHUP comes, as when a wrapper or a shell that does not
pass it on sits between the terminal and gpudoctor; the dashboard used to spin there forever).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers.processes import marked

DEADLINE_S = 15.0  # generous: the bar is 2 s on an idle machine, this is a shared one
DEMO = ["watch", "--demo", "straggler", "--gpus", "4", "--speed", "4"]
ENV = {**os.environ, "TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"}
ENV.pop("COLUMNS", None)
ENV.pop("LINES", None)


def _take_terminal() -> None:  # in the child, after setsid: make stdin's pty the controlling terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _ignore_sighup() -> None:  # in the child: what `nohup` does
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


class OnPty:
    """gpudoctor with stdin and stderr on a fresh 80x24 pty (stdout too, unless `stdout` is given),
    its output drained on a thread (a full pty would block it) and kept in `seen`."""

    def __init__(
        self,
        args: list[str],
        *,
        ctty: bool = False,
        stdout: int | None = None,
        nohup: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.seen = bytearray()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpudoctor", *args],
            stdin=slave,
            stdout=slave if stdout is None else stdout,
            stderr=slave,
            env={**ENV, **(env or {})},
            start_new_session=True,
            preexec_fn=_take_terminal if ctty else _ignore_sighup if nohup else None,  # noqa: PLW1509
        )
        os.close(slave)
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        # Never blocked in read(): a close() from another thread would wait for that read to return, and
        # the terminal would not go away.
        while not self._closing.is_set():
            if not select.select([self.master], [], [], 0.05)[0]:
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.seen.extend(data)

    def wait_for(self, text: bytes, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        assert text in self.seen, f"never showed {text!r}; exit {self.proc.poll()}; output:\n{self.seen[-2000:]!r}"

    def stall(self) -> None:
        """Stop reading the terminal (an SSH connection that stalls), and wait until it is full: gpudoctor's
        output then blocks."""
        self._closing.set()
        self._reader.join()
        pending, since = -1, time.monotonic()
        deadline = since + 60
        while time.monotonic() < deadline and time.monotonic() - since < 1.5:
            now = struct.unpack("i", fcntl.ioctl(self.master, termios.FIONREAD, b"\0" * 4))[0]
            if now != pending:
                pending, since = now, time.monotonic()
            time.sleep(0.1)
        assert self.proc.poll() is None

    def hang_up(self) -> None:
        """The terminal goes away: its master side closes (the kernel hangs up the other side)."""
        self._closing.set()
        self._reader.join()
        os.close(self.master)
        self.master = -1

    def ended_within(self, seconds: float = DEADLINE_S) -> tuple[int, float]:
        """The exit code and how long it took from now; fails if gpudoctor still runs after `seconds`."""
        start = time.monotonic()
        try:
            code = self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"gpudoctor still runs {seconds} s later (output:\n{self.seen[-2000:]!r})") from None
        return code, time.monotonic() - start

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.master >= 0:
            self._closing.set()
            self._reader.join()
            os.close(self.master)


@contextlib.contextmanager
def on_pty(args: list[str], **kw: object) -> Iterator[OnPty]:
    t = OnPty(args, **kw)  # type: ignore[arg-type]
    try:
        yield t
    finally:
        t.close()


def _none_left(marker: str, within: float = 10.0) -> list[list[str]]:
    deadline = time.monotonic() + within
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = []
    for p in marked(marker):
        with contextlib.suppress(psutil.Error):
            left.append(p.cmdline())
            p.kill()
    return left


# -- the terminal goes away --------------------------------------------------------------------------


@pytest.mark.parametrize("ctty", [False, True], ids=["no-sighup-comes", "controlling-terminal"])
def test_the_dashboard_ends_129_when_its_terminal_goes_away(ctty: bool) -> None:
    with on_pty(DEMO, ctty=ctty) as t:
        t.wait_for(b"GPUs")  # the dashboard is up
        t.hang_up()
        code, took = t.ended_within()
        assert code == 129, t.seen[-2000:]
        assert took < DEADLINE_S


def test_headless_ends_129_when_its_terminal_goes_away_even_with_stdout_elsewhere(tmp_path: Path) -> None:
    out = tmp_path / "lines"
    with out.open("wb") as stdout, on_pty([*DEMO, "--no-tui"], stdout=stdout.fileno()) as t:
        deadline = time.monotonic() + 60
        while b"util%" not in out.read_bytes() and time.monotonic() < deadline:  # it prints its lines
            time.sleep(0.05)
        t.hang_up()  # stdin and stderr were the terminal; no SIGHUP comes
        code, _ = t.ended_within()
    assert code == 129
    assert b"balance" in out.read_bytes()  # the summary still reaches the file: nothing is lost


def test_nohup_keeps_headless_watching_after_the_terminal_goes_away(tmp_path: Path) -> None:
    out = tmp_path / "lines"
    with (
        out.open("wb") as stdout,
        on_pty([*DEMO, "--no-tui", "--duration", "4"], stdout=stdout.fileno(), nohup=True) as t,
    ):
        deadline = time.monotonic() + 60
        while b"util%" not in out.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        t.hang_up()
        t.proc.send_signal(signal.SIGHUP)  # what a shell passes on to its jobs as it exits: still ignored
        code, _ = t.ended_within(60)
    assert code == 0  # watched for its whole --duration: the user asked to outlive the terminal
    assert b"balance" in out.read_bytes()


def test_a_followed_command_gets_the_hang_up_and_nothing_outlives_gpudoctor(tmp_path: Path) -> None:
    """The command runs in a session of its own (so that gpudoctor can stop all of it), out of reach of
    the terminal's SIGHUP: gpudoctor passes the hang-up on, as a shell passes it on to its jobs."""
    marker = f"{os.getpid()}-hup-{time.monotonic_ns()}"
    said = tmp_path / "said"
    job = f"trap 'echo HUP > {said}; exit 0' HUP; trap 'echo TERM > {said}; exit 0' TERM; sleep 300 & wait"
    env = {"GPUDOCTOR_WATCH_FAKE": "healthy:2", "GD_TEST_MARKER": marker}
    args = ["watch", "--interval", "0.2", "--", "sh", "-c", job]
    try:
        with on_pty(args, env=env) as t:
            t.wait_for(b"GPUs")
            t.hang_up()
            code, _ = t.ended_within()
        assert code == 129
        assert said.read_text().strip() == "HUP"
        assert _none_left(marker) == []  # `sleep 300`, the shell and the sentinel are all gone
    finally:
        for p in marked(marker):
            p.kill()


# -- SIGHUP and SIGTERM ------------------------------------------------------------------------------


@pytest.mark.parametrize("tui", [True, False], ids=["dashboard", "headless"])
@pytest.mark.parametrize(
    ("sig", "expected"),
    [(signal.SIGHUP, 129), (signal.SIGTERM, 130), (signal.SIGINT, 130)],
    ids=["SIGHUP", "SIGTERM", "SIGINT"],
)
def test_a_stop_signal_ends_watch_promptly(tui: bool, sig: signal.Signals, expected: int) -> None:
    with on_pty(DEMO if tui else [*DEMO, "--no-tui"]) as t:
        t.wait_for(b"GPUs" if tui else b"util%")
        t.proc.send_signal(sig)
        code, took = t.ended_within()
        assert code == expected, t.seen[-2000:]
        assert b"Traceback" not in t.seen
        assert took < DEADLINE_S


@pytest.mark.parametrize("tui", [True, False], ids=["dashboard", "headless"])
@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGHUP, 129), (signal.SIGTERM, 130)], ids=["SIGHUP", "SIGTERM"])
def test_a_stop_signal_ends_watch_even_when_nobody_reads_its_terminal(
    tui: bool, sig: signal.Signals, expected: int
) -> None:
    """A terminal nobody reads fills up and blocks gpudoctor's output: the dashboard's event loop used
    to block with it and never act on SIGTERM. The summary that cannot be written is given up."""
    fast = ["watch", "--demo", "straggler", "--gpus", "32", "--speed", "20"]  # output fills the terminal fast
    with on_pty(fast if tui else [*fast, "--no-tui"]) as t:
        t.wait_for(b"GPUs" if tui else b"util%")
        t.stall()
        t.proc.send_signal(sig)
        code, took = t.ended_within()
        assert code == expected
        assert took < DEADLINE_S


def test_a_stop_signal_while_the_dashboard_starts_still_ends_it() -> None:
    """SIGTERM before the dashboard's event loop takes the signals over (gpudoctor's own handler
    then raises inside Textual's start-up) still ends watch: no hang, 130."""
    for delay in (0.6, 1.0, 1.4):
        with on_pty(DEMO) as t:
            time.sleep(delay)
            t.proc.send_signal(signal.SIGTERM)
            code, _ = t.ended_within()
            assert code == 130, (delay, t.seen[-2000:])


def test_the_dashboards_output_waits_for_a_slow_terminal_until_told_to_stop() -> None:
    """While watching, output waits for the terminal (no frame is cut); once stopping, a terminal that
    takes nothing is given up. The terminal's own file description stays blocking: it is shared with
    the shell and the followed command."""
    from gpudoctor.watch.terminal import STALL_S, TerminalOutput

    master, slave = pty.openpty()
    stream = os.fdopen(slave, "w", encoding="utf-8")
    try:
        out = TerminalOutput(stream)
        writer = threading.Thread(target=out.write, args=("x" * 1_000_000,), daemon=True)  # more than a pty holds
        writer.start()
        writer.join(1.0)
        assert writer.is_alive() and not out.gone  # waits for a terminal that is slow to read
        out.stopping = True
        writer.join(STALL_S + 5)
        assert not writer.is_alive() and out.gone
        assert not fcntl.fcntl(slave, fcntl.F_GETFL) & os.O_NONBLOCK
        out.write("more")  # dropped, not raised
        out.close()
    finally:
        stream.close()
        os.close(master)


# -- a reader that stops reading ---------------------------------------------------------------------


@pytest.mark.parametrize("json_lines", [False, True], ids=["text", "json"])
def test_headless_output_into_a_closed_pipe_ends_quietly(json_lines: bool) -> None:
    """`watch --no-tui | head -1`: the reader leaves; watch ends at its next line, with no traceback."""
    args = [sys.executable, "-m", "gpudoctor", *DEMO, "--no-tui", *(["--json"] if json_lines else [])]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    try:
        assert proc.stdout is not None and proc.stdout.readline()
        proc.stdout.close()  # what `head -1` does once it has its line
        code = proc.wait(timeout=DEADLINE_S)
        err = proc.stderr.read() if proc.stderr else b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0
    # Quietly: no traceback, no broken-pipe message; only the note that a demo without a terminal ends.
    assert [line for line in err.decode().splitlines() if "--demo without a terminal ends after" not in line] == []


# -- tmux --------------------------------------------------------------------------------------------

WRAPPER = """\
import signal, subprocess, sys
signal.signal(signal.SIGHUP, lambda *a: None)  # outlives the pane without passing SIGHUP on
p = subprocess.Popen(sys.argv[2:])
open(sys.argv[1] + ".pid", "w").write(str(p.pid))
code = p.wait()
open(sys.argv[1], "w").write(str(code))
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.parametrize("wrapped", [False, True], ids=["pane-runs-gpudoctor", "through-a-wrapper"])
def test_killing_the_tmux_server_ends_watch(tmp_path: Path, wrapped: bool) -> None:
    socket = f"gd-test-{os.getpid()}-{time.monotonic_ns()}"  # a server of its own: never the user's
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    report = tmp_path / "code"
    gpudoctor = [sys.executable, "-m", "gpudoctor", *DEMO]
    if wrapped:
        cmd = [sys.executable, str(wrapper), str(report), *gpudoctor]
    else:  # the pane's process writes its pid, then becomes gpudoctor
        cmd = ["sh", "-c", f'echo $$ > {report}.pid; exec "$@"', "sh", *gpudoctor]
    env = {**ENV, "TMUX": ""}
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "80", "-y", "24", " ".join(map(_quote, cmd))], env=env, check=True
    )
    try:
        pid_file = Path(f"{report}.pid")
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        watch = psutil.Process(int(pid_file.read_text()))
        while "GPUs" not in _pane(tmux) and time.monotonic() < deadline:  # the dashboard is drawn
            time.sleep(0.1)
        assert "GPUs" in _pane(tmux)
        subprocess.run([*tmux, "kill-server"], check=False)
        gone, _ = psutil.wait_procs([watch], timeout=DEADLINE_S)
        assert gone, "gpudoctor outlived its tmux server"
        if wrapped:  # the wrapper stayed to tell how gpudoctor ended
            deadline = time.monotonic() + 10
            while not (report.exists() and report.read_text()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert report.read_text() == "129"
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, stderr=subprocess.DEVNULL)
        with contextlib.suppress(Exception):
            psutil.Process(int(Path(f"{report}.pid").read_text())).kill()


def _pane(tmux: list[str]) -> str:
    r = subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True, check=False)
    return r.stdout


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
