"""The parent side of active checks: start ranks, watch them against deadlines, collect results.

Torch-free: the ranks import torch, the parent never does (and so never creates a CUDA context).

API (for a new workload: one function in gpudoctor/workloads/ listed in WORKLOADS, plus a call):

    from gpudoctor.launch import Task, launch
    result = launch([Task("allreduce", {"sizes": [1 << 20]})], device="cpu", ranks=2,
                    timeout_s=30, progress=print)
    result.ok                     # every rank finished every task
    result.results("allreduce")   # rank 0's result dict (or result.ranks[r].results[...])
    result.failed_ranks()         # RankOutcome of ranks that erred, exited, hung or were aborted

Each rank is `python -m gpudoctor.workloads.rank`, in its own session (so a terminal's Ctrl-C
reaches only gpudoctor, which then stops the ranks), with PR_SET_PDEATHSIG so it dies if
gpudoctor is killed, and its own deadline as a last resort. Call launch() from a thread that
outlives it (PDEATHSIG follows the spawning thread). Ranks report JSON lines in a private temp dir.

Deadlines: the ranks must all have joined the group within `join_share` of the timeout, and
finished within the timeout. On expiry, or a few seconds after one rank fails (its peers then
wait forever in a collective), every rank's process group gets SIGTERM, then SIGKILL.

Rendezvous: rank 0 binds a TCPStore to port 0 (or to MASTER_PORT when the user set it and it is
free; when it is busy, nothing starts and `setup_error` names the holder). Under torchrun/srun
(RANK, WORLD_SIZE, MASTER_ADDR set) this process starts ONE rank, its own, with the env://
rendezvous that the launcher already set up, so the workload spans every node.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.workloads.known_errors import classify

GRACE_AFTER_FAILURE_S = 3.0  # how long peers of a failed rank get to report before we stop them
TERM_WAIT_S = 2.0  # between SIGTERM and SIGKILL
POLL_S = 0.05
HEARTBEAT_S = 5.0

# Ordered steps of a rank's life, to tell which rank is behind when a deadline passes.
_STEPS = ["spawned", "started", "imported", "joined", "peers", "phase", "result", "done"]


@dataclass(frozen=True)
class Task:
    name: str  # a key of gpudoctor.workloads.WORKLOADS
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class RankOutcome:
    rank: int
    local_rank: int
    gpu: int | None  # the physical GPU (NVML index) this rank drives, where known
    pid: int | None = None
    # "done", "error" (reported an exception), "exited" (died without a word), "hung" (did not
    # answer by the deadline), "aborted" (stopped by us after another rank failed)
    state: str = "spawned"
    last_step: str = "spawned"
    phase: str = "start"  # the last phase it entered
    join_s: float | None = None
    import_s: float | None = None
    shutdown_s: float | None = None
    exit_code: int | None = None
    error: str = ""
    error_kind: str | None = None  # known_errors kind
    log_tail: str = ""
    host: str = ""
    node_rank: int = 0
    results: dict[str, Any] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" + (f" (GPU {self.gpu})" if self.gpu is not None else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "gpu": self.gpu,
            "pid": self.pid,
            "host": self.host,
            "state": self.state,
            "phase": self.phase,
            "join_s": _round(self.join_s),
            "exit_code": self.exit_code,
            "error": self.error[:500],
            "error_kind": self.error_kind,
        }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


@dataclass
class LaunchResult:
    device: str
    backend: str
    world_size: int
    ranks: list[RankOutcome]
    elapsed_s: float
    rendezvous: str  # "tcpstore:port0", "master_port:29500", "env"
    timed_out: str | None = None  # the phase whose deadline passed: "join" or "run"
    deadline_s: float | None = None
    setup_error: dict[str, Any] | None = None  # nothing started: {"kind", "message", ...}
    peers: list[dict[str, Any]] = field(default_factory=list)
    multi_node: bool = False

    @property
    def ok(self) -> bool:
        return self.setup_error is None and bool(self.ranks) and all(r.state == "done" for r in self.ranks)

    def results(self, task: str) -> dict[str, Any] | None:
        """Rank 0's result of `task` (every rank computes the group-wide verdicts alike)."""
        for r in sorted(self.ranks, key=lambda r: r.rank):
            if task in r.results:
                return r.results[task]
        return None

    def failed_ranks(self) -> list[RankOutcome]:
        return [r for r in self.ranks if r.state != "done"]

    def suspects(self) -> list[RankOutcome]:
        """The ranks that caused the failure: those that erred or exited, else the hung ranks
        that got least far (their peers wait for them inside a collective)."""
        direct = [r for r in self.ranks if r.state in ("error", "exited")]
        if direct:
            # A rank whose error is a timeout/connection loss is usually a victim of another.
            primary = [r for r in direct if r.error_kind not in ("timeout", "peer_lost")] or direct
            return primary
        hung = [r for r in self.ranks if r.state == "hung"]
        if not hung:
            return []
        least = min(_STEPS.index(r.last_step) for r in hung)
        return [r for r in hung if _STEPS.index(r.last_step) == least]

    def error_kinds(self) -> set[str]:
        return {r.error_kind for r in self.ranks if r.error_kind}

    def nodes(self) -> list[dict[str, Any]]:
        """One row per node (hostname + node rank) from the peers rank 0 saw."""
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        states = {r.rank: r.state for r in self.ranks}
        for p in self.peers:
            key = (p["host"], int(p.get("node_rank", 0)))
            row = rows.setdefault(
                key, {"hostname": key[0], "node_rank": key[1], "ranks": [], "gpus": [], "status": "ok"}
            )
            row["ranks"].append(p["rank"])
            if p.get("device", "cpu").startswith("cuda"):
                row["gpus"].append(p.get("local_rank", 0))
            local_state = states.get(p["rank"])
            finished = self.ok or (local_state == "done")
            if not finished and local_state is not None:
                row["status"] = local_state
            elif not finished and not self.ok:
                row["status"] = "unknown"
        return sorted(rows.values(), key=lambda r: r["node_rank"])

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "backend": self.backend,
            "world_size": self.world_size,
            "rendezvous": self.rendezvous,
            "elapsed_s": round(self.elapsed_s, 3),
            "timed_out": self.timed_out,
            "setup_error": self.setup_error,
            "ranks": [r.to_json() for r in self.ranks],
        }


