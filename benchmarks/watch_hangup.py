"""How long `gpudoctor watch` takes to end once its terminal goes away, or on SIGHUP/SIGTERM.

    .venv/bin/python benchmarks/watch_hangup.py [--runs 3]

Target (issue 9 / the hang-up brief): under 2 s from the event to the exit, dashboard and headless.
Each case runs the real `gpudoctor watch --demo straggler` on a fresh 80x24 pseudo-terminal (its output
read and thrown away, as a terminal would), waits until it draws, then makes the event and times the
exit with the exit code. "terminal closes" is the pty's master side closing (what sshd or tmux do):
once with gpudoctor as the terminal's session leader (the kernel's SIGHUP reaches it), once with the
terminal only as its standard streams (no SIGHUP comes: gpudoctor notices the hang-up itself).
"stalled" is a terminal nobody reads any more (it fills, output blocks) and then SIGTERM. The floor,
measured in the same run: a bare `python -c "import time; time.sleep(60)"` on the same kind of pty
ending on its default SIGHUP action (what the timing itself costs). Median of --runs.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import signal
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time

TARGET_S = 2.0
DEMO = ["-m", "gpudoctor", "watch", "--demo", "straggler", "--gpus", "8"]


def _take_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def one(args: list[str], event: str, ctty: bool = False, ready: bytes = b"GPUs") -> tuple[float, int | None]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
        preexec_fn=_take_terminal if ctty else None,  # noqa: PLW1509
    )
    os.close(slave)
    seen = bytearray()
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            if select.select([master], [], [], 0.05)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    return
                if not data:
                    return
                seen.extend(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while ready not in seen and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    if not ready:
        time.sleep(0.5)
    try:
        if event in ("close", "stalled"):
            stop.set()
            reader.join()
        if event == "stalled":
            time.sleep(3)  # it fills
        start = time.monotonic()
        if event == "close":
            os.close(master)
            master = -1
        else:
            proc.send_signal(signal.SIGTERM if event in ("SIGTERM", "stalled") else signal.SIGHUP)
        try:
            code: int | None = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        return time.monotonic() - start, code
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if master >= 0:
            os.close(master)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    floor = statistics.median(
        one(["-c", "import time; time.sleep(60)"], "close", ctty=True, ready=b"")[0] for _ in range(runs)
    )
    print(f"floor (a sleeping python, terminal closes, its default SIGHUP): {floor:.3f} s")
    cases = [
        ("dashboard, terminal closes, no SIGHUP comes", DEMO, "close", False),
        ("dashboard, terminal closes, gpudoctor leads it", DEMO, "close", True),
        ("headless, terminal closes, no SIGHUP comes", [*DEMO, "--no-tui"], "close", False),
        ("dashboard, SIGHUP", DEMO, "SIGHUP", False),
        ("dashboard, SIGTERM", DEMO, "SIGTERM", False),
        ("headless, SIGTERM", [*DEMO, "--no-tui"], "SIGTERM", False),
        ("dashboard, terminal nobody reads, SIGTERM", DEMO, "stalled", False),
    ]
    for name, args, event, ctty in cases:
        results = [one(args, event, ctty, b"GPUs" if "--no-tui" not in args else b"util%") for _ in range(runs)]
        took = statistics.median(t for t, _ in results)
        codes = sorted({str(c) for _, c in results})
        verdict = "ok" if took < TARGET_S else "OVER"
        print(f"{name:48s} {took:6.3f} s  exit {','.join(codes):8s} ({verdict}: target < {TARGET_S:g} s)")


if __name__ == "__main__":
    main()
