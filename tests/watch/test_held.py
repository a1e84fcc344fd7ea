"""What `watch` and `report` hold per rank is bounded by the ranks alive at once, not by those ever seen
(issue 22): a restarted job and spawned DataLoader workers bring a new process each time, and are never
refused for it; a recording whose rank numbers keep changing is summarized with the least recently seen
ranks folded into one row.

The recordings here are written as `watch --record` writes them, line by line from plain dicts (as
review 5's gen.py made them), not through our writer."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpudoctor.training_data import DATA_MAGIC
from gpudoctor.training_step import EVENT, EVENT_MAGIC
from gpudoctor.watch.bounds import MAX_RANKS
from gpudoctor.watch.data import DataBook
from gpudoctor.watch.data_model import DataReading, EpochDigest, Hello
from gpudoctor.watch.follow import Job
from gpudoctor.watch.model import RankReading, Sample
from gpudoctor.watch.rank_rows import RankRows
from gpudoctor.watch.recording import RecordingStream
from gpudoctor.watch.session import Session
from gpudoctor.watch.sources import SyntheticSource
from gpudoctor.watch.steps import StepChannel
from gpudoctor.watch.summary import SummaryBuilder
from gpudoctor.watch.thresholds import DEFAULT
from tests.helpers.cli import run_cli
from tests.helpers.processes import GpudoctorCli, clean_env
from tests.paths import FIXTURES, shipped_schema

JOB = FIXTURES / "jobs" / "comings_and_goings.py"
T0 = 1795768984.0
HEADER = {
    "format": "gpudoctor-watch",
    "version": 1,
    "host": "vm",
    "started": T0 - 1,
    "interval": 1.0,
    "gpudoctor_version": "0.1.0",
    "command": None,
    "source": "live",
}


def _gpu(i: int) -> dict[str, Any]:
    return {
        "index": i,
        "name": "NVIDIA H200",
        "uuid": f"GPU-{i}",
        "util": 50,
        "mem_util": 10,
        "mem_used": 1000,
        "mem_total": 143771,
        "power": 200.0,
        "power_limit": 700.0,
        "temp": 50,
        "sm_clock": 1900,
        "pcie_rx": 1,
        "pcie_tx": 1,
        "throttle": 0,
    }


def _rank(rank: int, pid: int, t: float, step: int) -> dict[str, Any]:
    return {"pid": pid, "rank": rank, "steps": 6, "step_s": 0.08, "step_max": 0.1, "last_step": step, "last_end": t}


def _line(t: float, ranks: list[dict[str, Any]], data: list[dict[str, Any]] | None = None) -> str:
    doc: dict[str, Any] = {"t": t, "gpus": [_gpu(0)], "cpu": 1.0, "ranks": ranks, "job": []}
    if data:
        doc["data"] = data
    return json.dumps(doc)


def _write(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt") if path.suffix == ".gz" else path.open("w") as f:
        f.write(json.dumps(HEADER) + "\n")
        for line in lines:
            f.write(line + "\n")
    return path


def _elastic(path: Path, generations: int, world: int = 8) -> Path:
    """review5's gen.py elastic: `world` ranks restarted `generations` times, two samples a generation."""
    lines, t, pid = [], T0, 1000
    for _ in range(generations):
        pids = range(pid, pid + world)
        pid += world
        for k in range(2):
            lines.append(_line(t, [_rank(r, p, t - 0.01, 6 * (k + 1)) for r, p in enumerate(pids)]))
            t += 1
    return _write(path, lines)


def _held(path: Path) -> SummaryBuilder:
    builder = SummaryBuilder(str(path))
    with RecordingStream(str(path)) as stream:
        for s in stream:
            builder.add(s)
            assert builder.held_ranks <= MAX_RANKS
            assert len(builder._window.ranks) <= MAX_RANKS  # what a sample's analysis reads
    return builder


