"""gpudoctor's own CPU use while watching an 8-GPU replay at 1 s, headless and with the dashboard.

    .venv/bin/python benchmarks/watch_cpu.py [--seconds 25] [--warmup 3]

Targets (issue 4): at most 1% of one core headless, at most 5% with the dashboard, and the
first frame within 1 s of start. The dashboard runs under a pseudo-terminal (150x42), so it
is the real Textual driver writing real escape codes. CPU time is the process's user+system
time between the end of the warm-up and the end of the measurement, via psutil.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

import psutil

from gpudoctor.watch.recording import RecordWriter
from gpudoctor.watch.synthetic import synthetic_run


def make_recording(path: Path, seconds: int) -> None:
    writer = RecordWriter(str(path), {"interval": 1.0})
    for s in synthetic_run("straggler", seconds, seed=3):
        writer.write(s)
    writer.close()


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def measure(pid: int, warmup: float, seconds: float) -> float:
    proc = psutil.Process(pid)
    time.sleep(warmup)
    before = cpu_seconds(proc)
    time.sleep(seconds)
    return 100.0 * (cpu_seconds(proc) - before) / seconds


def headless(rec: Path, warmup: float, seconds: float) -> float:
    cmd = [sys.executable, "-m", "gpudoctor", "watch", "--replay", str(rec), "--no-tui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return measure(proc.pid, warmup, seconds)
    finally:
        proc.terminate()
        proc.wait(10)


def dashboard(rec: Path, warmup: float, seconds: float) -> tuple[float, float | None]:
    cmd = [sys.executable, "-m", "gpudoctor", "watch", "--replay", str(rec)]
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 42, 150, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "150", "LINES": "42"}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    first_frame: list[float] = []

    def drain() -> None:  # the terminal must be read, or the app blocks on a full pty
        seen = b""
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            if not first_frame:
                seen = (seen + data)[-4096:]
                if b"H100" in seen:  # a GPU row is on screen
                    first_frame.append(time.monotonic() - start)

    threading.Thread(target=drain, daemon=True).start()
    try:
        cpu = measure(proc.pid, warmup, seconds)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.close(master)
    return cpu, (first_frame[0] if first_frame else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rec = Path(tmp) / "straggler-8gpu.jsonl"
        make_recording(rec, int(args.warmup + args.seconds + 30))
        h = headless(rec, args.warmup, args.seconds)
        d, first = dashboard(rec, args.warmup, args.seconds)
    print(f"8-GPU replay at 1 s, measured over {args.seconds:.0f} s after {args.warmup:.0f} s warm-up")
    print(f"headless (--no-tui): {h:.2f}% of one core (target <= 1%)")
    print(f"dashboard (pty 150x42): {d:.2f}% of one core (target <= 5%)")
    print(f"first frame: {first:.2f} s after start (target <= 1 s)" if first is not None else "first frame: not seen")
    ok = h <= 1.0 and d <= 5.0 and first is not None and first <= 1.0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
