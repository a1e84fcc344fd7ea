"""Run the real `gpudoctor` in a pseudo-terminal of a given size and read its screen (pyte emulates the
terminal: what a user would see), for the dashboard tests."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable

import pyte


class Terminal:
    def __init__(self, args: list[str], cols: int, rows: int, env: dict[str, str] | None = None) -> None:
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        full_env = {**os.environ, "TERM": "xterm-256color", **(env or {})}
        full_env.pop("COLUMNS", None)
        full_env.pop("LINES", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpudoctor", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=full_env,
            start_new_session=True,
        )
        os.close(slave)

    def pump(self, seconds: float = 0.05) -> None:
        """Read what the program wrote (for up to `seconds`) into the emulated screen."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            ready, _, _ = select.select([self.master], [], [], max(0.0, left))
            if not ready:
                return
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.raw.extend(data)
            self.stream.feed(data)

    @property
    def text(self) -> str:
        return "\n".join(self.screen.display)

    def wait_for(self, cond: Callable[[str], bool], timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.1)
            if cond(self.text):
                self.pump(0.3)  # let the frame finish drawing
                return self.text
        raise AssertionError(f"screen never showed what was expected; it shows:\n{self.text}")

    def press(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def finish(self, timeout: float = 30.0) -> tuple[int, bytes]:
        """Wait for the program to end (draining the terminal); its exit code and everything it wrote."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.pump(0.1)
        self.pump(0.3)
        code = self.proc.wait(timeout=5)
        return code, bytes(self.raw)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