def test_an_elastic_job_restarted_600_times_keeps_its_8_ranks_with_every_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """F2 of review 5: 8 ranks x 600 generations is 4,800 (rank, PID): `report` summarizes it, one row per
    rank, each counting the steps of its 600 processes and showing the last generation's PID."""
    rec = _elastic(tmp_path / "elastic.jsonl.gz", 600)
    r = run_cli(capsys, "report", "--json", str(rec))
    assert r.exit_code == 0, r.err
    doc = json.loads(r.out)
    last = 1000 + 8 * 599
    assert [(x["rank"], x["pid"], x["steps"], x.get("processes"), x["last_step"]) for x in doc["ranks"]] == [
        (k, last + k, 600 * 2 * 6, 600, 12) for k in range(8)
    ]
    assert doc["damage"] is None and doc["earlier_ranks"] is None
    text = run_cli(capsys, "report", str(rec))
    assert text.exit_code == 0 and "8 ranks" in text.out and "(600 processes, the latest shown)" in text.out
    assert "damaged" not in text.out + text.err
    assert _held(rec).held_ranks == 8


def test_ranks_with_ever_new_numbers_fold_the_least_recently_seen_into_one_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crafted recording whose every line names 1,000 new ranks: the summary holds MAX_RANKS of them (the
    latest), the others are one row, counted and named in a note; no line is refused, GPU readings and all."""
    lines, per, n = [], 1000, 10
    for i in range(n):
        t = T0 + i
        lines.append(_line(t, [_rank(i * per + k, 100_000 + i * per + k, t - 0.01, 1) for k in range(per)]))
    rec = _write(tmp_path / "moving.jsonl", lines)
    r = run_cli(capsys, "report", "--json", str(rec))
    assert r.exit_code == 0, r.err
    doc = json.loads(r.out)
    folded = n * per - MAX_RANKS
    assert doc["samples"] == n and doc["damage"] is None and doc["gpus"][0]["mean_util"] == 50
    assert len(doc["ranks"]) == MAX_RANKS and doc["ranks"][0]["rank"] == folded  # the latest ranks are held
    assert doc["earlier_ranks"] == {
        "rows": folded,
        "processes": folded,
        "steps": 6 * folded,
        "mean_step_ms": 80.0,
        "wait_share": None,
        "first_rank": 0,
        "last_rank": folded - 1,
    }
    text = run_cli(capsys, "report", str(rec))
    assert text.exit_code == 0 and f"{MAX_RANKS} ranks (and {folded} earlier rank rows)" in text.out
    assert (
        f"note: {folded} earlier rank rows ({folded} processes, ranks 0..{folded - 1} among them) are counted in "
        f"one row: at most {MAX_RANKS} ranks are held" in text.out
    )
    assert "damaged" not in text.out + text.err
    assert _held(rec).held_ranks == MAX_RANKS


def test_ranks_seen_again_after_folding_are_counted_as_rows_not_as_new_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lines alternating between two sets of MAX_RANKS rank numbers (review 6 F3): each line folds the
    other set's rows, so the count is of folded rows and says so; it claimed 24,576 ranks for 8,192."""
    lines = []
    for i in range(6):
        t = T0 + i
        base = (i % 2) * MAX_RANKS
        lines.append(_line(t, [_rank(base + k, 100_000 + base + k, t - 0.01, 1) for k in range(MAX_RANKS)]))
    rec = _write(tmp_path / "alternate.jsonl", lines)
    text = run_cli(capsys, "report", str(rec))
    assert text.exit_code == 0, text.err
    assert f"{MAX_RANKS} ranks (and {5 * MAX_RANKS} earlier rank rows)" in text.out
    assert "(a rank seen again after it was folded is counted again)" in text.out
    assert f"{6 * MAX_RANKS} ranks" not in text.out


def test_a_sample_built_with_more_ranks_than_the_bound_keeps_its_own_ranks_in_the_window() -> None:
    """A line holds at most MAX_RANKS ranks, but a Sample built in code (benchmarks/report_cost.py times
    32,000) may hold more: the window's bound lets older ranks go, never the sample's own (it raised
    KeyError in the lateness of the sample's ranks)."""
    from gpudoctor.watch.synthetic import synthetic_sample

    builder = SummaryBuilder(DEFAULT)
    n = MAX_RANKS + 50
    for i in range(3):
        builder.add(synthetic_sample("straggler", i, T0 + i, n, 3, ranks=True))
    assert len(builder._window.ranks) == n  # this sample's ranks, all of them, and no more
    assert {key[0] for key in builder._window.ranks} == set(range(n))


