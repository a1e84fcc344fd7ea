"""The dashboard: pilot tests of the keys and of updates arriving, and SVG snapshots."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

from gpudoctor.watch.analysis import Thresholds
from gpudoctor.watch.app import HelpScreen, WatchApp
from gpudoctor.watch.model import GpuReading, Sample
from gpudoctor.watch.recording import read_recording
from gpudoctor.watch.session import End, Session
from gpudoctor.watch.sources import ReplaySource
from gpudoctor.watch.synthetic import synthetic_run
from gpudoctor.watch.widgets import GpuTable, ProcessTable

RECORDINGS = Path(__file__).parent / "fixtures" / "recordings"
SIZE = (150, 42)
NO_WARMUP = Thresholds(warmup_s=0)  # these tests are about drawing, not about the warm-up


def text_of(widget: Any) -> str:
    """What a Static widget shows, as plain text."""
    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(widget.content)
    return console.export_text()


def replay_app(name: str, live: bool = False) -> WatchApp:
    rec = read_recording(str(RECORDINGS / f"{name}.jsonl"))
    return WatchApp(Session(ReplaySource(rec)), live=live, preload=rec.samples)


def live_app(samples: list[Sample] | None = None) -> tuple[WatchApp, Session]:
    rec = read_recording(str(RECORDINGS / "healthy.jsonl"))
    rec.samples = samples or []
    session = Session(ReplaySource(rec), thresholds=NO_WARMUP)  # not started: the test feeds the queue itself
    session.last_arrival = time.monotonic()
    return WatchApp(session, live=True), session


async def wait_for(pilot: Any, cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await pilot.pause(0.05)


async def test_updates_arrive_and_are_drawn() -> None:
    app, session = live_app()
    samples = synthetic_run("straggler", 12)
    async with app.run_test(size=SIZE) as pilot:
        assert "waiting for the first reading" in text_of(app.query_one("#status"))
        session.queue.put(samples[0])
        await wait_for(pilot, lambda: app.samples_seen == 1)
        first = text_of(app.query_one(GpuTable))
        assert "H100 80GB HBM3" in first and f"{samples[0].gpus[3].util}%" in first
        for s in samples[1:]:
            session.queue.put(s)
        await wait_for(pilot, lambda: app.samples_seen == 12)
        assert "GD901 straggler" in text_of(app.query_one("#balance"))
        assert "*3" in text_of(app.query_one(GpuTable))  # the straggler is marked
        assert app.query_one(ProcessTable).row_count == 8


async def test_pause_keeps_sampling_but_freezes_the_screen() -> None:
    app, session = live_app()
    samples = synthetic_run("healthy", 4)
    async with app.run_test(size=SIZE) as pilot:
        session.queue.put(samples[0])
        await wait_for(pilot, lambda: app.samples_seen == 1)
        await pilot.press("p")
        assert "PAUSED" in text_of(app.query_one("#status"))
        before = text_of(app.query_one(GpuTable))
        for s in samples[1:]:
            session.queue.put(s)
        await wait_for(pilot, lambda: app.samples_seen == 4)
        assert text_of(app.query_one(GpuTable)) == before  # frozen while paused...
        assert session.builder.samples == 4  # ...while the samples still count
        await pilot.press("p")
        assert "PAUSED" not in text_of(app.query_one("#status"))
        assert text_of(app.query_one(GpuTable)) != before


async def test_sort_key_cycles_the_process_order() -> None:
    app = replay_app("straggler")
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(ProcessTable)

        def pids() -> list[str]:
            return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]

        by_mem = pids()
        await pilot.press("s")
        assert app.sort == "CPU%" and "processes by CPU%" in text_of(app.query_one("#status"))
        await pilot.press("s")
        assert app.sort == "PID" and pids() == sorted(by_mem, key=int)
        assert by_mem != sorted(by_mem, key=int)


async def test_help_opens_and_closes_and_q_quits() -> None:
    app = replay_app("healthy")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("x")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("q")
    assert app.return_value == "quit"


async def test_stale_readings_and_a_lost_gpu_are_shown() -> None:
    app, session = live_app()
    s = synthetic_run("healthy", 1)[0]
    lost = Sample(s.t, (*s.gpus[:7], GpuReading(index=7, name=s.gpus[7].name, state="lost")), s.cpu)
    async with app.run_test(size=SIZE) as pilot:
        session.queue.put(lost)
        await wait_for(pilot, lambda: app.samples_seen == 1)
        table = text_of(app.query_one(GpuTable))
        assert "LOST" in table and "GD908 gpu-lost" in text_of(app.query_one("#balance"))
        session.last_arrival -= 60  # NVML stalled for a minute
        app._check_stale()
        assert "STALE" in text_of(app.query_one("#status")) and "(stale)" in text_of(app.query_one(GpuTable))
        session.queue.put(s)
        await wait_for(pilot, lambda: app.samples_seen == 2)
        assert "STALE" not in text_of(app.query_one("#status"))


async def test_job_end_closes_the_dashboard() -> None:
    app, session = live_app()
    async with app.run_test(size=SIZE) as pilot:
        session.queue.put(End("job"))
        await wait_for(pilot, lambda: app.return_value == "job")


def test_snapshot_straggler(snap_compare: Any) -> None:
    assert snap_compare(replay_app("straggler"), terminal_size=SIZE)


def test_snapshot_hung_collective(snap_compare: Any) -> None:
    assert snap_compare(replay_app("hung"), terminal_size=SIZE)


async def test_ctrl_c_interrupts_the_dashboard() -> None:
    app = replay_app("healthy")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+c")
    assert app.return_value == "interrupted"  # gpudoctor maps it to exit 130 (see test_watch_follow)
