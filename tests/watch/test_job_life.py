"""The job's life under `gpudoctor watch --no-tui --json -- torchrun ...`: real gloo jobs on CPU
(tests/fixtures/jobs/life.py, spawn_script.py) that hang before step 1, stall, end unevenly or crash, and
the verdict each one gets (GD920-GD927).

Each test reads watch's JSON lines as they come and stops watch (SIGINT, as Ctrl-C) as soon as the verdict
is there, or lets the job end by itself; nothing waits a fixed time. The deadlines are shortened with
`--join-after` (the product's bound is 30 s) and `--hang-after`. A test that needs a stack (where a rank
is) skips when py-spy is not installed or may not trace here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest

from gpudoctor.probe import stacks
from tests.conftest import SESSION_VAR
from tests.helpers.processes import GPUDOCTOR, clean_env, free_port, reap
from tests.paths import FIXTURES, REPO

DEADLINE_S = 420.0  # two ranks importing torch on a loaded 2-core machine take minutes; found sooner, it ends sooner
pytestmark = [pytest.mark.slow, pytest.mark.timeout(DEADLINE_S + 60), pytest.mark.usefixtures("no_orphans")]

JOBS = FIXTURES / "jobs"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TWO = ["--standalone", "--nproc-per-node", "2"]
JOIN_S = "4"


@pytest.fixture(autouse=True)
def _no_job_left() -> Iterator[None]:
    """Nothing of a followed job outlives its watch (torchrun's workers run in sessions of their own)."""
    yield
    deadline = time.monotonic() + 10
    while (left := _left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []


def _left() -> list[str]:
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            line = " ".join(p.cmdline())
            mine = p.environ().get(SESSION_VAR) == os.environ[SESSION_VAR]  # not another session's (xdist)
            if str(JOBS) in line and p.status() != psutil.STATUS_ZOMBIE and mine:
                found.append(line)
    return found


def stack_reason() -> str | None:
    """Why this machine cannot read a process's stack (checked on ourselves: same user, same kernel)."""
    return stacks.why_not(os.getpid())


needs_stacks = pytest.mark.skipif(stack_reason() is not None, reason=f"no stacks here: {stack_reason()}")


@dataclass
class Watched:
    samples: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    stderr: str = ""
    code: int | None = None

    def verdicts(self, code: str) -> list[dict[str, Any]]:
        """Every time `code` was in a sample, then in the summary."""
        found = [v for s in self.samples for v in s["verdicts"] if v["code"] == code]
        return found + [v for v in (self.summary or {}).get("verdicts", []) if v["code"] == code]

    def ranks(self, verdict: dict[str, Any]) -> list[int | None]:
        return [r["rank"] for r in verdict["ranks"]]


def watch(
    command: list[str],
    until: Callable[[dict[str, Any]], bool] | None = None,
    options: tuple[str, ...] = (),
    join_after: str = JOIN_S,
) -> Watched:
    """`gpudoctor watch --no-tui --json ... -- COMMAND`, read as it runs; stopped with SIGINT once a sample
    satisfies `until` (None: the command ends by itself)."""
    argv = [*GPUDOCTOR, "watch", "--no-tui", "--json", "--interval", "0.5", "--join-after", join_after, *options]
    proc = subprocess.Popen(
        [*argv, "--", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=clean_env(),
    )
    out = Watched()
    err: list[str] = []
    drain = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""), daemon=True)
    drain.start()
    stopped = False
    deadline = time.monotonic() + DEADLINE_S
    timer = threading.Timer(DEADLINE_S, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # the job's own stdout shares ours
            if doc.get("kind") == "sample":
                out.samples.append(doc)
                if until is not None and not stopped and until(doc):
                    proc.send_signal(signal.SIGINT)
                    stopped = True
            elif doc.get("kind") == "summary":
                out.summary = doc
        out.code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        reap(proc, timer, drain)
    out.stderr = "".join(err)
    assert out.summary is not None, out.stderr[-3000:]
    if until is not None:
        assert stopped, f"the verdict never came: {out.stderr[-3000:]}"
        assert out.code == 130
    return out


def has(code: str, test: Callable[[dict[str, Any]], bool] = lambda v: True) -> Callable[[dict[str, Any]], bool]:
    return lambda sample: any(v["code"] == code and test(v) for v in sample["verdicts"])


def life(*args: str, torchrun: list[str] = TWO) -> list[str]:
    return [*TORCHRUN, *torchrun, str(JOBS / "life.py"), *args]


# -- before step 1 -------------------------------------------------------------------------------------


@needs_stacks
def test_a_rank_preparing_data_before_joining_is_named_with_where_it_is() -> None:
    told = has("GD920", lambda v: "prepare" in v["message"] and "rank 1 waits to join" in v["message"])
    w = watch(life("before-init", "0", "600"), told)
    v = w.verdicts("GD920")[-1]
    assert w.ranks(v) == [0, 1]  # both not joined: rank 1 waits for rank 0 inside init_process_group
    assert "rank 0 is busy in its own code at prepare (life.py:" in v["message"]
    assert "rank 1 waits to join its process group" in v["message"]
    job = next(s for s in w.samples if told(s))["job"]  # the verdict's own sample (the last follows Ctrl-C)
    assert {p["role"] for p in job} == {"launcher", "rank"}
    joined = [p.get("joined") for p in job if p["role"] == "rank"]
    assert True not in joined and False in joined, joined  # a rank still silent under load is unknown (None)


def test_a_rank_late_for_step_one_is_named_and_the_rank_it_kept_waiting_is_not_blamed_after() -> None:
    """Rank 0 prepares alone for 10 s (2.5x the 4 s --join-after) after DDP is set up; rank 1 waits inside
    its step 1 (the gradient all-reduce). GD922 names rank 0 as the one the other waits for; when the job
    resumes, rank 1's long first step must not make it the slow rank (GD909 judges cycles, not step times
    alone)."""
    w = watch(life("before-step", "0", "10", "--steps", "60"), options=("--warmup", "0"))
    assert w.code == 0, w.stderr[-3000:]
    late = w.verdicts("GD922")
    assert late, w.stderr[-3000:]
    v = late[-1]
    assert "rank 1 waits inside step 1 while rank 0 has not entered it" in v["message"]
    assert v["hint"].startswith("rank 0 keeps the others waiting")
    assert [x["steps"] for x in w.summary["ranks"]] == [60, 60]  # type: ignore[index]
    # Rank 1's 10 s first step would make its mean step ~0.23 s ("rank 1's steps take ..."). A loaded machine
    # can make it truly late by a few ms a step (seen at -n 4 on 2 cores: 6.4 ms of a 60 ms step): that is
    # the machine, named rightly, not the first step.
    blamed = [g for g in w.verdicts("GD909") if 1 in w.ranks(g)]
    assert all("steps take" not in g["message"] for g in blamed), blamed
    assert all(g["figure"]["worst"] < 60 for g in blamed if "figure" in g), blamed  # the summary's, in ms


@needs_stacks
def test_a_world_size_larger_than_the_ranks_started_is_named() -> None:
    w = watch(life("world-size"), has("GD923"))
    v = w.verdicts("GD923")[-1]
    assert w.ranks(v) == [0, 1]
    assert "every rank started (ranks 0,1, WORLD_SIZE=2) waits in init_process_group" in v["message"]
    together = [s for s in w.samples if {"GD920", "GD923"} <= {v["code"] for v in s["verdicts"]}]
    assert not together  # the mismatch explains the wait: not also "not joined"


@needs_stacks
def test_a_node_that_never_joins_leaves_torchrun_alone_and_is_named() -> None:
    nodes = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    command = life("ok", torchrun=[*nodes, "--rdzv-endpoint", f"127.0.0.1:{free_port()}"])
    w = watch(command, has("GD921"))
    v = w.verdicts("GD921")[-1]
    assert "has started no rank for" in v["message"] and "its rendezvous waits for 2 nodes (--nnodes 2)" in v["message"]
    assert [p["role"] for p in w.samples[-1]["job"]] == ["launcher"]


def test_a_script_that_sets_master_port_under_torchrun_is_named_before_step_one() -> None:
    """Runtime mistake #5: the script overwrites torchrun's MASTER_PORT with a port nobody serves, so every
    rank waits to reach a store that is not there; torch says nothing until its timeout. Lint's twin: GD750.
    Where stacks can be read, every rank's shows it waiting in init_process_group, none missing: GD923, which
    names a MASTER_PORT set in the script. Without stacks: GD920, both ranks not joined. (GD920 came first
    with stacks too only when a rank's stack had been read before it said hello and was not read again for
    10 s; under load both said hello first and GD923 came alone: test_tracker pins the re-read.)"""
    code = "GD923" if stack_reason() is None else "GD920"
    told = has(code, lambda v: len(v["ranks"]) == 2)
    w = watch(life("port", str(free_port())), told)
    v = w.verdicts(code)[-1]
    assert w.ranks(v) == [0, 1]
    if code == "GD923":
        assert "waits in init_process_group" in v["message"] and "MASTER_PORT set in the script" in v["message"]
    seen = next(s for s in w.samples if told(s))  # the sample of the verdict (the last one follows Ctrl-C)
    joined = [p.get("joined") for p in seen["job"] if p["role"] == "rank"]
    # neither shown as joined; a rank still silent (importing, on a loaded machine) is unknown, not False (CI)
    assert len(joined) == 2 and True not in joined and False in joined, joined
    assert not w.verdicts("GD927")  # stopped before torch's own timeout: no crash to report yet


def test_an_mp_spawn_script_launched_by_torchrun_is_named() -> None:
    w = watch([*TORCHRUN, *TWO, str(JOBS / "spawn_script.py")], has("GD924"))
    v = w.verdicts("GD924")[-1]
    assert w.ranks(v) and "torch.multiprocessing.spawn" in v["message"]
    together = [s for s in w.samples if {"GD920", "GD924"} <= {v["code"] for v in s["verdicts"]}]
    assert not together


# -- during training -------------------------------------------------------------------------------------


def test_a_stall_names_the_rank_outside_its_step_not_the_one_waiting_inside() -> None:
    """Rank 0 stops between steps 12 and 13 (evaluation that does not end); rank 1 waits in step 13's
    all-reduce. Where stacks can be read, the verdict also says where rank 0 is."""
    where = stack_reason() is None
    told = has("GD925", lambda v: not where or "evaluate" in v["message"])
    w = watch(life("stall", "0", "12", "--steps", "400"), told, options=("--hang-after", "5"))
    v = w.verdicts("GD925")[-1]
    assert w.ranks(v) == [0]
    assert v["message"].startswith("rank 0 is outside its step after step 12")
    assert "while rank 1 waits inside step 13" in v["message"]
    if where:
        assert "it is busy in its own code at evaluate (life.py:" in v["message"]
    assert w.verdicts("GD911")  # the stall itself


def test_uneven_inputs_are_named_and_the_rank_left_waiting_is_told_as_a_victim() -> None:
    w = watch(life("uneven"))
    assert w.code == 1
    v = w.verdicts("GD926")[-1]
    assert v["message"].startswith("rank 0 finished its loop after step 3 and exited, while rank 1 went on to step 4")
    failure = w.summary["failure"]  # type: ignore[index]
    assert (failure["rank"], failure["kind"]) == (1, "peer_lost")
    assert failure["line"].endswith("rank 0 had ended its loop after step 3 (uneven steps, GD926)")


# -- crashes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "kind", "exit_code"),
    [("unused", "unused_parameters", 1), ("killed", "killed", -9), ("shuffle", "sampler_shuffle", 1)],
)
def test_a_crashed_rank_is_named_first_with_its_error_and_fix(mode: str, kind: str, exit_code: int) -> None:
    w = watch(life(mode, *(["1"] if mode == "killed" else [])))
    assert w.code == 1
    failure = w.summary["failure"]  # type: ignore[index]
    assert failure["source"] == "torchrun" and failure["kind"] == kind and failure["exit_code"] == exit_code
    assert failure["rank"] in (0, 1) and failure["fix"]
    v = w.verdicts("GD927")[-1]
    assert w.ranks(v) == [failure["rank"]] and v["hint"] == failure["fix"]
    lines = [x for x in w.stderr.splitlines() if x.startswith("gpudoctor: ") and "GD927" in x]
    assert lines == [f"gpudoctor: {failure['line']} (gpudoctor explain GD927)"]
    if mode == "killed":
        assert failure["rank"] == 1 and failure["victims"] == [0]


def test_torchruns_own_port_in_use_is_named_without_a_rank() -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        w = watch(
            life("ok", torchrun=["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)])
        )
    assert w.code == 1
    failure = w.summary["failure"]  # type: ignore[index]
    assert (failure["source"], failure["kind"], failure["rank"]) == ("command", "port_in_use", None)
    assert failure["detail"] == f"port {port}"
    assert failure["line"] == f"the command failed (exit code 1): the rendezvous port is already in use (port {port})"


def test_a_healthy_job_gets_none_of_these_verdicts() -> None:
    w = watch(life("ok", "--steps", "40"), join_after="120")  # a loaded machine takes long to import torch
    assert w.code == 0
    codes = {v["code"] for s in w.samples for v in s["verdicts"]} | {v["code"] for v in w.summary["verdicts"]}  # type: ignore[index]
    assert not codes & {f"GD92{i}" for i in range(8)}, codes
    assert w.summary["failure"] is None  # type: ignore[index]
    ranks = [p for p in w.samples[-1]["job"] if p["role"] == "rank"]
    assert [(p["rank"], p.get("exit"), p.get("step")) for p in ranks] == [(0, "normal", 40), (1, "normal", 40)]
