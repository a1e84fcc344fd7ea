"""A watcher's channel that the test reads itself: a private directory with the socket `gpudoctor.step()`
sends to (GPUDOCTOR_STEPS), bound by the test, so what a job sends is seen as sent, and not read until the
test reads it (a watcher that is behind)."""

from __future__ import annotations

import socket
from pathlib import Path

from gpudoctor.training_step import SOCKET_NAME


def raw_channel(tmp_path: Path) -> tuple[Path, socket.socket]:
    """The channel's directory (mode 0700) and its bound datagram socket; the caller closes the socket."""
    directory = tmp_path / "channel"
    directory.mkdir(mode=0o700)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(directory / SOCKET_NAME))
    return directory, sock
