"""The static rendezvous-port check: a busy port names its holder; MASTER_ADDR must resolve."""

from __future__ import annotations

import os
import socket

from gpudoctor.checks.launch_port import launch_port
from gpudoctor.engine import CheckContext
from gpudoctor.findings import Status
from gpudoctor.probe.ports import check_port
from gpudoctor.snapshot import Host, Missing, PortStatus, Snapshot


def run(status: PortStatus | Missing, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    s = Snapshot(1, "2026-01-01T00:00:00+00:00", [], host=Host(master_port=status), env=env or {})
    (finding,) = launch_port(CheckContext(s))
    return finding


def test_a_busy_master_port_fails_and_names_the_holder() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        status = check_port("127.0.0.1", port)
    f = run(status, {"MASTER_PORT": str(port)})
    assert f.code == "GD221" and f.status is Status.FAIL
    assert f"PID {os.getpid()}" in f.message
    assert f.evidence["holder_pid"] == os.getpid()


def test_busy_default_port_only_warns() -> None:
    f = run(PortStatus("127.0.0.1", 29500, free=False, holder_pid=42, holder_command="python train.py"))
    assert f.status is Status.WARN and "torchrun's default port" in f.message and "python train.py" in f.message


def test_under_torchrun_the_launchers_store_holding_the_port_is_expected() -> None:
    env = {"MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    f = run(PortStatus("127.0.0.1", 29500, free=False, holder_pid=42, holder_command="torchrun"), env)
    assert f.status is Status.PASS


def test_unresolvable_master_addr_fails() -> None:
    f = run(check_port("no-such-host.invalid", 29500), {"MASTER_ADDR": "no-such-host.invalid"})
    assert f.code == "GD222" and f.status is Status.FAIL


def test_invalid_master_port_fails() -> None:
    f = run(Missing("error", "MASTER_PORT is not a port number: 'abc'"), {"MASTER_PORT": "abc"})
    assert f.code == "GD223" and f.status is Status.FAIL


def test_free_port_passes() -> None:
    assert run(PortStatus("127.0.0.1", 29500, free=True)).status is Status.PASS
