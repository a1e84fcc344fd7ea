"""The parent/rank protocol (gpudoctor/launch/protocol.py), both sides at once, without spawning ranks:
every event written by the rank's writer is read back and applied by the parent."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from gpudoctor.launch.protocol import (
    PAIR_P2P,
    PAIR_SENDRECV,
    STEPS,
    Event,
    EventReader,
    EventWriter,
    Peer,
    RankSpec,
    Stage,
    apply,
    events_path,
    pair_in_phase,
    read_spec,
    write_spec,
)
from gpudoctor.launch.results import LaunchResult, RankOutcome
from tests.paths import REPO

PEER: Peer = {"rank": 0, "local_rank": 0, "host": "node-a", "node_rank": 1, "device": "cpu"}


def write_every_event(w: EventWriter) -> None:
    """A rank's whole life, in order, with every event the writer has."""
    w.started(pid=4242, rank=0, world_size=2, local_rank=0, host="node-a", node_rank=1)
    w.importing(Stage.IMPORT)
    w.importing(Stage.CUDA_INIT)
    w.imported(import_s=1.5, torch="2.5.1")
    w.joined(join_s=0.25)
    w.peers([PEER])
    w.phase("allreduce")
    w.progress("all-reduce 1048576 bytes")
    w.result("allreduce", {"rows": [{"bytes": 1 << 20, "wrong": 0}]}, 0.75)
    w.done(shutdown_s=0.125, finished_ranks=[0, 1])
    w.error(phase="allreduce", message="RuntimeError: boom", traceback="Traceback ...")


def test_every_event_round_trips_from_the_writer_through_the_parents_reader_and_apply(tmp_path: Path) -> None:
    path = events_path(tmp_path, 0)
    assert path == tmp_path / "rank0.jsonl"
    write_every_event(EventWriter(path))
    events = EventReader(path).read()
    assert [e["event"] for e in events] == [
        "started",
        "importing",
        "importing",
        "imported",
        "joined",
        "peers",
        "phase",
        "progress",
        "result",
        "done",
        "error",
    ]

    outcome = RankOutcome(0, 0, None)
    peers: list[Peer] = []
    seen: list[tuple[str, str, str]] = []  # (event, last_step, phase) after each
    for ev in events:
        apply(outcome, ev, peers)
        seen.append((ev["event"], outcome.last_step, outcome.phase))
    assert seen[:3] == [
        ("started", "started", "start"),
        ("importing", "importing", "import"),
        ("importing", "importing", "cuda_init"),
    ]
    assert seen[3:7] == [
        ("imported", "imported", "join"),
        ("joined", "joined", "joined"),
        ("peers", "peers", "joined"),
        ("phase", "phase", "allreduce"),
    ]
    assert seen[7] == ("progress", "phase", "allreduce")  # a message only: no step, no state
    assert outcome.pid == 4242 and outcome.host == "node-a" and outcome.node_rank == 1
    assert outcome.import_s == 1.5 and outcome.join_s == 0.25 and outcome.shutdown_s == 0.125
    assert peers == [PEER]
    assert outcome.results == {"allreduce": {"rows": [{"bytes": 1 << 20, "wrong": 0}]}}
    assert outcome.result("allreduce") == outcome.results["allreduce"] and outcome.result("ddp") is None
    assert outcome.durations == {"allreduce": 0.75}
    # done, then the error the test wrote last: the last word wins, as it did
    assert outcome.last_step == "done"
    assert outcome.state == "error" and outcome.error == "RuntimeError: boom" and outcome.phase == "allreduce"

    result = LaunchResult("cpu", "gloo", 2, [outcome], 1.0, "file", peers=peers)
    assert result.results("allreduce") == outcome.results["allreduce"] and result.node_count == 1


