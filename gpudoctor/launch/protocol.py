"""The parent/rank protocol, defined once: what the parent tells a rank, and what a rank reports back.

Both sides import it: the parent (gpudoctor/launch/supervise.py) writes the rank's spec and reads
its events, the rank (gpudoctor/workloads/rank.py, and the workloads through `RankContext.events`)
reads the spec and writes its events. Neither spells an event name, a spec key or a file name.

Parent -> rank: `RankSpec`, a JSON file in the ranks' private directory (`spec_path`), named on
the rank's command line with its global rank.

Rank -> parent: one JSON object a line in `<outdir>/rank<R>.jsonl` (`events_path`), written only
through `EventWriter`, one typed method per `Event`: {"event": NAME, "t": unix time, ...fields}.
The steps of a rank's life come in the order of `STEPS` (which rank is behind when a deadline
passes): spawned (the parent's own: a rank that has said nothing yet), started, importing (stage
"import", then "cuda_init" on GPUs), imported, joined, peers, phase (once per task, and again
inside a task to name the pair or size it waits on), result (once per task), done. Outside the
order: error (the rank's last word) and progress (a message for the log; no state).

The parent reads a file with `EventReader` (a line may be half written) and folds each event into
the rank's `RankOutcome` with `apply`.

Torch-free and light: a rank writes its first events before it imports torch.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from gpudoctor.launch.results import RankOutcome


class Event(str, Enum):
    """The events a rank reports (the wire's "event" field)."""

    SPAWNED = "spawned"  # never written: the parent's step for a rank that has said nothing yet
    STARTED = "started"
    IMPORTING = "importing"
    IMPORTED = "imported"
    JOINED = "joined"
    PEERS = "peers"
    PHASE = "phase"
    RESULT = "result"
    DONE = "done"
    ERROR = "error"
    PROGRESS = "progress"

    def __str__(self) -> str:
        return self.value


# Ordered steps of a rank's life, to tell which rank is behind when a deadline passes.
STEPS: tuple[Event, ...] = (
    Event.SPAWNED,
    Event.STARTED,
    Event.IMPORTING,
    Event.IMPORTED,
    Event.JOINED,
    Event.PEERS,
    Event.PHASE,
    Event.RESULT,
    Event.DONE,
)


def step_index(step: str) -> int:
    """Where `step` (an Event value) comes in a rank's life."""
    return STEPS.index(step)  # an Event equals the str it names


def reached(step: str, target: Event) -> bool:
    """Whether a rank whose last step is `step` got as far as `target`."""
    return step_index(step) >= STEPS.index(target)


class Stage(str, Enum):
    """The rank's own phases around its tasks (a task's phase is its name): the `importing`
    event's stage and the `error` event's phase."""

    START = "start"
    IMPORT = "import"
    CUDA_INIT = "cuda_init"
    JOIN = "join"
    PEERS = "peers"
    SHUTDOWN = "shutdown"

    def __str__(self) -> str:
        return self.value


JOINED_PHASE = "joined"  # the parent's name for a rank between `joined` and its first task

# A step inside a task that names a pair, so that a hang names it: "<kind>:<a>-<b>" in a `phase`
# event (`EventWriter.pair`), read back by the parent's checks with `pair_in_phase`.
PAIR_SENDRECV = "sendrecv"  # gpudoctor/workloads/collectives.py: send/recv between ranks a and b
PAIR_P2P = "p2p"  # gpudoctor/workloads/link_probes.py: a copy between GPUs (NVML index) a and b


def pair_phase(kind: str, a: int, b: int) -> str:
    return f"{kind}:{a}-{b}"


def pair_in_phase(phase: str, kind: str) -> tuple[int, int] | None:
    """The pair a `pair_phase` of `kind` names, or None for any other phase."""
    head, sep, pair = phase.partition(":")
    a, dash, b = pair.partition("-")
    if head != kind or not sep or not dash or not a.isdigit() or not b.isdigit():
        return None
    return int(a), int(b)


# --- parent -> rank: the spec -------------------------------------------------------------------

RENDEZVOUS_FILE = "file"  # one node: a FileStore in the ranks' private directory
RENDEZVOUS_ENV = "env"  # torchrun/srun set up env:// for us: one rank here


class TaskSpec(TypedDict):
    name: str  # a key of gpudoctor.workloads.WORKLOADS
    params: dict[str, Any]


class Rendezvous(TypedDict, total=False):
    mode: str  # RENDEZVOUS_FILE or RENDEZVOUS_ENV
    path: str  # file: the store's file
    local_rank: int  # env: this rank's place on its node (LOCAL_RANK)
    node_rank: int  # env: the node's rank (GROUP_RANK)


class RankSpec(TypedDict):
    tasks: list[TaskSpec]
    world_size: int
    device: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo"
    rendezvous: Rendezvous
    outdir: str  # the ranks' private directory
    parent_pid: int
    deadline_epoch: float  # the rank's own last resort (time.time())
    op_timeout_s: float  # the process group's timeout


def spec_path(outdir: Path) -> Path:
    return outdir / "spec.json"


def write_spec(outdir: Path, spec: RankSpec) -> Path:
    path = spec_path(outdir)
    path.write_text(json.dumps(spec))
    return path


def read_spec(path: str | Path) -> RankSpec:
    spec: RankSpec = json.loads(Path(path).read_text())
    return spec


def events_path(outdir: str | Path, rank: int) -> Path:
    """The file rank `rank` reports its events in."""
    return Path(outdir) / f"rank{rank}.jsonl"


# --- rank -> parent: the events -----------------------------------------------------------------


class Peer(TypedDict):
    """One rank as every rank sees it after joining (the `peers` event)."""

    rank: int
    local_rank: int
    host: str
    node_rank: int
    device: str  # "cuda:0", "cpu"


class EventWriter:
    """The rank's side: one method per event; each writes one JSON line, flushed at once (the
    parent polls the file). Thread-safe: a workload may report from a helper thread."""

    def __init__(self, path: Path) -> None:
        self._f = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115  (lives as long as the rank)
        self._lock = threading.Lock()

    def _write(self, event: Event, **fields: Any) -> None:
        line = json.dumps({"event": event.value, "t": time.time(), **fields}, default=str)
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()

    def started(self, *, pid: int, rank: int, world_size: int, local_rank: int, host: str, node_rank: int) -> None:
        self._write(
            Event.STARTED,
            pid=pid,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            host=host,
            node_rank=node_rank,
        )

    def importing(self, stage: Stage) -> None:
        self._write(Event.IMPORTING, stage=stage.value)

    def imported(self, *, import_s: float, torch: str) -> None:
        self._write(Event.IMPORTED, import_s=import_s, torch=torch)

    def joined(self, *, join_s: float) -> None:
        self._write(Event.JOINED, join_s=join_s)

    def peers(self, peers: list[Peer]) -> None:
        self._write(Event.PEERS, peers=peers)

    def phase(self, name: str) -> None:
        """Entering a task (its name) or a step inside one (names what a hang waits on)."""
        self._write(Event.PHASE, name=name)

    def pair(self, kind: str, a: int, b: int) -> None:
        """Entering the step of a task that works on one pair (`pair_phase`)."""
        self.phase(pair_phase(kind, a, b))

    def progress(self, message: str) -> None:
        self._write(Event.PROGRESS, message=message)

    def result(self, task: str, data: Any, duration_s: float) -> None:
        self._write(Event.RESULT, task=task, data=data, duration_s=duration_s)

    def error(self, *, phase: str, message: str, traceback: str) -> None:
        self._write(Event.ERROR, phase=str(phase), message=message, traceback=traceback)

    def done(self, *, shutdown_s: float, finished_ranks: list[Any]) -> None:
        self._write(Event.DONE, shutdown_s=shutdown_s, finished_ranks=finished_ranks)


class EventReader:
    """The parent's side: reads a rank's events file incrementally (a line may be half-written)."""

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


def apply(outcome: RankOutcome, ev: Mapping[str, Any], peers: list[Peer]) -> None:
    """Fold one event into the rank's outcome (and the group's peers); an unknown event is ignored."""
    from gpudoctor.knowledge.known_errors import classify  # the parent's alone: the rank never loads it

    try:
        kind = Event(ev.get("event", ""))
    except ValueError:
        return
    if kind in STEPS and STEPS.index(kind) > step_index(outcome.last_step):
        outcome.last_step = kind.value
    if kind is Event.STARTED:
        outcome.pid = ev.get("pid", outcome.pid)
        outcome.host = ev.get("host", "")
        outcome.node_rank = int(ev.get("node_rank", 0))
    elif kind is Event.IMPORTING:
        outcome.phase = ev.get("stage", Stage.IMPORT.value)
    elif kind is Event.IMPORTED:
        outcome.import_s = ev.get("import_s")
        outcome.phase = Stage.JOIN.value
    elif kind is Event.JOINED:
        outcome.join_s = ev.get("join_s")
        outcome.phase = JOINED_PHASE
    elif kind is Event.PEERS:
        peers[:] = ev.get("peers", [])
    elif kind is Event.PHASE:
        outcome.phase = ev.get("name", outcome.phase)
    elif kind is Event.RESULT:
        outcome.results[ev["task"]] = ev.get("data")
        outcome.durations[ev["task"]] = float(ev.get("duration_s", 0.0))
    elif kind is Event.ERROR:
        outcome.state = "error"
        outcome.phase = ev.get("phase", outcome.phase)
        outcome.error = ev.get("message", "")
        outcome.error_kind = classify(outcome.error + "\n" + ev.get("traceback", ""))
    elif kind is Event.DONE:
        outcome.state = "done"
        outcome.shutdown_s = ev.get("shutdown_s")
