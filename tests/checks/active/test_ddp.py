"""The DDP sanity check run for real on CPU with gloo: verdicts and named failing ranks."""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from typing import Any

import pytest

from gpudoctor.checks import context
from gpudoctor.checks.active.allreduce import allreduce
from gpudoctor.checks.active.common import Plan
from gpudoctor.checks.active.ddp import ddp_sanity, failure_findings
from gpudoctor.engine import CheckOptions
from gpudoctor.findings import Finding, Status
from gpudoctor.launch.results import LaunchResult, RankOutcome
from gpudoctor.launch.supervise import KILL_SEQUENCE_S
from gpudoctor.snapshot import Snapshot
from tests.helpers.findings import by_code
from tests.helpers.processes import HANG_TIMEOUT_S, cut_hangs
from tests.helpers.snapshots import load
from tests.paths import shipped_schema

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_orphans")]
EMPTY = Snapshot(1, "2026-01-01T00:00:00+00:00", [])
SCHEMA = shipped_schema("report")


def run_check(ranks: int = 2, timeout_s: float = 300, progress: list[str] | None = None) -> list:  # type: ignore[type-arg]
    opts = CheckOptions(device="cpu", ranks=ranks, timeout_s=timeout_s)
    findings, _ = ddp_sanity(context(EMPTY, opts, progress=(progress if progress is not None else []).append))
    return findings


@dataclass(frozen=True)
class FaultyRun:
    progress: list[str]
    findings: list[Finding]  # the DDP check's
    details: dict[str, Any]
    sums: list[Finding]  # the all-reduce check's, read on the same run
    result: LaunchResult


@pytest.fixture(scope="module")
def faulty_ranks_on_a_busy_port() -> FaultyRun:
    """Real ranks (gloo on CPU): rank 1 adds a wrong value to what it all-reduces, rank 2 sends wrong DDP
    gradients, and MASTER_PORT is a port another socket listens on. Two independent things, read by two
    tests: the faults are in what the ranks compute, the port in how they meet (in a file, not on it)."""
    with pytest.MonkeyPatch.context() as env, socket.socket() as sock:
        env.setenv("GPUDOCTOR_FAULT", "1:wrongsum,2:corrupt")
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        env.setenv("MASTER_PORT", str(sock.getsockname()[1]))
        progress: list[str] = []
        ctx = context(load("no_driver"), CheckOptions(device="cpu", ranks=3, timeout_s=300), progress.append)
        findings, details = ddp_sanity(ctx)
        sums, _ = allreduce(ctx)  # the same run
        return FaultyRun(progress, findings, details, sums, ctx.run("active"))


def test_corrupted_gradients_and_a_wrong_sum_fail_and_name_their_ranks(faulty_ranks_on_a_busy_port: FaultyRun) -> None:
    """The all-reduce and DDP checks read the one run they share, as in `gpudoctor check`. (Three runs
    before, one per fault and layer: test_allreduce's wrongsum end to end and test_workloads' wrong values
    counted by the launch asserted the same on runs of their own.)"""
    run = faulty_ranks_on_a_busy_port
    # What runs, how long: the phases the ranks are in when the launch looks (every POLL_S). A loaded machine
    # can run a whole phase between two looks, or show two at once ("running allreduce, ddp (...)").
    running = [m.removeprefix("running ").rpartition(" (") for m in run.progress if m.startswith("running ")]
    assert running and all(when.endswith(" s)") for _, _, when in running), run.progress
    assert {phase for names, _, _ in running for phase in names.split(", ")} <= {"allreduce", "ddp"}, run.progress
    bad = [f for f in run.findings if f.code == "GD704"]
    assert [(f.status, f.subject) for f in bad] == [(Status.FAIL, "rank:2")]
    assert [f.status for f in run.findings if f.code == "GD703"] == [Status.PASS]
    (f,) = by_code(run.sums, "GD602")
    assert (f.status, f.subject) == (Status.FAIL, "rank:1")
    assert "rank 1 sent values that differ from its pattern" in f.message
    assert f.evidence["ranks"] == [1]
    # What the launch itself counted: every size summed wrong, rank 2's gradients named, and every rank
    # applied the same (wrong) average.
    result = run.result
    assert result.ok and len(result.ranks) == 3
    assert all(row["wrong"] > 0 for row in result.results("allreduce")["rows"])
    ddp = result.results("ddp")
    assert not ddp["grad_ok"] and ddp["bad_gradient_ranks"] == [2] and ddp["params_differ_ranks"] == []


