"""Is a TCP port free, and if not, which process holds it? (MASTER_PORT, rendezvous)."""

from __future__ import annotations

import errno
import socket

from gpudoctor.probe.environment import shown_value
from gpudoctor.probe.processes import command_line
from gpudoctor.snapshot import PortStatus

TORCHRUN_DEFAULT_PORT = 29500


def port_holder(port: int) -> tuple[int | None, str | None]:
    """The PID and command line of the process listening on `port`, where we may see it."""
    try:
        import psutil  # lazy: only needed when a port is busy

        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                try:
                    proc = psutil.Process(conn.pid)
                    return conn.pid, command_line(proc.cmdline()) or proc.name()
                except (psutil.Error, OSError):
                    return conn.pid, None
    except Exception:  # noqa: BLE001  (psutil may be denied /proc/net: the holder stays unknown)
        pass
    return None, None


def check_port(host: str, port: int) -> PortStatus:
    """Try to bind host:port the way a c10d store would; never raises.

    The status names the host as MASTER_ADDR's grammar shows it (a host; anything else, such as
    `user:password@10.0.0.1`, is `[redacted]`): it goes into snapshots and GD221/GD222 messages.
    """
    shown = str(shown_value("MASTER_ADDR", host))
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError):
        return PortStatus(host=shown, port=port, free=False, resolves=False)
    family, _, _, _, addr = infos[0]
    local = family in (socket.AF_INET, socket.AF_INET6) and _is_local(addr[0])
    bind_addr = addr if local else ("", port)
    sock = socket.socket(family if local else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(bind_addr if local else ("0.0.0.0", port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            pid, cmd = port_holder(port)
            return PortStatus(host=shown, port=port, free=False, holder_pid=pid, holder_command=cmd)
        # Not an address of this machine (another node's MASTER_ADDR): we cannot judge it.
        return PortStatus(host=shown, port=port, free=True)
    finally:
        sock.close()
    return PortStatus(host=shown, port=port, free=True)


def _is_local(ip: str) -> bool:
    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False
