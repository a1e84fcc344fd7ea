"""Another local user cannot reach one node's CPU ranks (issue 24, gloo squatting): they run in a
private network namespace (launch/netns.py), and where none can be made the findings say a failure
may be interference and never blame a rank for a lost connection."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

from gpudoctor.checks.active.common import Plan, not_run_message
from gpudoctor.checks.active.ddp import failure_findings
from gpudoctor.launch import Task, launch
from gpudoctor.launch.netns import isolate
from gpudoctor.launch.results import LaunchResult, RankOutcome

RANK_MODULE = "gpudoctor.workloads.rank"


def _rank_socket_inodes() -> set[int]:
    """The socket inodes the ranks of this test process hold."""
    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if RANK_MODULE not in " ".join(p.cmdline()):
                continue
            for fd in os.listdir(f"/proc/{p.pid}/fd"):
                link = os.readlink(f"/proc/{p.pid}/fd/{fd}")
                if link.startswith("socket:["):
                    found.add(int(link[8:-1]))
        except (psutil.Error, OSError):
            continue
    return found


def _listeners() -> dict[int, tuple[bool, int]]:
    """What another user sees: the LISTEN sockets of /proc/net/tcp{,6}, by inode (IPv6?, port)."""
    out = {}
    for name in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in open(name, encoding="ascii").read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":
                out[int(f[9])] = (name.endswith("6"), int(f[1].split(":")[1], 16))
    return out


@contextmanager
def squatter() -> Iterator[tuple[list[tuple[int, str]], list[int]]]:
    """A thread that watches /proc/net/tcp for the ranks' listeners, connects to each and sends the
    8-byte sequence number a gloo peer sends first; yields (what it reached, rank socket counts)."""
    reached: list[tuple[int, str]] = []
    seen: list[int] = []
    stop = threading.Event()
    held: list[socket.socket] = []

    def run() -> None:
        while not stop.is_set():
            mine = _rank_socket_inodes()
            seen.append(len(mine))
            for inode, (v6, port) in _listeners().items():
                if inode not in mine or any(p == port for p, _ in reached):
                    continue
                s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET)
                try:
                    s.connect(("::1" if v6 else "127.0.0.1", port))
                    s.sendall(struct.pack("<Q", 0))
                    reached.append((port, "connected"))
                except OSError as exc:
                    reached.append((port, str(exc)))
                held.append(s)
            time.sleep(0.005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield reached, seen
    finally:
        stop.set()
        thread.join(timeout=5)
        for s in held:
            s.close()


@contextmanager
def ranks_killed_once_reached(reached: list[tuple[int, str]]) -> Iterator[None]:
    """Kill this test's ranks once the squatter has connected: a squatted run hangs until the launch's
    timeout (90 s), and the test has seen what it asserts by then."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.05):
            if any(how == "connected" for _, how in reached):
                for p in psutil.Process().children(recursive=True):
                    try:
                        if RANK_MODULE in " ".join(p.cmdline()):
                            p.kill()
                    except psutil.Error:
                        continue
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _cpu_run() -> LaunchResult:
    return launch([Task("allreduce", {"sizes": [1024], "iters": 3})], device="cpu", ranks=2, timeout_s=90)


@pytest.mark.skipif(sys.platform != "linux", reason="network namespaces are Linux's")
def test_a_squatter_cannot_reach_the_listeners_of_a_cpu_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUDOCTOR_NO_NETNS", raising=False)
    if not isolate_available():
        pytest.skip("this kernel does not let this user make a user namespace")
    with squatter() as (reached, seen):
        result = _cpu_run()
    assert max(seen) > 0, "the squatter never saw the ranks' sockets: it tested nothing"
    assert reached == [] and result.isolated and "private network namespace" in result.isolation
    assert result.ok, [(r.rank, r.state, r.error) for r in result.ranks]


