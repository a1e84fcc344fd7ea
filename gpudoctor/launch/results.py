"""What a launch is asked to run and what it returns: `Task`, each rank's `RankOutcome`, the `LaunchResult`.

A rank's outcome is filled from its events (gpudoctor/launch/protocol.py `apply`) and, after it
is gone, from its exit (gpudoctor/launch/supervise.py). Each task's result is the JSON its
workload returned; the ones the checks read have types (gpudoctor/launch/workload_results.py),
which `LaunchResult.results` and `RankOutcome.result` give to a type checker.

Torch-free, plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

from gpudoctor.launch.protocol import Event, Peer, Stage, reached, step_index

# A rank that failed in these phases had opened no socket yet: no other process could have reached it.
BEFORE_SOCKETS = frozenset({Stage.START.value, Stage.IMPORT.value, Stage.CUDA_INIT.value})

if TYPE_CHECKING:
    from gpudoctor.launch.workload_results import AllreduceResult, CollectivesResult, DdpResult


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
    last_step: str = Event.SPAWNED.value  # the furthest of protocol.STEPS it reported
    phase: str = Stage.START.value  # the last phase it entered
    join_s: float | None = None
    import_s: float | None = None
    shutdown_s: float | None = None
    exit_code: int | None = None
    error: str = ""
    error_kind: str | None = None  # known_errors kind
    log_tail: str = ""
    host: str = ""
    node_rank: int = 0
    results: dict[str, Any] = field(default_factory=dict)  # task name -> its workload's JSON
    durations: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" + (f" (GPU {self.gpu})" if self.gpu is not None else "")

    @overload
    def result(self, task: Literal["allreduce"]) -> AllreduceResult | None: ...
    @overload
    def result(self, task: Literal["ddp"]) -> DdpResult | None: ...
    @overload
    def result(self, task: Literal["collectives"]) -> CollectivesResult | None: ...
    @overload
    def result(self, task: str) -> Any: ...
    def result(self, task: str) -> Any:
        """This rank's result of `task`, or None."""
        return self.results.get(task)

    def hang_reason(self) -> str:
        """What this rank had not done when it was stopped, as a verb phrase."""
        if not reached(self.last_step, Event.IMPORTING):
            return "did not get as far as importing torch"
        if not reached(self.last_step, Event.IMPORTED):
            if self.phase == Stage.CUDA_INIT:
                return "did not finish initialising CUDA"
            return "did not finish importing torch"
        if not reached(self.last_step, Event.JOINED):
            return "did not join the process group"
        return "did not answer"

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
    rendezvous: str  # "file" (one node, FileStore in the private directory), "env" (torchrun/srun)
    timed_out: str | None = None  # the phase whose deadline passed: "import", "join" or "run"
    deadline_s: float | None = None
    setup_error: dict[str, Any] | None = None  # nothing started: {"kind", "message", ...}
    peers: list[Peer] = field(default_factory=list)
    under_launcher: bool = False  # torchrun/srun set up the rendezvous: one rank here, env://
    # Whether the ranks' sockets were out of other local users' reach (launch/netns.py), and how.
    isolated: bool = False
    isolation: str = ""

    @property
    def node_count(self) -> int:
        """How many nodes the process group spans (from the peers every rank gathered; 1 if unknown)."""
        return len({(p.get("host", ""), int(p.get("node_rank", 0))) for p in self.peers}) or 1

    @property
    def ok(self) -> bool:
        return self.setup_error is None and bool(self.ranks) and all(r.state == "done" for r in self.ranks)

    @overload
    def results(self, task: Literal["allreduce"]) -> AllreduceResult | None: ...
    @overload
    def results(self, task: Literal["ddp"]) -> DdpResult | None: ...
    @overload
    def results(self, task: Literal["collectives"]) -> CollectivesResult | None: ...
    @overload
    def results(self, task: str) -> Any: ...  # a JSON object, or None
    def results(self, task: str) -> Any:
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
            # A rank whose error is a timeout/connection loss is usually a victim of another; when
            # another local process could have reset that connection, no rank is blamed for it.
            primary = [r for r in direct if r.error_kind not in ("timeout", "peer_lost")]
            return primary or ([] if self.interference() else direct)
        hung = [r for r in self.ranks if r.state == "hung"]
        if not hung:
            return []
        least = min(step_index(r.last_step) for r in hung)
        return [r for r in hung if step_index(r.last_step) == least]

    def interference(self) -> str:
        """Why a failure of this run may be another process's doing ("" when it cannot be): the
        ranks' sockets were open to other local users (`isolated` False), and a rank that had
        sockets (past import) lost a connection, timed out, hung, or failed unexplained in gloo.
        A known cause (OOM, a busy port, /dev/shm), a CUDA error, or a rank that failed before it
        had a socket (its peers then wait for it) is not put down to it."""
        if self.isolated or self.ok or self.setup_error is not None:
            return ""
        failed = self.failed_ranks()
        if any(r.phase in BEFORE_SOCKETS for r in failed) or not any(
            r.state == "hung"
            or r.error_kind in ("peer_lost", "timeout")
            or (r.error_kind is None and self.backend == "gloo")
            for r in failed
        ):
            return ""
        lost = any(r.error_kind == "peer_lost" for r in self.ranks)
        return (
            ("a connection between the ranks was closed or reset by its peer" if lost else "the run failed")
            + f" while the ranks' sockets were open to every local user ({self.isolation or 'not isolated'}): "
            "another process on this machine may have connected to them, so this may be interference, "
            "not a fault of the ranks"
        )

    def error_kinds(self) -> set[str]:
        return {r.error_kind for r in self.ranks if r.error_kind}

    def report_nodes(self) -> list[dict[str, Any]]:
        """The report's `nodes` rows: under torchrun/srun, and only in global rank 0's report."""
        if not self.under_launcher or not self.peers or not any(r.rank == 0 for r in self.ranks):
            return []
        return self.nodes()

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
            "isolated": self.isolated,
            "isolation": self.isolation,
            "ranks": [r.to_json() for r in self.ranks],
        }