def test_a_hanging_rank_is_reported_as_timeout_within_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("GPUDOCTOR_FAULT", "1:hang")
    launches = cut_hangs(monkeypatch)  # the hang is cut HANG_RUN_S after the join, not at the whole deadline
    start = time.monotonic()
    findings = run_check(timeout_s=HANG_TIMEOUT_S)
    assert time.monotonic() - start < HANG_TIMEOUT_S + KILL_SEQUENCE_S + 1
    # The launch itself (tests/workloads/test_workloads.py ran the same tasks with the same fault in a
    # launch of its own for these three lines): rank 1 the one suspect, both ranks stopped as hung.
    (result,) = launches
    assert result.timed_out == "run"
    assert [r.rank for r in result.suspects()] == [1]
    assert {r.state for r in result.ranks} == {"hung"}
    timeouts = [f for f in findings if f.code == "GD711"]
    assert [f.subject for f in timeouts] == ["rank:1"]
    assert f"did not answer within the {HANG_TIMEOUT_S:g} s deadline" in timeouts[0].message


def test_a_rank_still_importing_at_the_deadline_is_named_as_importing_not_as_not_joining() -> None:
    ranks = [
        RankOutcome(0, 0, None, state="hung", last_step="importing", phase="import"),
        RankOutcome(1, 1, None, state="hung", last_step="imported", phase="join"),
    ]
    result = LaunchResult("cpu", "gloo", 2, ranks, 6.5, "tcpstore:port0", timed_out="import", deadline_s=6)
    (f,) = failure_findings(result, Plan("cpu", 2, []))
    assert (f.code, f.subject) == ("GD711", "rank:0")
    assert f.message == "rank 0 did not finish importing torch within the 6 s deadline (last phase: import)"
    assert f.evidence["others_stopped"] == [1] and f.evidence["timed_out"] == "import"


def test_an_exiting_rank_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Also what the launch itself says (test_workloads asserted it on a run of its own, rank 1 exiting;
    the benches' tests still stop a rank 1 that exits): the one suspect, its exit status, and the run
    stopped after the failure, not at the 300 s deadline."""
    monkeypatch.setenv("GPUDOCTOR_FAULT", "0:exit")
    ctx = context(EMPTY, CheckOptions(device="cpu", ranks=2, timeout_s=300))
    findings, _ = ddp_sanity(ctx)
    result = ctx.run("active")
    assert not result.ok
    (suspect,) = result.suspects()
    assert suspect.rank == 0 and suspect.state == "exited" and suspect.exit_code == 17
    assert result.elapsed_s < 150  # (imports vary with load)
    failed = [f for f in findings if f.code == "GD710"]
    assert [f.subject for f in failed] == ["rank:0"]
    assert "exited with status 17" in failed[0].message
    # CPU ranks: no GPU to run alone; the hint points at the software setup instead.
    assert "alone" not in failed[0].hint and "ran on the CPU (--device cpu)" in failed[0].hint


def test_a_failed_gpu_rank_is_sent_to_run_its_gpu_alone_by_uuid() -> None:
    ranks = [
        RankOutcome(0, 0, 4, state="done", last_step="done", phase="done"),
        RankOutcome(1, 1, 6, state="error", last_step="joined", phase="ddp", error="RuntimeError: CUDA error"),
    ]
    result = LaunchResult("cuda", "nccl", 2, ranks, 3.0, "tcpstore:port0")
    on_gpus = Plan("cuda", 2, [4, 6], uuids=["GPU-aaaa", "GPU-bbbb"])
    (f,) = failure_findings(result, on_gpus)
    assert (f.code, f.subject) == ("GD710", "rank:1")
    assert "`CUDA_VISIBLE_DEVICES=GPU-bbbb gpudoctor check --select ddp` with GPU 6 alone" in f.hint
    (cpu,) = failure_findings(replace(result, device="cpu"), Plan("cpu", 2, []))
    assert "CUDA_VISIBLE_DEVICES" not in cpu.hint and "not a GPU" in cpu.hint


def test_a_busy_master_port_does_not_stop_the_local_run(faulty_ranks_on_a_busy_port: FaultyRun) -> None:
    """gpudoctor's own ranks meet in a file, not on MASTER_PORT: no setup error, and every DDP finding passes
    but the fault of the run (a healthy run of its own, and the launch-level test of a busy MASTER_PORT
    in tests/workloads/test_workloads.py, asserted the same before). A port that joining finds in use (the
    launcher's, under torchrun) is still GD712."""
    run = faulty_ranks_on_a_busy_port
    launched = run.details["launch"]
    assert launched["setup_error"] is None and launched["rendezvous"] == "file"
    failing = {(f.code, f.subject) for f in run.findings if f.status is not Status.PASS}
    assert run.findings and failing == {("GD704", "rank:2")}, failing  # the DDP check's, as a healthy run's
    bind_failed = RankOutcome(0, 0, None, state="error", phase="join", error_kind="port_in_use")
    bind_failed.error = "DistNetworkError: failed to bind to [::]:29500 (errno: 98 - Address already in use)"
    (f,) = failure_findings(LaunchResult("cpu", "gloo", 1, [bind_failed], 1.0, "env"), Plan("cpu", 1, []))
    assert f.code == "GD712" and f.status is Status.FAIL