def test_without_a_namespace_the_listeners_are_reachable_and_the_run_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The threat is real here (the squatter is not vacuous): without the namespace it connects."""
    monkeypatch.setenv("GPUDOCTOR_NO_NETNS", "1")
    tries: list[list[tuple[int, str]]] = []
    # A gloo listener lives only until its peer connects: on a loaded machine the squatter can find each one
    # already closed ("Connection refused"), and the run ends unsquatted. Reaching one once is the point.
    for _ in range(3):
        with squatter() as (reached, _), ranks_killed_once_reached(reached):
            result = _cpu_run()
        assert not result.isolated and result.isolation == "GPUDOCTOR_NO_NETNS is set"
        tries.append(reached)
        if any(how == "connected" for _, how in reached):
            break
    assert any(how == "connected" for _, how in tries[-1]), tries


def isolate_available() -> bool:
    isolation = isolate()
    try:
        return isolation.active
    finally:
        isolation.close()


@pytest.mark.skipif(sys.platform != "linux", reason="network namespaces are Linux's")
def test_a_rank_in_the_namespace_sees_only_its_own_loopback_and_the_holder_ends_with_gpudoctor() -> None:
    isolation = isolate()
    if not isolation.active:
        pytest.skip(isolation.note)
    holder = isolation.holder
    assert holder is not None
    try:
        code = "import socket; print(sorted(n for _, n in socket.if_nameindex()))"
        out = subprocess.run([*isolation.prefix(), sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == "['lo']", out.stderr
    finally:
        isolation.close()
    assert holder.poll() is not None  # ended when its pipe closed: nothing outlives the launch


HOLD_AND_WAIT = (
    "import sys, time; from gpudoctor.launch.netns import isolate; i = isolate(); "
    "print(i.holder.pid if i.active else 'none', flush=True); time.sleep(60)"
)


@pytest.mark.skipif(sys.platform != "linux", reason="network namespaces are Linux's")
def test_the_holder_ends_when_gpudoctor_is_killed() -> None:
    owner = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        pid = owner.stdout.readline().strip()
        if pid == "none":
            pytest.skip("this kernel does not let this user make a user namespace")
        holder = psutil.Process(int(pid))
        owner.kill()  # SIGKILL: nothing of gpudoctor's runs to close the holder's pipe
        owner.wait()
        holder.wait(timeout=10)  # its standard input ended: it leaves on its own (TimeoutExpired if not)
        assert not holder.is_running()
    finally:
        owner.kill()
        owner.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="dropping to another user needs root")
def test_an_unprivileged_user_gets_the_namespace_where_the_kernel_allows_it() -> None:
    import gpudoctor.launch.netns as netns

    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    proc = subprocess.run(
        [*as_nobody, sys.executable, "-I", "-S", netns.__file__, "hold"], input="", capture_output=True, text=True
    )
    userns = open("/proc/sys/user/max_user_namespaces", encoding="ascii").read().strip() != "0"
    if proc.stdout.strip() != "ready":
        assert proc.stdout.startswith("error: "), proc.stdout  # refused: said in one line, not a crash
        pytest.skip(f"this kernel refuses unprivileged user namespaces: {proc.stdout.strip()}")
    assert userns and proc.returncode == 0


NO_USERNS = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'  # (a per-user-namespace limit)
LAUNCH_AND_SAY = (
    "import json; from gpudoctor.launch import Task, launch; "
    "r = launch([Task('allreduce', {'sizes': [1024], 'iters': 3})], device='cpu', ranks=2, timeout_s=90); "
    "print(json.dumps([r.ok, r.isolated, r.isolation]))"
)


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs util-linux unshare")
def test_where_the_kernel_refuses_user_namespaces_the_run_goes_on_as_before_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real refusal, not a simulated one: inside a user namespace whose user.max_user_namespaces
    is 0, unshare(CLONE_NEWUSER) fails with ENOSPC, as on a kernel or container that forbids it."""
    monkeypatch.delenv("GPUDOCTOR_NO_NETNS", raising=False)
    outer = ["unshare", "--user", "--map-root-user", "sh", "-c", NO_USERNS, "sh"]
    if subprocess.run([*outer, "true"], capture_output=True).returncode != 0:
        pytest.skip("this kernel does not let this user make the outer user namespace")
    out = subprocess.run([*outer, sys.executable, "-c", LAUNCH_AND_SAY], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    ok, isolated, note = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert ok and not isolated, note  # the ranks ran, in the machine's namespace, as before
    assert note.startswith("no private network namespace (unshare(") and "No space left on device" in note


def test_a_holder_the_ranks_could_not_join_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Were joining refused after the holder is ready (a seccomp or LSM rule on setns), every rank
    would fail: isolate() tries joining once first and otherwise gives the ranks no prefix."""
    import gpudoctor.launch.netns as netns

    refuse = [sys.executable, "-c", "import sys; sys.exit('setns(user): Operation not permitted')", "--"]
    monkeypatch.delenv("GPUDOCTOR_NO_NETNS", raising=False)
    monkeypatch.setattr(netns.Isolation, "prefix", lambda self: refuse if self.holder is not None else [])
    isolation = isolate()
    if isolation.note.startswith("no private network namespace (unshare("):
        pytest.skip(isolation.note)  # (refused before joining could be tried)
    assert not isolation.active and isolation.prefix() == []
    assert isolation.note == "no private network namespace (setns(user): Operation not permitted)"


# --- where no namespace could be made: interference is said, a lost connection blamed on nobody ---


def _lost(rank: int) -> RankOutcome:
    r = RankOutcome(rank, rank, None, state="error", phase="allreduce", error_kind="peer_lost")
    r.error = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    return r


def test_a_lost_connection_on_an_open_machine_blames_no_rank_and_says_it_may_be_interference() -> None:
    result = LaunchResult("cpu", "gloo", 2, [_lost(0), _lost(1)], 3.0, "file", isolated=False, isolation="no")
    found = failure_findings(result, Plan("cpu", 2, []))
    assert [f.subject for f in found] == ["host"]  # (was: rank:0 and rank:1, both healthy)
    assert "may be interference" in found[0].message and found[0].evidence["failed_ranks"] == [0, 1]
    assert "may be interference" in not_run_message(result, "the all-reduce sweep")
    assert "rank 0" not in not_run_message(result, "the all-reduce sweep")


def test_in_a_private_namespace_a_lost_connection_still_names_the_ranks() -> None:
    result = LaunchResult("cpu", "gloo", 2, [_lost(0), _lost(1)], 3.0, "file", isolated=True, isolation="ns")
    found = failure_findings(result, Plan("cpu", 2, []))
    assert {f.subject for f in found} == {"rank:0", "rank:1"} and not result.interference()


def test_a_failure_no_socket_could_cause_is_not_put_down_to_interference() -> None:
    """Still importing torch (no socket yet), or a CUDA error on NCCL ranks: said as it is."""
    importing = RankOutcome(0, 0, None, state="hung", last_step="importing", phase="import")
    cuda = RankOutcome(1, 1, 6, state="error", last_step="joined", phase="ddp", error="RuntimeError: CUDA error")
    waiting = RankOutcome(1, 1, None, state="hung", last_step="imported", phase="join")  # (for rank 0)
    assert LaunchResult("cpu", "gloo", 2, [importing, waiting], 6.5, "file", timed_out="import").interference() == ""
    assert LaunchResult("cuda", "nccl", 1, [cuda], 3.0, "file").interference() == ""
    hung = RankOutcome(0, 0, None, state="hung", last_step="joined", phase="ddp")
    assert "may be interference" in LaunchResult("cpu", "gloo", 1, [hung], 9.0, "file").interference()
