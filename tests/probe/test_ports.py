"""The port probe names the process holding a port, on one line."""

from __future__ import annotations

import subprocess
import sys

from gpudoctor.probe.ports import check_port

LISTENER = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


def test_a_busy_port_names_its_holder_on_one_line() -> None:
    argv = [sys.executable, "-c", LISTENER, "--epochs", "3", "--config", "conf/train.yaml"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        status = check_port("127.0.0.1", port)
        assert not status.free and status.resolves
        assert status.holder_pid == proc.pid
        assert status.holder_command is not None
        assert "\n" not in status.holder_command
        # The code given to -c spans lines; what the allow-list does not know is a placeholder.
        assert status.holder_command.startswith(f"{sys.executable} -c [redacted] ")
        assert status.holder_command.endswith(" --epochs 3 --config [redacted]/train.yaml")
    finally:
        proc.kill()
        proc.wait()


def test_a_free_port_and_an_unresolvable_host() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert check_port("127.0.0.1", port).free
    bad = check_port("no-such-host.invalid", port)
    assert not bad.resolves and not bad.free
