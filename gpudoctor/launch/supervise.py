"""The parent side of active checks: start ranks, watch them against deadlines, collect results.

Torch-free: the ranks import torch, the parent never does (and so never creates a CUDA context).

API (for a new workload: one function in gpudoctor/workloads/ listed in WORKLOADS, plus a call):

    from gpudoctor.launch import Task, launch
    result = launch([Task("allreduce", {"sizes": [1 << 20]})], device="cpu", ranks=2,
                    timeout_s=30, progress=print)
    result.ok                     # every rank finished every task
    result.results("allreduce")   # rank 0's result (or result.ranks[r].result("allreduce"))
    result.failed_ranks()         # RankOutcome of ranks that erred, exited, hung or were aborted

The pieces it uses, one concern each: what it returns (launch/results.py), the ranks' environment
and the launcher's variables (launch/environment.py), the parent/rank protocol: the spec a rank
reads and the events it reports (launch/protocol.py), the ranks' private directory
(launch/rundir.py).

Each rank is `python -m gpudoctor.workloads.rank SPEC RANK`, in its own session (so a terminal's
Ctrl-C reaches only gpudoctor, which then stops the ranks), with PR_SET_PDEATHSIG so it dies if
gpudoctor is killed, and its own deadline as a last resort. Call launch() from a thread that
outlives it (PDEATHSIG follows the spawning thread). Ranks report JSON lines in a private temp dir.

Deadlines (`Deadlines`): importing torch (and initialising CUDA) may take up to the whole timeout;
the join clock starts only when every rank has reported `imported`, and the ranks must then
have joined within `join_share` of the timeout (never past the timeout); everything must be
finished within the timeout. So a slow import on a loaded machine is reported as an import that
did not finish (`timed_out == "import"`), not as a rank that could not join. On expiry, or a few
seconds after one rank fails (its peers then wait forever in a collective), every rank's process
group gets SIGTERM, then SIGKILL (gpudoctor.safety.procs.terminate_groups: at most KILL_SEQUENCE_S).

Rendezvous: on one node the ranks meet in a `torch.distributed.FileStore`, a file (0600) in the
ranks' private directory (0700): no other local user can read or write its keys, as anyone could
with a TCPStore on 127.0.0.1 (workloads/rank.py `_store`). No port is used, so a user's
MASTER_PORT is neither needed nor touched (GD221-GD223 judge it for training). Under
torchrun/srun (RANK, WORLD_SIZE, MASTER_ADDR set) this process starts ONE rank, its own, with the
env:// rendezvous that the launcher already set up, so the workload spans every node.

Files: the ranks' directory is removed on every way out (SIGTERM and SIGHUP unwind like Ctrl-C:
`_TermAsInterrupt`, gpudoctor.safety.signals). Without torch nothing starts (`setup_error` kind
"no_torch" names the install).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.errors import UserError
from gpudoctor.knowledge.known_errors import classify
from gpudoctor.launch.environment import LauncherEnvError, launcher_env, rank_env, torch_missing_message
from gpudoctor.launch.netns import Isolation, isolate
from gpudoctor.launch.protocol import (
    JOINED_PHASE,
    RENDEZVOUS_ENV,
    RENDEZVOUS_FILE,
    Event,
    EventReader,
    Peer,
    RankSpec,
    Rendezvous,
    apply,
    events_path,
    reached,
    write_spec,
)
from gpudoctor.launch.results import LaunchResult, RankOutcome, Task
from gpudoctor.launch.rundir import RANK_DIR_PREFIX, hold_run_lock, log_path, private_store, sweep_leftovers
from gpudoctor.safety.procs import REAP_S, TERM_GRACE_S, terminate_groups
from gpudoctor.safety.signals import Stopped, deferred

if TYPE_CHECKING:
    import subprocess

# Imported where ranks start, not here: `check --quick` never starts a rank, and every import is
# start-up time.

GRACE_AFTER_FAILURE_S = 3.0  # how long peers of a failed rank get to report before we stop them
TERM_WAIT_S = TERM_GRACE_S  # between SIGTERM and SIGKILL
# After a deadline: one poll, SIGTERM, up to TERM_WAIT_S of grace, SIGKILL, up to REAP_S to reap.
KILL_SEQUENCE_S = TERM_WAIT_S + REAP_S
POLL_S = 0.05
HEARTBEAT_S = 5.0


@dataclass
class Deadlines:
    """When each phase of a launch runs out (monotonic seconds).

    Import (torch, CUDA init) may use the whole timeout; the join window (`join_share` of the
    timeout) opens when the last rank reports `imported`; everything ends at the timeout.
    """

    start: float
    timeout_s: float
    join_share: float = 0.6
    imported_at: float | None = None  # when every rank had reported `imported`
    # The workloads' own budget, counted from when every rank is ready (joined): a run that needs
    # seconds should not lose them to a cold torch import or CUDA start (link probes on a cold VM).
    run_s: float | None = None
    joined_at: float | None = None

    @property
    def end(self) -> float:
        end = self.start + self.timeout_s
        if self.run_s is not None and self.joined_at is not None:
            end = min(end, self.joined_at + self.run_s)
        return end

    @property
    def join_deadline(self) -> float | None:
        if self.imported_at is None:
            return None
        return min(self.imported_at + self.timeout_s * self.join_share, self.end)

    def expired(self, outcomes: Sequence[RankOutcome], now: float) -> str | None:
        """The phase whose deadline has passed ("import", "join", "run"), or None."""
        if self.imported_at is None and all(reached(o.last_step, Event.IMPORTED) for o in outcomes):
            self.imported_at = now
        joined = all(reached(o.last_step, Event.JOINED) for o in outcomes)
        if joined and self.joined_at is None:
            self.joined_at = now
        if now > self.end:
            if self.imported_at is None:
                return "import"
            return "run" if joined else "join"
        join_deadline = self.join_deadline
        if join_deadline is not None and now > join_deadline and not joined:
            return "join"
        return None


class _TermAsInterrupt:
    """While ranks run, SIGTERM and SIGHUP to gpudoctor unwind like Ctrl-C so the ranks get
    stopped (gpudoctor's CLI installs the same for its whole run: gpudoctor.safety.signals)."""

    def __enter__(self) -> None:
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    self._old[sig] = signal.signal(sig, self._raise)

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def launch(
    tasks: list[Task],
    *,
    device: str = "cpu",
    ranks: int = 2,
    timeout_s: float = 120.0,
    gpus: list[int] | None = None,
    gpu_uuids: list[str] | None = None,
    progress: Callable[[str], None] = lambda message: None,
    environ: Mapping[str, str] | None = None,
    join_share: float = 0.6,
    run_s: float | None = None,
    python: str | None = None,
) -> LaunchResult:
    """Run `tasks` in `ranks` spawned ranks (one per GPU for device="cuda"); never hangs.

    `run_s`: the tasks' own budget, from when every rank has joined (never past `timeout_s`, which
    bounds the whole launch: import, CUDA start and join included).

    `gpus`: the physical GPU (NVML index) of each CUDA device, in rank order, to name ranks in
    reports. `gpu_uuids`: the same GPUs' UUIDs; on one node the ranks see exactly these, in this
    order (`rank_env`), so cuda:i is gpus[i]. `python`: the interpreter the ranks run in (--python:
    the training environment's, which imports this gpudoctor through a link, probe/interpreter.py);
    None: this one.
    """
    import shutil
    import subprocess
    import tempfile

    env = dict(os.environ if environ is None else environ)
    backend = "nccl" if device == "cuda" else "gloo"
    start = time.monotonic()
    try:
        no_torch = torch_missing_message(python)
    except UserError as exc:  # --python names no usable interpreter (the pipeline refuses it first)
        return _setup_failed(device, backend, ranks, start, "bad_python", str(exc))
    if no_torch is not None:
        return _setup_failed(device, backend, ranks, start, "no_torch", no_torch)
    try:
        launcher = launcher_env(env)
    except LauncherEnvError as exc:
        return _setup_failed(device, backend, ranks, start, "bad_launcher_env", str(exc))
    multi = launcher is not None
    rdzv: Rendezvous
    if launcher is not None:
        world = launcher.world_size
        local = [launcher.local_rank]
        rank_ids = [launcher.rank]
        rdzv = {"mode": RENDEZVOUS_ENV, "local_rank": launcher.local_rank, "node_rank": launcher.node_rank}
    else:
        world = ranks
        local = list(range(ranks))
        rank_ids = list(range(ranks))
        rdzv = {"mode": RENDEZVOUS_FILE}

    env = rank_env(env, device=device, gpu_uuids=gpu_uuids, under_launcher=multi)
    outcomes = [
        RankOutcome(r, lr, (gpus[lr] if gpus and lr < len(gpus) else None) if device == "cuda" else None)
        for r, lr in zip(rank_ids, local, strict=True)
    ]
    procs: list[subprocess.Popen[bytes]] = []
    peers: list[Peer] = []
    timed_out = None
    outdir: Path | None = None
    lock_fd: int | None = None
    isolation = Isolation(None, "the ranks ran in the machine's network namespace")
    try:
        with _TermAsInterrupt():
            if device == "cpu" and not multi:  # one node's CPU ranks: out of other users' reach
                with deferred():  # (a Ctrl-C here is acted on once the holder is ours to close)
                    isolation = isolate()
                if isolation.active:
                    env["GLOO_SOCKET_IFNAME"] = "lo"  # the namespace's only interface (whatever the host's is)
            # Private (mkdtemp: 0700, an unpredictable name) and removed on every way out: the
            # ranks' reports, logs and the rendezvous store live here.
            sweep_leftovers(Path(tempfile.gettempdir()))
            outdir = Path(tempfile.mkdtemp(prefix=RANK_DIR_PREFIX))
            lock_fd = hold_run_lock(outdir)
            if not multi:
                rdzv["path"] = str(private_store(outdir))
            spec: RankSpec = {
                "tasks": [{"name": t.name, "params": t.params} for t in tasks],
                "world_size": world,
                "device": device,
                "backend": backend,
                "rendezvous": rdzv,
                "outdir": str(outdir),
                "parent_pid": os.getpid(),
                "deadline_epoch": time.time() + timeout_s,
                "op_timeout_s": max(1.0, timeout_s),
            }
            spec_file = write_spec(outdir, spec)
            interpreter = sys.executable
            if python is not None:  # the training environment's Python imports this gpudoctor through a link
                from gpudoctor.probe.interpreter import link_package, python_env

                interpreter = python
                env = python_env(env, link_package(outdir))
            # A Ctrl-C inside Popen would leave a started rank that no list holds (Popen never
            # returned it): the spawning is not interrupted; a stop signal is acted on right after.
            with deferred():
                for o in outcomes:
                    log = open(log_path(outdir, o.rank), "wb")  # noqa: SIM115  (closed right after Popen)
                    try:
                        p = subprocess.Popen(
                            [
                                *isolation.prefix(),
                                interpreter,
                                "-m",
                                "gpudoctor.workloads.rank",
                                str(spec_file),
                                str(o.rank),
                            ],
                            stdin=subprocess.DEVNULL,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            env=env,
                            start_new_session=True,
                        )
                    finally:
                        log.close()
                    procs.append(p)
                    o.pid = p.pid
            deadlines = Deadlines(start, timeout_s, join_share, run_s=run_s)
            timed_out = _supervise(outcomes, procs, outdir, peers, deadlines, progress, tasks)
    finally:
        # A second Ctrl-C, SIGTERM or SIGHUP waits until the ranks are stopped and their files gone.
        with deferred():
            stopped = terminate_groups(procs)
            isolation.close()
            if outdir is not None:
                _collect(outcomes, procs, outdir, peers, stopped)
                shutil.rmtree(outdir, ignore_errors=True)
            if lock_fd is not None:
                os.close(lock_fd)
    return LaunchResult(
        device=device,
        backend=backend,
        world_size=world,
        ranks=outcomes,
        elapsed_s=time.monotonic() - start,
        rendezvous=rdzv["mode"],
        timed_out=timed_out,
        deadline_s=timeout_s,
        peers=peers,
        under_launcher=multi,
        isolated=isolation.active,
        isolation=isolation.note,
    )


def _setup_failed(
    device: str, backend: str, world: int, start: float, kind: str, message: str, **extra: Any
) -> LaunchResult:
    return LaunchResult(
        device,
        backend,
        world,
        [],
        time.monotonic() - start,
        "none",
        setup_error={"kind": kind, "message": message, **extra},
    )


def _supervise(
    outcomes: list[RankOutcome],
    procs: list[subprocess.Popen[bytes]],
    outdir: Path,
    peers: list[Peer],
    deadlines: Deadlines,
    progress: Callable[[str], None],
    tasks: list[Task],
) -> str | None:
    """Poll the ranks until all end; returns the phase whose deadline passed, if one did."""
    readers = [EventReader(events_path(outdir, o.rank)) for o in outcomes]
    start, timeout_s = deadlines.start, deadlines.timeout_s
    failed_at: float | None = None
    shown = ""
    last_beat = start
    names = ", ".join(t.name for t in tasks)
    progress(f"starting {len(procs)} rank(s) for {names} (deadline {timeout_s:.0f} s)")
    while True:
        for o, reader in zip(outcomes, readers, strict=True):
            for ev in reader.read():
                apply(o, ev, peers)
        now = time.monotonic()
        phase = _common_phase(outcomes)
        if phase != shown or now - last_beat >= HEARTBEAT_S:
            progress(f"{phase} ({now - start:.1f} s)")
            shown, last_beat = phase, now
        if all(p.poll() is not None for p in procs):
            return None
        if failed_at is None and any(
            (p.poll() is not None and o.state != "done") or o.state == "error"
            for o, p in zip(outcomes, procs, strict=True)
        ):
            failed_at = now
        if failed_at is not None and now - failed_at > GRACE_AFTER_FAILURE_S:
            return None
        expired = deadlines.expired(outcomes, now)
        if expired is not None:
            return expired
        time.sleep(POLL_S)


def _common_phase(outcomes: list[RankOutcome]) -> str:
    if not all(reached(o.last_step, Event.IMPORTED) for o in outcomes):
        ready = sum(1 for o in outcomes if reached(o.last_step, Event.IMPORTED))
        return f"importing torch: {ready}/{len(outcomes)} rank(s) ready"
    if not all(reached(o.last_step, Event.JOINED) for o in outcomes):
        joined = sum(1 for o in outcomes if reached(o.last_step, Event.JOINED))
        return f"joining the process group: {joined}/{len(outcomes)} rank(s) joined"
    phases = sorted({o.phase for o in outcomes if o.state != "done"})
    if not phases:
        return "finished"
    tasks = [p for p in phases if p != JOINED_PHASE]  # a rank between its join and its first task runs none
    if not tasks:
        return "every rank joined: starting the tasks"
    return "running " + ", ".join(tasks)


def _collect(
    outcomes: list[RankOutcome],
    procs: list[subprocess.Popen[bytes]],
    outdir: Path,
    peers: list[Peer],
    stopped: set[int],
) -> None:
    """Final reading after every rank is gone: decide each rank's state."""
    from gpudoctor.safety.redact import text as redact_text

    any_direct_failure = False
    for o in outcomes[len(procs) :]:  # a spawn that failed (fork, exec) left the later ranks unstarted
        o.state, o.last_step, o.error = "aborted", Event.SPAWNED.value, "not started"
    for o, p in zip(outcomes, procs, strict=False):
        for ev in EventReader(events_path(outdir, o.rank)).read():
            apply(o, ev, peers)
        o.exit_code = p.returncode
        try:
            o.log_tail = log_path(outdir, o.rank).read_bytes()[-3000:].decode("utf-8", "replace")
        except OSError:
            o.log_tail = ""
        if o.state in ("done", "error"):
            if o.state == "error" and not o.error_kind:
                o.error_kind = classify(o.log_tail)
        elif p.pid not in stopped:
            o.state = "exited"
            how = f"was killed by signal {-p.returncode}" if p.returncode < 0 else f"exited with status {p.returncode}"
            o.error = f"{how} in phase {o.phase}"
            o.error_kind = classify(o.log_tail)
        else:
            o.state = "unfinished"
        if o.state in ("error", "exited"):
            any_direct_failure = True
    for o in outcomes:
        # What a rank printed can hold the environment (NCCL_DEBUG=INFO echoes NCCL_IB_HCA, torch
        # names MASTER_ADDR): it goes into findings, so it is redacted like any other text.
        o.error = redact_text(o.error)
        o.log_tail = redact_text(o.log_tail)
        if o.state == "unfinished":
            o.state = "aborted" if any_direct_failure else "hung"
            if not o.error:
                o.error = (
                    f"{o.hang_reason()} (phase {o.phase})"
                    if o.state == "hung"
                    else (f"stopped in phase {o.phase} after another rank failed")
                )
