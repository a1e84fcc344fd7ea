"""The followed command's standard error, passed through to ours as it comes, with a bounded tail kept:
the cause of a crash is in one rank's lines (gpudoctor/watch/crash.py reads them at the end).

torch prefixes what a rank prints once torch.distributed is set up with `[rankN]:` (torch >= 2.2), and
torchrun's own failure summary follows at the end; so the tail is kept twice: the last lines of each
rank (by prefix), and the last lines of all. Memory is bounded whatever the command prints: at most
MAX_LINES lines of MAX_LINE characters overall and per rank, for at most MAX_RANKS ranks.

The bytes are passed on unchanged (a terminal gets the colours and progress bars it would have got); the
tail keeps text with invalid UTF-8 replaced. If our standard error fails (a closed terminal), the command's
output is still read, so the command never blocks on a full pipe.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections import OrderedDict, deque

MAX_LINES = 400
MAX_LINE = 2000
MAX_RANKS = 1024
CHUNK = 65536
PREFIX = re.compile(r"^\[rank(\d+)\]:")


class StderrTail:
    """Reads `fd` (the read end of the command's stderr pipe) on a thread until its end."""

    def __init__(self, fd: int, out_fd: int | None = 2) -> None:
        self._fd = fd
        self._out = out_fd
        self._lock = threading.Lock()
        self._all: deque[str] = deque(maxlen=MAX_LINES)
        self._ranks: OrderedDict[int, deque[str]] = OrderedDict()
        self._partial = b""
        self._thread = threading.Thread(target=self._run, name="gpudoctor-stderr", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._fd, CHUNK)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                self._pass_on(chunk)
                self._keep(chunk)
        finally:
            if self._partial:
                self._line(self._partial)
                self._partial = b""
            with contextlib.suppress(OSError):
                os.close(self._fd)

    def _pass_on(self, chunk: bytes) -> None:
        if self._out is None:
            return
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self._out, view) :]
        except OSError:
            self._out = None  # our stderr is gone: keep reading so the command never blocks

    def _keep(self, chunk: bytes) -> None:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > 4 * MAX_LINE:  # a "line" that never ends (a progress bar with \r)
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            self._line(line)

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")[-MAX_LINE:]
        with self._lock:
            self._all.append(text)
            m = PREFIX.match(text)
            if m is None:
                return
            rank = int(m.group(1))
            lines = self._ranks.get(rank)
            if lines is None:
                if len(self._ranks) >= MAX_RANKS:
                    self._ranks.popitem(last=False)
                lines = self._ranks[rank] = deque(maxlen=MAX_LINES)
            rest = text[m.end() :]
            lines.append(rest[1:] if rest.startswith(" ") else rest)

    def wait(self, timeout: float = 2.0) -> None:
        """Wait until the command's stderr has ended (every writer closed it), at most `timeout`: a
        descendant that keeps it open must not hold gpudoctor up."""
        self._thread.join(timeout)

    def text(self) -> str:
        """The last lines of all, in order."""
        with self._lock:
            return "\n".join(self._all)

    def rank_text(self, rank: int) -> str:
        """The last lines rank `rank` printed (its `[rankN]:` prefix taken off)."""
        with self._lock:
            return "\n".join(self._ranks.get(rank, ()))