def test_every_step_the_parent_orders_is_one_the_writer_emits(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    write_every_event(EventWriter(path))
    written = {e["event"] for e in EventReader(path).read()}
    assert STEPS[0] is Event.SPAWNED and Event.SPAWNED.value not in written  # the parent's own step
    assert {s.value for s in STEPS[1:]} <= written
    assert written == {e.value for e in Event} - {Event.SPAWNED.value}
    # ... and one writer method per event, named as the event
    for event in Event:
        assert callable(getattr(EventWriter, event.value, None)) == (event is not Event.SPAWNED), event


def test_the_wire_format_is_unchanged(tmp_path: Path) -> None:
    """The JSON lines are what the ranks wrote before the protocol had one definition."""
    path = tmp_path / "rank0.jsonl"
    write_every_event(EventWriter(path))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    keys = {line["event"]: [k for k in line if k != "t"] for line in reversed(lines)}  # the first of each
    assert keys == {
        "started": ["event", "pid", "rank", "world_size", "local_rank", "host", "node_rank"],
        "importing": ["event", "stage"],
        "imported": ["event", "import_s", "torch"],
        "joined": ["event", "join_s"],
        "peers": ["event", "peers"],
        "phase": ["event", "name"],
        "progress": ["event", "message"],
        "result": ["event", "task", "data", "duration_s"],
        "done": ["event", "shutdown_s", "finished_ranks"],
        "error": ["event", "phase", "message", "traceback"],
    }
    assert all(isinstance(line["t"], float) for line in lines)
    assert [line["stage"] for line in lines if line["event"] == "importing"] == ["import", "cuda_init"]


def test_a_stage_the_rank_writes_is_the_one_the_parent_reads_when_it_hangs(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    w = EventWriter(path)
    w.started(pid=1, rank=0, world_size=2, local_rank=0, host="h", node_rank=0)
    w.importing(Stage.IMPORT)
    reader, outcome = EventReader(path), RankOutcome(0, 0, None)
    for ev in reader.read():
        apply(outcome, ev, [])
    assert outcome.hang_reason() == "did not finish importing torch"
    w.importing(Stage.CUDA_INIT)
    for ev in reader.read():
        apply(outcome, ev, [])
    assert outcome.hang_reason() == "did not finish initialising CUDA"


def test_a_pair_the_rank_names_is_the_pair_the_parent_reads(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    w = EventWriter(path)
    w.pair(PAIR_P2P, 3, 5)
    outcome = RankOutcome(0, 0, None)
    for ev in EventReader(path).read():
        apply(outcome, ev, [])
    assert outcome.phase == "p2p:3-5"  # as the ranks wrote it before
    assert pair_in_phase(outcome.phase, PAIR_P2P) == (3, 5)
    assert pair_in_phase(outcome.phase, PAIR_SENDRECV) is None
    assert pair_in_phase("sendrecv:0-12", PAIR_SENDRECV) == (0, 12)
    for other in ("link_p2p", "p2p", "p2p:", "p2p:3", "p2p:a-b", "scaling cnn on 2 GPUs"):
        assert pair_in_phase(other, PAIR_P2P) is None, other


def test_the_reader_waits_for_a_half_written_line_and_skips_unknown_events(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    reader = EventReader(path)
    assert reader.read() == []  # no file yet
    line = json.dumps({"event": "joined", "t": 1.0, "join_s": 0.5})
    path.write_text('{"event": "from-a-newer-rank", "t": 0.5}\nnot json\n' + line[:10])
    first = reader.read()
    assert first == [{"event": "from-a-newer-rank", "t": 0.5}]
    with open(path, "a") as f:
        f.write(line[10:] + "\n")
    second = reader.read()
    assert second == [{"event": "joined", "t": 1.0, "join_s": 0.5}]
    outcome = RankOutcome(0, 0, None)
    for ev in first + second:
        apply(outcome, ev, [])
    assert outcome.last_step == "joined" and outcome.join_s == 0.5 and outcome.state == "spawned"


def test_the_spec_round_trips(tmp_path: Path) -> None:
    spec: RankSpec = {
        "tasks": [{"name": "ddp", "params": {"batch": 8}}],
        "world_size": 2,
        "device": "cpu",
        "backend": "gloo",
        "rendezvous": {"mode": "file", "path": str(tmp_path / "rendezvous.store")},
        "outdir": str(tmp_path),
        "parent_pid": 1,
        "deadline_epoch": 2.5,
        "op_timeout_s": 30.0,
    }
    path = write_spec(tmp_path, spec)
    assert path == tmp_path / "spec.json"
    assert read_spec(str(path)) == spec


def _calls_and_keys(path: Path) -> list[str]:
    """`.emit(...)` calls, dict literals with an "event" key and pair phases spelled out: the
    protocol written by hand."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith((f"{PAIR_P2P}:", f"{PAIR_SENDRECV}:")):
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "emit":
            found.append(f"{path.name}:{node.lineno}: .emit(...)")
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "event" for k in node.keys):
            found.append(f'{path.name}:{node.lineno}: {{"event": ...}}')
    return found


def test_no_module_but_the_protocol_writes_an_event_by_hand() -> None:
    package = REPO / "gpudoctor"
    modules = [*sorted((package / "workloads").glob("*.py")), *sorted((package / "launch").glob("*.py"))]
    modules += sorted((package / "checks").rglob("*.py"))  # the parent's readers of rank phases
    by_hand: list[Any] = [hit for p in modules if p.name != "protocol.py" for hit in _calls_and_keys(p)]
    assert not by_hand, by_hand
    assert _calls_and_keys(package / "launch" / "protocol.py")  # the scan does see the one writer