def test_two_processes_taking_turns_on_a_rank_are_two_processes(tmp_path: Path) -> None:
    """A rank's row counts distinct processes, not changes: two PIDs alternating are 2."""
    lines = [_line(T0 + i, [_rank(0, 500 + i % 2, T0 + i - 0.01, i + 1)]) for i in range(20)]
    builder = _held(_write(tmp_path / "turns.jsonl", lines))
    (row,) = builder.summary().ranks.values()
    assert (row.rank, row.pid, row.processes, row.steps) == (0, 501, 2, 120)


def _follow(*args: str, timeout: float = 240) -> tuple[dict[str, int], tuple[DataReading, ...], list[int]]:
    """Run the job of comings_and_goings.py under a step channel that takes every process as the job's: what
    the channel holds once the job ended, the data the ranks sent, the ranks' PIDs (from their steps)."""
    channel = StepChannel(accept=lambda pid: True)
    try:
        env = {**os.environ, **channel.env}
        r = subprocess.run([sys.executable, str(JOB), *args], env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, r.stderr
    finally:
        channel.close()  # what was still queued is taken first
    pids = sorted({x.pid for x in channel.take()})
    return channel.held(), channel.take_data(), pids


def test_a_job_whose_processes_come_and_go_is_held_by_its_live_ranks() -> None:
    """review5's elastic.py and workers.py in one: 6 generations of 2 forked ranks, each generation after 2
    children started with spawn (they import gpudoctor and exit, as DataLoader workers do). Held at the end:
    the 2 rank numbers, what the ranks that exited said of their end (kept for the crash diagnosis, at most
    MAX_ENDED), nothing of the spawned children, no process's rank (they all exited)."""
    held, _, _ = _follow("6", "--world", "2", "--helpers", "2", "--step-s", "0.2")
    assert held == {"ranks": 2, "heard": 0, "ended": 12 + 1, "data": 0}  # the ranks, and the script itself


@pytest.mark.slow
def test_spawned_dataloader_workers_say_nothing_and_the_ranks_keep_their_epochs() -> None:
    """F1 of review 5 with real torch: 2 ranks reading a DataLoader whose worker is started with spawn,
    2 epochs (a new worker process each epoch). Each worker imports gpudoctor and exited saying hello: the
    data book then gave the rank to the worker and forgot the rank's first epoch (GD941 compares the later
    epochs with it), and the watcher held each worker. Now the workers say nothing; the ranks keep theirs."""
    held, data, pids = _follow("1", "--world", "2", "--helpers", "0", "--torch", "--epochs", "2")
    # the ranks' data, and the script's hello (it imported gpudoctor; it has no rank): no worker's
    assert len(pids) == 2 and sorted(d.pid for d in data if d.rank is not None) == pids and len(data) == 3
    book = DataBook(DEFAULT)
    book.add(data)
    epochs = {k: sorted(rd.epochs["train"]) for k, rd in book.ranks.items() if rd.epochs}
    assert epochs == {(0, pids[0]): [0, 1], (1, pids[1]): [0, 1]}
    assert held == {"ranks": 2, "heard": 0, "ended": 2 + 1, "data": 0}  # the ranks, and the script


def test_a_worker_saying_hello_does_not_take_its_ranks_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same through a recording (what an older gpudoctor in the job sends, or any helper): 8 ranks read
    the same order every epoch (GD941), and between epochs each rank's 8 spawned workers say hello as they
    exit, 100 epochs (6,400 processes). The rank keeps its first epoch (GD941 is called), nothing is refused,
    and the data book holds the 8 ranks."""
    order = [(i * 37) % 512 for i in range(32)]
    lines, t, pid = [], T0, 10_000
    for epoch in range(100):
        digest = {"role": "train", "epoch": epoch, "n": 512, "batches": 64, "prefix": order, "ascending": False}
        data = [{"pid": 100 + r, "rank": r, "epochs": [{**digest, "final": True}]} for r in range(8)]
        ranks = [_rank(r, 100 + r, t - 0.01, 64 * (epoch + 1)) for r in range(8)]
        lines.append(_line(t, ranks, data))
        t += 1
        workers = [{"pid": pid + k, "rank": k // 8, "hello": {"cpus": 16}} for k in range(64)]
        pid += 64
        lines.append(_line(t, ranks, workers))
        t += 1
    rec = _write(tmp_path / "workers.jsonl", lines)
    r = run_cli(capsys, "report", "--json", str(rec))
    assert r.exit_code == 0, r.err
    doc = json.loads(r.out)
    assert "GD941" in {v["code"] for v in doc["verdicts"]}
    assert doc["damage"] is None and len(doc["ranks"]) == 8 and "processes" not in doc["ranks"][0]
    assert [(d["rank"], d["pid"], d["epochs"]) for d in doc["job"]["data"]] == [(r, 100 + r, 100) for r in range(8)]
    builder = _held(rec)
    assert len(builder.book.data.ranks) == 8 and len(builder.book.placement) <= 8


def test_a_restarted_rank_that_only_says_hello_then_steps_takes_its_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A restarted rank's new process says hello (held aside: it could be a DataLoader worker) and then only
    steps, sending no data: its steps show it is the rank, so it takes the rank's data row (review 6 F4)."""
    lines, t = [], T0
    digest = {"role": "train", "epoch": 0, "n": 64, "batches": 8, "prefix": list(range(8)), "ascending": True}
    lines.append(_line(t, [_rank(0, 100, t - 0.01, 8)], [{"pid": 100, "rank": 0, "hello": {"cpus": 16}}]))
    lines.append(_line(t + 1, [_rank(0, 100, t + 0.99, 16)], [{"pid": 100, "rank": 0, "epochs": [digest]}]))
    lines.append(_line(t + 2, [], [{"pid": 200, "rank": 0, "hello": {"cpus": 16}}]))  # the restart says hello
    for i in range(3, 6):
        lines.append(_line(t + i, [_rank(0, 200, t + i - 0.01, 8 * (i - 2))]))  # ... and steps
    rec = _write(tmp_path / "restart.jsonl", lines)
    r = run_cli(capsys, "report", "--json", str(rec))
    assert r.exit_code == 0, r.err
    doc = json.loads(r.out)
    assert [(x["rank"], x["pid"], x.get("processes")) for x in doc["ranks"]] == [(0, 200, 2)]
    assert list(_held(rec).book.data.ranks) == [(0, 200)]  # the data book's rank 0 is the new process


def test_the_data_book_holds_at_most_max_ranks_numbered_ranks_and_their_hellos() -> None:
    """Data readings from ever-new rank numbers (review 6 F9: a crafted recording, quadratic in lines): the
    book holds the latest MAX_RANKS processes, and its hellos are exactly those of the processes held."""
    from gpudoctor.watch.data_model import Hello

    book = DataBook(DEFAULT)
    n = MAX_RANKS + 500
    book.add([DataReading(100_000 + k, k, Hello(cpus=16)) for k in range(n)])
    assert len(book.ranks) == MAX_RANKS and next(iter(book.ranks)) == (500, 100_500)  # the earliest went
    assert book.hellos() == {k: rd.hello for k, rd in book.ranks.items()}
    book.add([DataReading(7, n - 1, Hello(cpus=8))])  # the last rank restarted: its new process says hello
    book.stepping({7})  # ... and steps: it holds the rank
    assert (n - 1, 100_000 + n - 1) not in book.ranks and book.hellos()[(n - 1, 7)].cpus == 8
    assert len(book.hellos()) == len(book.ranks) == MAX_RANKS


@pytest.mark.slow
def test_watch_and_report_of_its_recording_agree_on_a_job_whose_processes_come_and_go(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    """`watch --record` of the job of comings_and_goings.py (8 generations of 2 ranks, spawned children): the
    summary it prints at the end and `report` of what it wrote have the same rank rows, processes folded, and
    the same steps (review 6 F7: the steps the job sent as it ended were counted live, never written)."""
    rec = tmp_path / "job.jsonl"
    args = ["watch", "--no-tui", "--json", "--interval", "0.2", "--record", str(rec), "--"]
    job = [sys.executable, str(JOB), "8", "--world", "2", "--helpers", "2", "--step-s", "0.6"]
    live = gpudoctor_cli(*args, *job, env=clean_env(GPUDOCTOR_WATCH_FAKE="healthy:2"), timeout=240)
    assert live.returncode == 0, live.stderr
    watched = json.loads(live.stdout.splitlines()[-1])
    report = gpudoctor_cli("report", "--json", str(rec))
    assert report.returncode == 0, report.stderr
    reported = json.loads(report.stdout)
    rows = [(x["rank"], x.get("processes")) for x in watched["ranks"]]
    assert rows == [(0, 8), (1, 8)] and [(x["rank"], x.get("processes")) for x in reported["ranks"]] == rows
    assert [x["pid"] for x in reported["ranks"]] == [x["pid"] for x in watched["ranks"]]
    for field in ("steps", "last_step", "mean_step_ms"):
        assert [x[field] for x in reported["ranks"]] == pytest.approx([x[field] for x in watched["ranks"]]), field
    assert min(x["steps"] for x in watched["ranks"]) > 0


def test_report_counts_what_a_job_sent_after_the_last_sample(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    """Review 6 F7: a job shorter than the interval (2 ranks, about 30 steps each in about 1 s; samples
    every 5 s)
    sends everything after the first sample. `watch` counted it; the recording had none of it, and `report`
    showed no rank. The recording now ends with the job's last words (Sample.end), and the two agree."""
    rec = tmp_path / "short.jsonl"
    args = ["watch", "--no-tui", "--json", "--interval", "5", "--record", str(rec), "--"]
    job = [sys.executable, str(JOB), "1", "--world", "2", "--helpers", "0", "--step-s", "0.6"]
    live = gpudoctor_cli(*args, *job, env=clean_env(GPUDOCTOR_WATCH_FAKE="healthy:2"), timeout=120)
    assert live.returncode == 0, live.stderr
    watched = json.loads(live.stdout.splitlines()[-1])
    report = gpudoctor_cli("report", "--json", str(rec))
    assert report.returncode == 0, report.stderr
    reported = json.loads(report.stdout)
    assert [x["rank"] for x in watched["ranks"]] == [0, 1] and min(x["steps"] for x in watched["ranks"]) > 10
    assert reported["ranks"] == watched["ranks"] and reported.get("job") == watched.get("job")
    assert reported["samples"] == watched["samples"] and reported["damage"] is None


@pytest.mark.parametrize("interval", ["0.2", "3"])
def test_a_restarted_job_keeps_every_step_its_ranks_made(interval: str, gpudoctor_cli: GpudoctorCli) -> None:
    """Review 7: a restarted rank's new process replaced the old one's entry in the channel with the steps it
    had made since the last sample: 181 of 199 steps counted at 0.2 s, 25 of 100 at 3 s. Each rank's row now
    has every step its processes said they made (4 generations of 2 ranks, 0.5 s each)."""
    job = [sys.executable, str(JOB), "4", "--world", "2", "--helpers", "0", "--step-s", "0.5"]
    live = gpudoctor_cli(
        "watch", "--no-tui", "--json", "--interval", interval, "--", *job,
        env=clean_env(GPUDOCTOR_WATCH_FAKE="healthy:2"), timeout=120,
    )  # fmt: skip
    assert live.returncode == 0, live.stderr
    said: dict[int, int] = {}
    for rank, steps in re.findall(r"rank (\d+) pid \d+ steps (\d+)", live.stderr):
        said[int(rank)] = said.get(int(rank), 0) + int(steps)
    rows = json.loads(live.stdout.splitlines()[-1])["ranks"]
    assert {x["rank"]: x["steps"] for x in rows} == said and len(said) == 2


def test_two_live_processes_with_one_rank_number_keep_their_own_steps_and_rows(gpudoctor_cli: GpudoctorCli) -> None:
    """Review 6 F8: two processes said RANK=0 at the same time (two runs under one watch). The channel dropped
    one's steps at each record of the other, and the summary blended them into one row (40 of 198 steps, a
    29 ms mean neither had). Each now has its row, its steps and its mean."""
    job = [sys.executable, str(FIXTURES / "jobs" / "twins.py"), "3"]
    args = ["watch", "--no-tui", "--json", "--interval", "0.5", "--"]
    live = gpudoctor_cli(*args, *job, env=clean_env(GPUDOCTOR_WATCH_FAKE="healthy:2"), timeout=120)
    assert live.returncode == 0, live.stderr
    said = {int(m[1]): (int(m[0]), int(m[2])) for m in re.findall(r"rank (\d+) pid (\d+) steps (\d+)", live.stderr)}
    rows = json.loads(live.stdout.splitlines()[-1])["ranks"]
    assert {x["pid"]: (x["rank"], x["steps"]) for x in rows} == said and len(rows) == 3
    means = sorted((x["rank"], x["mean_step_ms"]) for x in rows)
    assert [m[0] for m in means] == [0, 0, 1] and means[0][1] < 100 < means[1][1] and "processes" not in rows[0]


def test_a_rank_row_folds_processes_one_after_another_and_keeps_twins_apart() -> None:
    rows = RankRows()
    a, b = RankReading(pid=10, rank=0, steps=5, step_s=0.1), RankReading(pid=11, rank=0, steps=1, step_s=1.0)
    rows.add([a])
    rows.add([a, b])  # b runs beside a: its own row
    rows.add([b, a])  # in any order
    rows.add([b])  # a ended: b keeps its row
    c = RankReading(pid=12, rank=0, steps=2, step_s=0.1)
    rows.add([c])  # a new process alone after them: the rank's row, a process more
    got = {key: (r.pid, r.steps, r.processes) for key, r in rows.rows.items()}
    assert got == {(0, 0): (12, 17, 2), (0, 11): (11, 3, 1)}


@pytest.mark.parametrize("then", ["data", "steps"])
def test_a_helpers_hello_does_not_push_out_a_restarted_ranks_hello(then: str) -> None:
    """Review 6 F6: the data book held one pending hello per rank number. A restarted rank's new process said
    hello while the old still held the rank; a helper with the same RANK (an mp.Pool process) said hello
    after it and took its place: the rank then sent its epoch (or stepped) without its hello (its
    CUDA_VISIBLE_DEVICES, its CPUs), and stepping looked for the helper. Each process now keeps its own."""
    book = DataBook(DEFAULT)
    epoch = EpochDigest(role="train", epoch=0, n=8, prefix=tuple(range(8)), ascending=False, final=True)
    book.add([DataReading(100, 0, Hello(cpus=16, visible="0")), DataReading(100, 0, epochs=(epoch,))])
    book.add([DataReading(200, 0, Hello(cpus=8, visible="1"))])  # the restarted rank 0
    book.add([DataReading(300, 0, Hello(cpus=2, visible="1"))])  # a helper that says RANK=0 too
    if then == "data":
        book.add([DataReading(200, 0, epochs=(replace(epoch, epoch=1),))])
    else:
        book.stepping({200})
    assert list(book.ranks) == [(0, 200)] and book.hellos()[(0, 200)] == Hello(cpus=8, visible="1")


def test_what_a_killed_process_said_goes_with_it() -> None:
    """A process killed without a word (SIGKILL, the OOM killer) sends no exit: what it said is held until
    the job's process tree, read after it was heard, no longer holds it; one heard after the tree was read
    may be newer than it, and stays."""
    channel = StepChannel(accept=lambda pid: True)
    try:
        arrived = EVENT.pack(EVENT_MAGIC, 0, 0, -1, -1, 0, 0, time.time())
        for pid in (101, 102, 103):
            channel._add_event(pid, arrived)
        before = time.time()
        channel._add_event(104, arrived)  # heard after the tree was read
        channel.forget_gone({102}, before)  # 102 is alive (in the tree); 101 and 103 were killed
        assert sorted(channel.heard()) == [102, 104] and channel.held()["heard"] == 2
    finally:
        channel.close()


def test_a_session_forgets_what_a_killed_process_said_once_the_job_tree_lost_it() -> None:
    """Review 6 F4, the wiring: a job's child says where it is (inside its first step); once heard, it is
    killed without a word (SIGKILL) and reaped; the job goes on. The session reads the job's tree about once a
    second and hands it to the channel, which forgets the killed child's event; the parent stays heard."""
    code = (
        "import os, signal, time\n"
        "import gpudoctor\n"
        "signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the killed child is reaped at once\n"
        "if os.fork() == 0:\n"
        "    with gpudoctor.step():\n"
        "        time.sleep(120)\n"
        "with gpudoctor.step():\n"
        "    pass\n"
        "time.sleep(120)\n"
    )
    channel = StepChannel()
    job = Job.start([sys.executable, "-c", code], env={**os.environ, **channel.env})
    channel.accept = job.owns
    session = Session(SyntheticSource(interval=0.1), job=job, steps=channel)
    session.start()
    try:
        deadline, child = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            item = session.queue.get(timeout=5)
            if isinstance(item, Sample):
                session.handle(item)
            heard = set(channel.heard())
            if child is None and len(heard) == 2:  # the parent and its child said where they are
                child = max(heard - {job.root.pid})
                os.kill(child, signal.SIGKILL)
            elif child is not None and heard == {job.root.pid}:
                break
        assert child is not None and set(channel.heard()) == {job.root.pid}
    finally:
        session.close()


def test_a_rank_that_left_its_group_before_exiting_is_remembered_as_joined() -> None:
    """An mp.spawn rank that joined, never stepped, called destroy_process_group() and exited: at exit it is
    in no group, so its exit says "not joined"; what it said before holds (it had joined as rank 1 of 2), and
    its exit is kept, not taken for a helper's that never joined (review 6 F5)."""
    from gpudoctor.training_step import CHILD, EXITING, JOINED

    channel = StepChannel(accept=lambda pid: True)
    try:
        channel._add_event(501, EVENT.pack(EVENT_MAGIC, 501, -1, 1, 2, JOINED | CHILD, 0, time.time()))
        channel._add_event(501, EVENT.pack(EVENT_MAGIC, 501, -1, -1, -1, EXITING | CHILD, 0, time.time()))
        (ended,) = channel.heard().values()
        assert (ended.exiting, ended.joined, ended.dist_rank, ended.dist_world) == (True, True, 1, 2)
        assert channel.held()["ended"] == 1
    finally:
        channel.close()


def test_a_job_tree_holds_the_descendants_alive_not_all_it_had() -> None:
    """The followed job's descendants are held to stop them (even once they left its process group) while
    they run; 40 children that came and went leave none held."""
    code = (
        "import os, time\n"
        "for _ in range(40):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(0.05)\n"
        "        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n"
        "time.sleep(0.5)\n"
    )
    job = Job.start([sys.executable, "-c", code])
    try:
        most = 0
        while job.poll() is None:
            job.refresh()
            most = max(most, job.held())
            time.sleep(0.01)
        job.refresh()
        assert most >= 1 and job.held() <= 1  # the root alone, or nothing once it ended
    finally:
        job.stop(grace_s=1)


def test_the_channel_says_what_it_ignored() -> None:
    """F4 of review 5: data datagrams and event records ignored were told as step records."""
    channel = StepChannel(accept=lambda pid: False)  # nobody is the job
    try:
        event = EVENT.pack(EVENT_MAGIC, 0, 0, -1, -1, 0, 0, time.time())
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            for datagram in (DATA_MAGIC + b'{"rank": 0}', DATA_MAGIC + b'{"rank": 1}', event):
                s.sendto(datagram, channel.path)
        deadline = time.monotonic() + 10
        while channel.rejected < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert channel.note == "ignored 2 data datagrams and 1 event record from outside the job or damaged"
    finally:
        channel.close()


def test_a_churning_job_lists_256_subjects_a_code_and_counts_the_rest(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    """Last session's review: a job whose processes churn (8 new PIDs a line here, the ranks behind a stall
    named by GD911) names a new set of ranks nearly every sample, and each set made a span of its own: the
    spans, and report's memory, grew with the file. A code lists at most MAX_SUBJECTS_PER_CODE subjects;
    the samples of the rest are counted and said, in the text and in JSON, by report and by the replay."""
    from gpudoctor.watch.summary import MAX_SUBJECTS_PER_CODE

    lines, pid = [], 10_000
    for i in range(MAX_SUBJECTS_PER_CODE + 120):  # GD911 from the 60th s
        ranks = [{"pid": 4999, "rank": 0, "steps": 0, "last_step": 62, "last_end": T0}]
        for _ in range(8):
            ranks.append({"pid": pid, "rank": 1 + pid % 4000, "steps": 0, "last_step": 2, "last_end": T0 - 30})
            pid += 1
        lines.append(json.dumps({"t": T0 + i, "gpus": [_gpu(0)], "ranks": ranks}))
    rec = _write(tmp_path / "churn.jsonl", lines)
    report = gpudoctor_cli("report", "--json", str(rec))
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)
    jsonschema.validate(doc, shipped_schema("watch_summary"))
    stalls = [v for v in doc["verdicts"] if v["code"] == "GD911"]
    assert len(stalls) == MAX_SUBJECTS_PER_CODE and doc["unlisted_verdicts"]["GD911"] > 0
    assert len({tuple((r["rank"], r["pid"]) for r in v["ranks"]) for v in stalls}) == len(stalls)  # each new
    text = gpudoctor_cli("report", str(rec)).stdout
    said = f"GD911 also held in {doc['unlisted_verdicts']['GD911']} samples for GPUs or ranks beyond the 256"
    assert said in text, text[-400:]
    replay = gpudoctor_cli("watch", "--replay", str(rec), "--speed", "100000", "--no-tui", "--json")
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout.splitlines()[-1])["unlisted_verdicts"] == doc["unlisted_verdicts"]


def test_a_stall_whose_ranks_behind_change_back_and_forth_is_one_span(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    """The review of the subject cap: GD911's ranks behind alternate between {1} and {1, 2} every sample. A
    span carried on only as a verdict came to name more ranks, so each return to {1} was a new span and a new
    subject: 256 spans of one stall, then "held for ranks beyond the 256 it lists", which was false. A span
    now carries on as its verdict names fewer ranks too: one span, nothing unlisted."""
    lines = []
    for i in range(400):
        third = {
            "pid": 102,
            "rank": 2,
            "steps": 0,
            "last_step": 2 if i % 2 else 62,
            "last_end": T0 - 30 if i % 2 else T0,
        }
        ranks = [
            {"pid": 100, "rank": 0, "steps": 0, "last_step": 62, "last_end": T0},
            {"pid": 101, "rank": 1, "steps": 0, "last_step": 2, "last_end": T0 - 30},
            third,
        ]
        lines.append(json.dumps({"t": T0 + i, "gpus": [_gpu(0)], "ranks": ranks}))
    doc = json.loads(gpudoctor_cli("report", "--json", str(_write(tmp_path / "alt.jsonl", lines))).stdout)
    stalls = [v for v in doc["verdicts"] if v["code"] == "GD911"]
    assert len(stalls) == 1 and stalls[0]["samples"] == 400 - 60, stalls[:3]
    assert "unlisted_verdicts" not in doc


def test_verdicts_beyond_the_listed_subjects_are_counted_in_samples(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    """The review of the subject cap: two slow ranks restarted every sample (new PIDs) make two new GD909
    subjects a sample; the count went up per subject (1,626 "samples" in a recording of 400). It is of samples."""
    lines, pid = [], 20_000
    for i in range(400):
        ranks = [_rank(r, 100 + r, T0 + i - 0.01, 5 * (i + 1)) for r in range(12)]
        for r in (6, 7):
            slow = {**_rank(r, pid, T0 + i - 0.01, 5 * (i + 1)), "wait_s": 0.1, "waited": 5, "wait_step_s": 0.1}
            ranks.append(slow)
            pid += 1
        lines.append(json.dumps({"t": T0 + i, "gpus": [_gpu(0)], "ranks": ranks}))
    rec = _write(tmp_path / "slow.jsonl", lines)
    (tmp_path / "gpudoctor.toml").write_text("[watch]\nwindow-s = 2\nwarmup-s = 1\n")
    r = gpudoctor_cli("report", "--json", str(rec), "--config", str(tmp_path / "gpudoctor.toml"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    counted = doc["unlisted_verdicts"]
    assert counted and all(0 < n <= doc["samples"] for n in counted.values()), counted
