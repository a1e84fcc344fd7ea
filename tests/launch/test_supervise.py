"""The launcher's pieces without spawning ranks: the ranks' environment, the phase deadlines,
stopping process groups (gpudoctor.safety.procs), the report's node rows."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from gpudoctor.checks.active.common import plan
from gpudoctor.engine import CheckContext, CheckOptions
from gpudoctor.launch.environment import rank_env
from gpudoctor.launch.protocol import JOINED_PHASE, Event
from gpudoctor.launch.results import LaunchResult, RankOutcome
from gpudoctor.launch.rundir import STORE_NAME, private_store
from gpudoctor.launch.supervise import Deadlines, _common_phase
from gpudoctor.safety import procs
from tests.helpers.snapshots import SnapshotOf

# --- D: rank i drives exactly the GPU gpudoctor names for it -------------------------------


def test_single_node_gpu_ranks_see_exactly_the_named_gpus_in_rank_order(snapshot_of: SnapshotOf) -> None:
    # Mixed GPUs: under the default FASTEST_FIRST order CUDA's index 0 need not be NVML's GPU 0,
    # and the user's environment may say anything; the ranks get UUIDs in rank order instead.
    s = snapshot_of("rtx4090_2x_rtx4080_1x")
    s = replace(s, env={**s.env, "CUDA_VISIBLE_DEVICES": "2,0"})
    p = plan(CheckContext(s, CheckOptions()))
    assert p.device == "cuda" and len(p.gpus) == 2
    assert p.uuids == [s.gpu(i).uuid for i in p.gpus]
    user = {"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "FASTEST_FIRST", "PATH": "/bin"}
    env = rank_env(user, device="cuda", gpu_uuids=p.uuids, under_launcher=False)
    assert env["CUDA_VISIBLE_DEVICES"].split(",") == [s.gpu(i).uuid for i in p.gpus]
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["PATH"] == "/bin" and env["OMP_NUM_THREADS"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert user["CUDA_VISIBLE_DEVICES"] == "2,0"  # the caller's mapping is not modified


@pytest.mark.parametrize(
    ("device", "uuids", "under_launcher"),
    [
        ("cuda", ["GPU-aaaa", "GPU-bbbb"], True),  # torchrun/srun: the user's environment stands
        ("cpu", ["GPU-aaaa"], False),  # gloo on CPU: GPUs are not ours to pick
        ("cuda", None, False),  # UUIDs unknown: keep what the user set
        ("cuda", ["GPU-aaaa", "unknown"], False),  # one UUID unreadable in the snapshot
    ],
)
def test_the_users_gpu_environment_is_left_alone_otherwise(
    device: str, uuids: list[str] | None, under_launcher: bool
) -> None:
    user = {"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    env = rank_env(user, device=device, gpu_uuids=uuids, under_launcher=under_launcher)
    assert env["CUDA_VISIBLE_DEVICES"] == "1,0" and env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


# --- A: a slow import is not a join hang ---------------------------------------------------


def ranks_at(*steps: str) -> list[RankOutcome]:
    return [RankOutcome(r, r, None, last_step=step) for r, step in enumerate(steps)]


def test_a_slow_import_does_not_eat_the_join_window() -> None:
    # timeout 6 s, join share 0.6: the old rule ended the join at 3.6 s from the start.
    d = Deadlines(start=0.0, timeout_s=6.0, join_share=0.6)
    assert d.expired(ranks_at("importing", "importing"), 4.0) is None
    assert d.expired(ranks_at("imported", "imported"), 5.0) is None  # the join window opens at 5 s
    assert d.join_deadline == 6.0  # 5 + 3.6, capped by the overall deadline
    assert d.expired(ranks_at("peers", "phase"), 5.9) is None
    assert d.expired(ranks_at("peers", "phase"), 6.1) == "run"


def test_an_import_unfinished_at_the_deadline_is_an_import_timeout() -> None:
    d = Deadlines(start=0.0, timeout_s=6.0)
    assert d.expired(ranks_at("imported", "importing"), 5.9) is None
    assert d.expired(ranks_at("joined", "importing"), 6.1) == "import"


def test_the_join_window_starts_when_the_last_rank_has_imported() -> None:
    d = Deadlines(start=0.0, timeout_s=10.0, join_share=0.5)
    assert d.expired(ranks_at("imported", "imported"), 1.0) is None
    assert d.expired(ranks_at("joined", "imported"), 5.9) is None
    assert d.expired(ranks_at("joined", "imported"), 6.1) == "join"


def test_hang_reasons_say_what_the_rank_had_not_done() -> None:
    def reason(step: str, phase: str) -> str:
        return RankOutcome(0, 0, None, last_step=step, phase=phase).hang_reason()

    assert reason("started", "start") == "did not get as far as importing torch"
    assert reason("importing", "import") == "did not finish importing torch"
    assert reason("importing", "cuda_init") == "did not finish initialising CUDA"
    assert reason("imported", "join") == "did not join the process group"
    assert reason("phase", "ddp") == "did not answer"


# --- G: the report's node rows come from the launch -----------------------------------------


def test_node_rows_only_in_global_rank_0s_report_under_a_launcher() -> None:
    peers = [{"rank": r, "local_rank": 0, "host": f"n{r}", "node_rank": r, "device": "cpu"} for r in (0, 1)]

    def result(rank: int, under_launcher: bool = True) -> LaunchResult:
        ranks = [RankOutcome(rank, 0, None, state="done")]
        return LaunchResult("cpu", "gloo", 2, ranks, 1.0, "env", peers=peers, under_launcher=under_launcher)

    assert [(n["node_rank"], n["ranks"], n["status"]) for n in result(0).report_nodes()] == [
        (0, [0], "ok"),
        (1, [1], "ok"),
    ]
    assert result(0).node_count == 2
    assert result(1).report_nodes() == []
    assert result(0, under_launcher=False).report_nodes() == []


# --- B: stopping a process group, never someone else's --------------------------------------


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _group_with_orphan() -> tuple[subprocess.Popen[bytes], int]:
    """A group whose leader has exited and been reaped, leaving a grandchild in the group."""
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE, start_new_session=True)
    assert leader.stdout is not None
    grandchild = int(leader.stdout.readline())
    leader.stdout.close()
    leader.wait(timeout=10)
    assert os.getpgid(grandchild) == leader.pid
    return leader, grandchild


def test_a_running_group_gets_sigterm_and_its_leader_is_reaped() -> None:
    leader = subprocess.Popen(["sleep", "60"], start_new_session=True)
    assert procs.terminate_group(leader) is True
    assert leader.returncode == -signal.SIGTERM


def test_a_group_ignoring_sigterm_is_killed_after_the_grace() -> None:
    leader = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; echo ready; exec sleep 60"], start_new_session=True, stdout=subprocess.PIPE
    )
    assert leader.stdout is not None and leader.stdout.readline() == b"ready\n"  # the trap is set (a loaded CI host)
    leader.stdout.close()
    start = time.monotonic()
    assert procs.terminate_group(leader, grace_s=0.5) is True
    assert leader.returncode == -signal.SIGKILL
    assert time.monotonic() - start < 0.5 + procs.REAP_S


def test_after_the_leader_is_reaped_its_leftover_members_are_still_stopped() -> None:
    leader, grandchild = _group_with_orphan()
    assert procs.terminate_groups([leader], grace_s=2.0) == set()  # the leader had ended by itself
    end = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_a_reaped_leaders_reused_pid_means_the_group_is_not_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    leader, grandchild = _group_with_orphan()
    try:
        # As if the number had gone to a new process: nothing may be signalled, even the
        # processes still carrying that process-group ID.
        monkeypatch.setattr(psutil, "pid_exists", lambda pid: pid == leader.pid or _alive(pid))
        assert procs.group_members(leader) == []
        procs.terminate_groups([leader], grace_s=0.2, reap_s=0.2)
        assert _alive(grandchild)
    finally:
        os.kill(grandchild, signal.SIGKILL)


def test_the_rendezvous_store_is_a_new_private_file(tmp_path: Path) -> None:
    """review3 S3: the single-node store is a file only the caller can open (0600, created with
    O_EXCL|O_NOFOLLOW: never a file or link planted in its place)."""
    home = tmp_path / "ranks"
    home.mkdir(mode=0o700)
    store = private_store(home)
    st = store.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 0
    store.unlink()
    store.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        private_store(home)
    assert not (tmp_path / "elsewhere").exists()


def test_a_rank_refuses_a_store_outside_a_private_directory(tmp_path: Path) -> None:
    from datetime import timedelta

    from gpudoctor.workloads.rank import _store

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(PermissionError, match="not a private directory"):
        _store({"rendezvous": {"mode": "file", "path": str(shared / STORE_NAME)}}, 2, timedelta(seconds=1))


def test_leftovers_of_a_killed_run_are_swept_and_nothing_else(tmp_path: Path) -> None:
    # Only a SIGKILL leaves a rank directory behind; the next run removes this user's old private
    # ones whose run lock is free. A live run elsewhere (another PID namespace, another host on a
    # shared TMPDIR) holds its lock, whatever its PID says here: its directory stays.
    from gpudoctor.launch.rundir import RANK_DIR_PREFIX, RUN_LOCK, hold_run_lock, sweep_leftovers

    old = time.time() - 3600

    def leftover(name: str, mode: int = 0o700, age: float = old, lock: bool = True) -> Path:
        d = tmp_path / f"{RANK_DIR_PREFIX}{name}"
        d.mkdir()
        if lock:
            (d / RUN_LOCK).touch()
        d.chmod(mode)
        os.utime(d, (age, age))
        return d

    gone = leftover("gone")
    live = leftover("live", lock=False)
    held = hold_run_lock(live)  # a run in progress
    os.utime(live, (old, old))
    holder = subprocess.Popen(  # the lock held by another process, as a live gpudoctor holds it
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
            str(leftover("other") / RUN_LOCK),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        young = leftover("young", age=time.time())
        shared = leftover("shared", mode=0o755)
        unlocked_old_version = leftover("nolock", lock=False)
        target = tmp_path / "elsewhere"
        target.mkdir()
        (tmp_path / f"{RANK_DIR_PREFIX}link").symlink_to(target)
        sweep_leftovers(tmp_path)
        assert not gone.exists()
        kept = [live, tmp_path / f"{RANK_DIR_PREFIX}other", young, shared, unlocked_old_version, target]
        assert all(p.exists() for p in kept)
    finally:
        holder.kill()
        holder.wait()
        os.close(held)


def test_a_run_budget_counts_from_when_every_rank_is_ready() -> None:
    # A cold VM: torch and CUDA take 40 s of a 120 s timeout; the link probes' 30 s start at the join.
    d = Deadlines(start=0.0, timeout_s=120.0, run_s=30.0)
    assert d.expired(ranks_at("importing"), 40.0) is None
    assert d.expired(ranks_at("joined"), 42.0) is None
    assert d.expired(ranks_at("phase"), 71.9) is None  # 29.9 s into the run
    assert d.expired(ranks_at("phase"), 72.1) == "run"
    # The whole launch stays bounded by the timeout, whatever the run budget.
    late = Deadlines(start=0.0, timeout_s=120.0, run_s=30.0)
    assert late.expired(ranks_at("joined"), 100.0) is None
    assert late.expired(ranks_at("phase"), 120.1) == "run"


def test_the_progress_names_the_tasks_running_and_never_a_join_as_a_task() -> None:
    """`check`'s progress line: ranks between their join and their first task were shown as "running joined"
    (seen under load, where the line is looked at in that moment)."""

    def rank(i: int, phase: str, state: str = "spawned") -> RankOutcome:
        return RankOutcome(i, i, None, state=state, last_step=Event.JOINED.value, phase=phase)

    assert _common_phase([rank(0, JOINED_PHASE), rank(1, JOINED_PHASE)]) == "every rank joined: starting the tasks"
    assert _common_phase([rank(0, "allreduce"), rank(1, JOINED_PHASE)]) == "running allreduce"
    assert _common_phase([rank(0, "ddp"), rank(1, "allreduce")]) == "running allreduce, ddp"
    assert _common_phase([rank(0, "ddp", "done"), rank(1, "ddp", "done")]) == "finished"