def torchrun_env(environ: Mapping[str, str]) -> bool:
    """True when a launcher (torchrun, srun + env) already set up a rendezvous for us."""
    return all(k in environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


class _Reader:
    """Reads a rank's JSON-lines file incrementally (a line may be half-written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self._buf = ""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self._pos)
                chunk = f.read()
                self._pos = f.tell()
        except FileNotFoundError:
            return []
        self._buf += chunk
        *lines, self._buf = self._buf.split("\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


def _apply(outcome: RankOutcome, ev: dict[str, Any], peers: list[dict[str, Any]]) -> None:
    kind = ev.get("event", "")
    if kind in _STEPS and _STEPS.index(kind) > _STEPS.index(outcome.last_step):
        outcome.last_step = kind
    if kind == "started":
        outcome.pid = ev.get("pid", outcome.pid)
        outcome.host = ev.get("host", "")
        outcome.node_rank = int(ev.get("node_rank", 0))
    elif kind == "imported":
        outcome.import_s = ev.get("import_s")
        outcome.phase = "join"
    elif kind == "joined":
        outcome.join_s = ev.get("join_s")
        outcome.phase = "joined"
    elif kind == "peers":
        peers[:] = ev.get("peers", [])
    elif kind == "phase":
        outcome.phase = ev.get("name", outcome.phase)
    elif kind == "result":
        outcome.results[ev["task"]] = ev.get("data")
        outcome.durations[ev["task"]] = float(ev.get("duration_s", 0.0))
    elif kind == "error":
        outcome.state = "error"
        outcome.phase = ev.get("phase", outcome.phase)
        outcome.error = ev.get("message", "")
        outcome.error_kind = classify(outcome.error + "\n" + ev.get("traceback", ""))
    elif kind == "done":
        outcome.state = "done"
        outcome.shutdown_s = ev.get("shutdown_s")


def _kill_groups(procs: list[subprocess.Popen[bytes]]) -> set[int]:
    """SIGTERM every live rank's process group, wait a little, then SIGKILL; reap them all.

    Returns the PIDs of the ranks that were still running (stopped by us, not dead by themselves).
    """
    stopped = {p.pid for p in procs if p.poll() is None}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + TERM_WAIT_S
        while any(p.poll() is None for p in live) and time.monotonic() < end:
            time.sleep(0.02)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    # The group may hold grandchildren whose leader is gone; make sure they go too.
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return stopped


class _TermAsInterrupt:
    """While ranks run, SIGTERM to gpudoctor unwinds like Ctrl-C so the ranks get stopped."""

    def __enter__(self) -> None:
        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._raise)

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def launch(
    tasks: list[Task],
    *,
    device: str = "cpu",
    ranks: int = 2,
    timeout_s: float = 120.0,
    gpus: list[int] | None = None,
    progress: Callable[[str], None] = lambda message: None,
    environ: Mapping[str, str] | None = None,
    join_share: float = 0.6,
) -> LaunchResult:
    """Run `tasks` in `ranks` spawned ranks (one per GPU for device="cuda"); never hangs.

    `gpus`: the physical GPU index each local rank drives, used only to name ranks in reports.
    """
    from gpudoctor.probe.ports import check_port

    env = dict(os.environ if environ is None else environ)
    backend = "nccl" if device == "cuda" else "gloo"
    start = time.monotonic()
    multi = torchrun_env(env)
    if multi:
        local = [int(env.get("LOCAL_RANK", "0"))]
        world = int(env["WORLD_SIZE"])
        rank_ids = [int(env["RANK"])]
        rendezvous = "env"
        host, port = "", 0
    else:
        world = ranks
        local = list(range(ranks))
        rank_ids = list(range(ranks))
        host = "127.0.0.1"
        port = 0
        rendezvous = "tcpstore:port0"
        if env.get("MASTER_PORT"):
            try:
                port = int(env["MASTER_PORT"])
            except ValueError:
                port = -1
            if not 0 < port < 65536:
                return _setup_failed(
                    device,
                    backend,
                    world,
                    start,
                    "bad_port",
                    f"MASTER_PORT={env['MASTER_PORT']!r} is not a port number",
                )
            status = check_port(host, port)
            if not status.free:
                holder = (
                    f"PID {status.holder_pid} ({status.holder_command})" if status.holder_pid else "another process"
                )
                return _setup_failed(
                    device,
                    backend,
                    world,
                    start,
                    "port_in_use",
                    f"MASTER_PORT {port} is already in use by {holder}",
                    port=port,
                    holder_pid=status.holder_pid,
                    holder_command=status.holder_command,
                )
            rendezvous = f"master_port:{port}"

    outdir = Path(tempfile.mkdtemp(prefix="gpudoctor-ranks-"))
    deadline = time.time() + timeout_s
    spec = {
        "tasks": [{"name": t.name, "params": t.params} for t in tasks],
        "world_size": world,
        "device": device,
        "backend": backend,
        "rendezvous": {"mode": "env"}
        if multi
        else {"mode": "tcpstore", "host": host, "port": port, "port_file": str(outdir / "store.port")},
        "outdir": str(outdir),
        "parent_pid": os.getpid(),
        "deadline_epoch": deadline,
        "op_timeout_s": max(1.0, timeout_s),
    }
    (outdir / "spec.json").write_text(json.dumps(spec))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    outcomes = [
        RankOutcome(r, lr, (gpus[lr] if gpus and lr < len(gpus) else None) if device == "cuda" else None)
        for r, lr in zip(rank_ids, local, strict=True)
    ]
    procs: list[subprocess.Popen[bytes]] = []
    peers: list[dict[str, Any]] = []
    timed_out = None
    stopped: set[int] = set()
    try:
        with _TermAsInterrupt():
            for o in outcomes:
                log = open(outdir / f"rank{o.rank}.log", "wb")  # noqa: SIM115  (closed right after Popen)
                try:
                    p = subprocess.Popen(
                        [sys.executable, "-m", "gpudoctor.workloads.rank", str(outdir / "spec.json"), str(o.rank)],
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
            timed_out = _supervise(outcomes, procs, outdir, peers, start, timeout_s, join_share, progress, tasks)
    finally:
        stopped = _kill_groups(procs)
        _collect(outcomes, procs, outdir, peers, stopped)
        shutil.rmtree(outdir, ignore_errors=True)
    return LaunchResult(
        device=device,
        backend=backend,
        world_size=world,
        ranks=outcomes,
        elapsed_s=time.monotonic() - start,
        rendezvous=rendezvous,
        timed_out=timed_out,
        deadline_s=timeout_s,
        peers=peers,
        multi_node=multi,
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
    peers: list[dict[str, Any]],
    start: float,
    timeout_s: float,
    join_share: float,
    progress: Callable[[str], None],
    tasks: list[Task],
) -> str | None:
    """Poll the ranks until all end; returns the phase whose deadline passed, if one did."""
    readers = [_Reader(outdir / f"rank{o.rank}.jsonl") for o in outcomes]
    join_deadline = start + timeout_s * join_share
    run_deadline = start + timeout_s
    failed_at: float | None = None
    shown = ""
    last_beat = start
    names = ", ".join(t.name for t in tasks)
    progress(f"starting {len(procs)} rank(s) for {names} (deadline {timeout_s:.0f} s)")
    while True:
        for o, reader in zip(outcomes, readers, strict=True):
            for ev in reader.read():
                _apply(o, ev, peers)
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
        if now > run_deadline:
            return "run"
        if now > join_deadline and any(_STEPS.index(o.last_step) < _STEPS.index("joined") for o in outcomes):
            return "join"
        time.sleep(POLL_S)


def _common_phase(outcomes: list[RankOutcome]) -> str:
    if any(_STEPS.index(o.last_step) < _STEPS.index("joined") for o in outcomes):
        joined = sum(1 for o in outcomes if _STEPS.index(o.last_step) >= _STEPS.index("joined"))
        return f"joining the process group: {joined}/{len(outcomes)} rank(s) joined"
    phases = sorted({o.phase for o in outcomes if o.state != "done"})
    if not phases:
        return "finished"
    return "running " + ", ".join(phases)


def _collect(
    outcomes: list[RankOutcome],
    procs: list[subprocess.Popen[bytes]],
    outdir: Path,
    peers: list[dict[str, Any]],
    stopped: set[int],
) -> None:
    """Final reading after every rank is gone: decide each rank's state."""
    any_direct_failure = False
    for o, p in zip(outcomes, procs, strict=True):
        for ev in _Reader(outdir / f"rank{o.rank}.jsonl").read():
            _apply(o, ev, peers)
        o.exit_code = p.returncode
        try:
            o.log_tail = (outdir / f"rank{o.rank}.log").read_bytes()[-3000:].decode("utf-8", "replace")
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
        if o.state == "unfinished":
            o.state = "aborted" if any_direct_failure else "hung"
            if not o.error:
                o.error = (
                    f"did not answer in phase {o.phase}"
                    if o.state == "hung"
                    else (f"stopped in phase {o.phase} after another rank failed")
                )
