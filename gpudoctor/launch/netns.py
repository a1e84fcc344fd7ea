"""A private network namespace for one node's CPU ranks: their gloo sockets out of other users' reach.

gloo's pair sockets listen on loopback, and /proc/net/tcp shows every listener with its owner's
uid and port, so another local user can connect to a rank's listener before its peer does and send
the frame a peer would: the run fails (NOT READY) and the findings blame healthy ranks (issue 24;
in a Slurm prolog, that drains nodes at will). Where the kernel lets this user make a user
namespace (unprivileged user namespaces: `kernel.unprivileged_userns_clone`,
`user.max_user_namespaces`, Ubuntu's `kernel.apparmor_restrict_unprivileged_userns`, a container's
seccomp profile), the ranks share a new network namespace with only its own loopback, up: no
process outside can reach their sockets, nor see them in /proc/net/tcp (user_namespaces(7),
network_namespaces(7); tests/reference/netns-isolation.md).

How: a holder process (this file run as `hold`) calls unshare(CLONE_NEWUSER | CLONE_NEWNET), maps
the caller's uid and gid to themselves, brings `lo` up, prints `ready` and waits for its standard
input to end, which happens when gpudoctor closes it or dies (no process outlives gpudoctor). Each
rank starts as `join HOLDER_PID -- COMMAND`: setns() into the holder's user then network namespace,
then exec of the rank's command (same PID, single-threaded, no preexec_fn). Where any step fails,
the ranks run in the machine's namespace as before, and the launch says why (`Isolation.note`):
the findings then say that a failure may be interference (launch/results.py).

Run as a script it imports only the standard library.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
READY_TIMEOUT_S = 10.0


def _libc():  # type: ignore[no-untyped-def]
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _failed(what: str) -> str:
    import ctypes

    return f"{what}: {os.strerror(ctypes.get_errno())}"


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def _loopback_up() -> None:
    """`ip link set lo up`, by the two ioctls it makes (netdevice(7): SIOCGIFFLAGS, SIOCSIFFLAGS)."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)  # struct ifreq: a name and a union of 24 bytes
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, siocgifflags, request))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


def hold() -> int:
    """Make the namespaces, say `ready` (or `error: why`), and keep them until stdin ends."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        if _libc().unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            print(f"error: {_failed('unshare(CLONE_NEWUSER|CLONE_NEWNET)')}", flush=True)
            return 1
        if os.path.exists("/proc/self/setgroups"):
            _write("/proc/self/setgroups", "deny")  # (required before an unprivileged gid_map)
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _loopback_up()
    except Exception as exc:  # noqa: BLE001  (any failure is one line: the launch goes on without)
        print(f"error: {getattr(exc, 'strerror', None) or exc}", flush=True)
        return 1
    print("ready", flush=True)
    while os.read(0, 4096):
        pass
    return 0


def join(holder: int, argv: list[str]) -> int:
    """Enter the holder's user and network namespaces, then become `argv` (execv: same PID); with
    no `argv`, only say whether entering works (exit 0)."""
    try:
        libc = _libc()
        for kind, flag in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET)):
            fd = os.open(f"/proc/{holder}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
            if libc.setns(fd, flag) != 0:
                raise OSError(_failed(f"setns({kind})"))
            os.close(fd)
    except OSError as exc:
        print(f"gpudoctor: cannot join the ranks' private network namespace: {exc}", file=sys.stderr)
        return 127
    if argv:
        try:
            os.execvp(argv[0], argv)  # (found on PATH as Popen would have: `--python python3`)
        except OSError as exc:
            print(f"gpudoctor: cannot start {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
            return 127
    return 0


class Isolation:
    """The holder of one launch's namespaces (or why there is none): `prefix` goes before each
    rank's command; `close` ends the holder (the namespace ends with its last rank)."""

    def __init__(self, holder: subprocess.Popen[bytes] | None, note: str) -> None:
        self.holder = holder
        self.active = holder is not None
        self.note = note

    def prefix(self) -> list[str]:
        if self.holder is None:
            return []
        return [sys.executable, "-I", "-S", os.path.abspath(__file__), "join", str(self.holder.pid), "--"]

    def close(self) -> None:
        proc, self.holder = self.holder, None
        if proc is None:
            return
        import subprocess

        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def isolate() -> Isolation:
    """A holder whose namespaces the ranks will join, or an Isolation that says why not."""
    import subprocess

    if sys.platform != "linux":
        return Isolation(None, "private network namespaces are Linux's")
    if os.environ.get("GPUDOCTOR_NO_NETNS"):  # the user's (or a test's) choice: as a kernel without them
        return Isolation(None, "GPUDOCTOR_NO_NETNS is set")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), "hold"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to gpudoctor's group ends the ranks first, then this
            cwd="/",
        )
    except OSError as exc:
        return Isolation(None, f"the namespace holder did not start: {exc.strerror or exc}")
    isolation = Isolation(proc, "the ranks ran in a private network namespace")
    try:
        why = _why_not(proc, isolation)
    except BaseException:  # a stop signal while asking: the holder ends with the launch
        isolation.close()
        raise
    if why is None:
        return isolation
    isolation.close()
    return Isolation(None, f"no private network namespace ({why})")


def _why_not(proc: subprocess.Popen[bytes], isolation: Isolation) -> str | None:
    """None when the holder is ready and a process can join it (as each rank will), else why not."""
    import select
    import subprocess

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
    line = proc.stdout.readline().decode("utf-8", "replace").strip() if ready else "error: no answer in time"
    if line != "ready":
        return line.removeprefix("error: ") or "the namespace holder ended without an answer"
    try:  # the ranks must be able to join, or each would fail: try it once before they start
        probe = subprocess.run(isolation.prefix()[:-1], capture_output=True, timeout=READY_TIMEOUT_S, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"joining it failed: {exc}"
    if probe.returncode != 0:
        return probe.stderr.decode("utf-8", "replace").strip()[-300:] or f"joining it exited {probe.returncode}"
    return None


if __name__ == "__main__":
    if sys.argv[1:2] == ["hold"]:
        sys.exit(hold())
    if sys.argv[1:2] == ["join"] and len(sys.argv) > 2 and sys.argv[2].isdigit() and sys.argv[3:4] in ([], ["--"]):
        sys.exit(join(int(sys.argv[2]), sys.argv[4:]))
    sys.exit("usage: netns.py hold | join HOLDER_PID [-- COMMAND]")
