"""The dashboard: pilot tests of the keys and of updates arriving, and SVG snapshots.

The real program in real terminal sizes is tested in tests/watch/test_terminal.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
from rich.console import Console
from textual.geometry import Region

from gpudoctor.probe.processes import command_line
from gpudoctor.watch.model import GpuReading, ProcReading, Sample
from gpudoctor.watch.recording import read_recording, recording_path
from gpudoctor.watch.session import End, Session
from gpudoctor.watch.sources import ReplaySource, SyntheticSource
from gpudoctor.watch.synthetic import synthetic_run
from gpudoctor.watch.thresholds import Thresholds
from gpudoctor.watch.ui import app as watch_app
from gpudoctor.watch.ui.app import ConfirmSignal, HelpScreen, WatchApp, may_signal
from gpudoctor.watch.ui.lines import Lines
from gpudoctor.watch.ui.widgets import SORTS, ProcessTable, status_text
from tests.paths import FIXTURES

RECORDINGS = FIXTURES / "recordings"
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


class Reads(dict):  # type: ignore[type-arg]
    """A dict whose reads through `get` are counted in `tally[0]`: a row formatted reads its own entry once."""

    def __init__(self, data: dict[Any, Any], tally: list[int]) -> None:
        super().__init__(data)
        self.tally = tally

    def get(self, key: Any, default: Any = None) -> Any:
        self.tally[0] += 1
        return super().get(key, default)


def record_drawn(block: Any) -> dict[int, str]:
    """Each row of `block` (its border and padding included) -> its characters as Textual last rendered them."""
    drawn: dict[int, str] = {}
    render = block.render_lines

    def drawing(crop: Region) -> Any:
        strips = render(crop)
        for y, strip in zip(crop.line_range, strips, strict=True):
            drawn[y] = strip.text
        return strips

    block.render_lines = drawing
    return drawn


async def test_updates_arrive_and_are_drawn() -> None:
    app, session = live_app()
    samples = synthetic_run("straggler", 12)
    async with app.run_test(size=SIZE) as pilot:
        assert "waiting for the first reading" in text_of(app.query_one("#status"))
        session.queue.put(samples[0])
        await wait_for(pilot, lambda: app.samples_seen == 1)
        first = text_of(app.query_one("#gpu-lines"))
        assert f"{samples[0].gpus[3].util}%" in first
        assert "8x H100 80GB HBM3" in str(app.query_one("#gpus").border_subtitle)  # one model: named once
        for s in samples[1:]:
            session.queue.put(s)
        await wait_for(pilot, lambda: app.samples_seen == 12)
        assert "GD901 straggler" in text_of(app.query_one("#verdicts"))
        assert "*3" in text_of(app.query_one("#gpu-lines"))  # the straggler is marked
        assert app.query_one(ProcessTable).row_count == 8


async def test_pause_keeps_sampling_but_freezes_the_screen() -> None:
    app, session = live_app()
    samples = synthetic_run("healthy", 4)
    async with app.run_test(size=SIZE) as pilot:
        session.queue.put(samples[0])
        await wait_for(pilot, lambda: app.samples_seen == 1)
        await pilot.press("p")
        assert "PAUSED" in text_of(app.query_one("#status"))
        before = text_of(app.query_one("#gpu-lines"))
        for s in samples[1:]:
            session.queue.put(s)
        await wait_for(pilot, lambda: app.samples_seen == 4)
        assert text_of(app.query_one("#gpu-lines")) == before  # frozen while paused...
        assert session.builder.samples == 4  # ...while the samples still count
        await pilot.press("p")
        assert "PAUSED" not in text_of(app.query_one("#status"))
        assert text_of(app.query_one("#gpu-lines")) != before


async def test_sort_key_cycles_the_process_order() -> None:
    app = replay_app("straggler")
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(ProcessTable)

        def pids() -> list[str]:
            return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]

        by_mem = pids()
        await pilot.press("s")
        assert app.sort == "SM%" and "processes by SM%" in text_of(app.query_one("#status"))
        await pilot.press("s", "s")
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
        table = text_of(app.query_one("#gpu-lines"))
        assert "LOST" in table and "GD908 gpu-lost" in text_of(app.query_one("#verdicts"))
        session.last_arrival -= 60  # NVML stalled for a minute
        app._check_stale()
        assert "STALE" in text_of(app.query_one("#status")) and "(stale)" in text_of(app.query_one("#gpu-lines"))
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


def _procs(sample: Sample, order: list[int]) -> Sample:
    """`sample` with a process reading: one process per GPU, listed in `order` of GPUs."""
    procs = tuple(
        ProcReading(pid=5000 + g, gpu=g, gpu_mem=1000 * (g + 1), user="u", command=f"train {g}") for g in order
    )
    return dataclasses.replace(sample, procs=procs)


async def test_the_selected_process_stays_selected_across_refreshes() -> None:
    app, session = live_app()
    s = synthetic_run("healthy", 3)
    async with app.run_test(size=SIZE) as pilot:
        session.queue.put(_procs(s[0], [0, 1, 2, 3]))
        await wait_for(pilot, lambda: app.query_one(ProcessTable).row_count == 4)
        table = app.query_one(ProcessTable)
        await pilot.press("down", "down")
        assert table.selected is not None and table.selected.pid == 5001  # by GPU memory: 3, 2, 1, 0
        session.queue.put(_procs(s[1], [2, 1, 0, 3]))  # a refresh, another memory order
        await wait_for(pilot, lambda: app.samples_seen == 2)
        assert table.selected is not None and table.selected.pid == 5001  # (was: back to the top row)
        await pilot.press("s", "s", "s")  # sort by PID: it moves, the selection follows
        assert app.sort == "PID" and table.selected.pid == 5001 and table.cursor_row == 1


async def test_processes_read_while_the_table_is_hidden_are_shown_when_it_is() -> None:
    """At 80x24, 8 GPUs and their ranks leave no room for the process table: the readings that come while
    it is hidden are not written into it (issue 22), but the latest is what it shows once it has room, and
    what a key would signal meanwhile."""
    app, session = live_app()
    run = synthetic_run("straggler", 16, ranks=True)  # processes in samples 0, 5, 10 and 15
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(ProcessTable)
        for s in run[:11]:
            session.queue.put(s)
        await wait_for(pilot, lambda: app.samples_seen == 11)
        assert not table.display
        await pilot.resize_terminal(150, 60)
        await wait_for(pilot, lambda: table.display)
        latest = sorted(run[10].procs or (), key=SORTS[app.sort])
        assert table.shown == latest  # this reading's figures, not those of sample 0 or 5
        cpu = [str(table.get_row_at(i)[-3]) for i in range(table.row_count)]
        assert cpu == [f"{p.cpu:.0f}" for p in latest]
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: not table.display)
        for s in run[11:]:
            session.queue.put(s)
        await wait_for(pilot, lambda: app.samples_seen == 16)
        chosen = table.selected
        assert chosen is not None and chosen in (run[15].procs or ())


async def test_a_signal_goes_to_the_selected_process_only_after_confirmation() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(child.pid).create_time()
        app, session = live_app()
        session.source.real_processes = True  # as a live NVML source: its processes are real
        s = synthetic_run("healthy", 2)
        proc = ProcReading(pid=child.pid, gpu=0, gpu_mem=100, user="me", command="sleep", started=started)
        async with app.run_test(size=SIZE) as pilot:
            session.queue.put(dataclasses.replace(s[0], procs=(proc,)))
            await wait_for(pilot, lambda: app.query_one(ProcessTable).row_count == 1)
            await pilot.press("t")
            assert isinstance(app.screen, ConfirmSignal)
            await pilot.press("n")  # anything but y: nothing sent
            await pilot.pause(0.2)
            assert child.poll() is None and not isinstance(app.screen, ConfirmSignal)
            await pilot.press("t")
            await pilot.press("y")
            assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


async def test_made_up_processes_are_never_signalled_even_when_their_pid_is_real() -> None:
    # GPUDOCTOR_WATCH_FAKE plays live, with made-up PIDs that real processes may hold.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(child.pid).create_time()
        session = Session(SyntheticSource("healthy", 2), thresholds=NO_WARMUP)  # as GPUDOCTOR_WATCH_FAKE makes it
        session.last_arrival = time.monotonic()
        app = WatchApp(session, live=True)
        assert session.source.label == "synthetic:healthy" and session.source.real_processes is False
        s = synthetic_run("healthy", 2)
        proc = ProcReading(pid=child.pid, gpu=0, gpu_mem=100, user="me", command="sleep", started=started)
        async with app.run_test(size=SIZE) as pilot:
            session.queue.put(dataclasses.replace(s[0], procs=(proc,)))
            await wait_for(pilot, lambda: app.query_one(ProcessTable).row_count == 1)
            await pilot.press("t")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, ConfirmSignal) and child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_only_the_users_own_live_processes_may_be_signalled(monkeypatch: Any) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(other.pid).create_time()
        mine = ProcReading(pid=other.pid, gpu=0, command="python", started=started)
        assert may_signal(mine) is None
        assert "another process now" in (may_signal(dataclasses.replace(mine, started=started - 100)) or "")
        assert "not visible here" in (may_signal(dataclasses.replace(mine, command="", note="hidden")) or "")
        # a start time that could not be read: the PID alone may name another process by now
        assert "start time could not be read" in (may_signal(dataclasses.replace(mine, started=None)) or "")
        owner = psutil.Process(other.pid).uids().real
        monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # as if another (non-root) user ran gpudoctor
        monkeypatch.setattr(os, "getuid", lambda: owner + 1)
        assert "not to you" in (may_signal(mine) or "")
    finally:
        other.kill()
        other.wait()
    assert "has ended" in (may_signal(mine) or "")


async def test_the_users_own_process_is_shown_whole_on_the_terminal_and_recorded_redacted(tmp_path: Any) -> None:
    """`watch` shows the user their own command lines whole; what reaches a file is the allow-list's."""
    from gpudoctor.watch.recording import RecordWriter

    whole = "python train.py --hf_token hf_MyOwnToken123 --lr 3e-4"
    proc = ProcReading(pid=4242, gpu=0, gpu_mem=100, user="me", command=command_line(whole.split()), own_command=whole)
    assert "hf_MyOwnToken123" not in proc.command
    sample = dataclasses.replace(synthetic_run("healthy", 1)[0], procs=(proc,))
    path = tmp_path / "rec.jsonl"
    writer = RecordWriter(str(path), {"interval": 1.0})
    writer.write(sample)
    writer.close()
    assert "hf_MyOwnToken123" not in path.read_text() and "--hf_token [redacted]" in path.read_text()
    assert "hf_MyOwnToken123" not in json.dumps(proc.to_json())
    # and a recording cannot put a "whole" command on the screen
    assert ProcReading.from_json({**proc.to_json(), "own_command": "forged"}).own_command == ""
    app, session = live_app()
    async with app.run_test(size=SIZE) as pilot:
        session.queue.put(sample)
        await wait_for(pilot, lambda: app.query_one(ProcessTable).row_count == 1)
        table = app.query_one(ProcessTable)
        assert str(table.get_row_at(0)[-1]) == whole


async def test_a_replay_has_no_process_to_signal() -> None:
    app = replay_app("straggler")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        assert not isinstance(app.screen, ConfirmSignal)


async def test_an_xid_stays_listed_and_marked_after_its_window_and_on_the_final_screen() -> None:
    rec = read_recording(recording_path("sample:xid"))
    app = WatchApp(Session(ReplaySource(rec)), live=False, preload=rec.samples)  # the whole recording played
    async with app.run_test(size=(120, 40)):
        verdicts = text_of(app.query_one("#verdicts"))
        assert "GD907 xid-event" in verdicts and "XID 48" in verdicts  # 2 minutes after it left the window
        assert "balanced: no verdicts" not in verdicts
        assert "!6" in text_of(app.query_one("#gpu-lines")) and "XID 48" in text_of(app.query_one("#gpu-lines"))


async def test_verdicts_beyond_the_subjects_listed_are_said_in_the_log(tmp_path: Any) -> None:
    """A churning job (new PIDs behind a stall every sample): the log lists the subjects the summary lists,
    and says in one line, as the summary does, in how many samples GD911 held for ranks beyond them."""
    from gpudoctor.watch.summary import MAX_SUBJECTS_PER_CODE

    t0, pid = 1_700_000_000.0, 10_000
    lines = [json.dumps({"format": "gpudoctor-watch", "version": 1, "interval": 1.0})]
    for i in range(MAX_SUBJECTS_PER_CODE + 100):
        ranks = [{"pid": 4999, "rank": 0, "steps": 0, "last_step": 62, "last_end": t0}]
        ranks += [{"pid": pid + k, "rank": 1 + k, "steps": 0, "last_step": 2, "last_end": t0 - 30} for k in range(2)]
        pid += 2
        lines.append(json.dumps({"t": t0 + i, "gpus": [{"index": 0, "util": 50}], "ranks": ranks}))
    (tmp_path / "churn.jsonl").write_text("\n".join(lines) + "\n")
    rec = read_recording(str(tmp_path / "churn.jsonl"))
    app = WatchApp(Session(ReplaySource(rec)), live=False, preload=rec.samples)
    for size in ((80, 24), (120, 40)):
        async with app.run_test(size=size):
            verdicts = text_of(app.query_one("#verdicts"))
            unlisted = app.last.builder.unlisted["GD911"]
            assert f"GD911 also held in {unlisted} samples for GPUs or ranks" in verdicts, verdicts
        app = WatchApp(Session(ReplaySource(rec)), live=False, preload=rec.samples)


async def test_many_gpus_in_a_small_terminal_keep_the_verdicts_on_screen() -> None:
    run = synthetic_run("straggler", 90, n_gpus=16)
    rec = read_recording(str(RECORDINGS / "straggler.jsonl"))
    rec.samples = run
    app = WatchApp(Session(ReplaySource(rec)), live=False, preload=run)
    async with app.run_test(size=(80, 24)) as pilot:
        assert app._drawn_mode == "compact"  # 16 rows would not leave room for the verdicts
        assert str(app.query_one("#gpus").border_subtitle).endswith("compact: c for rows")
        grid = text_of(app.query_one("#gpu-lines"))
        assert all(f" {g} " in f" {grid} " or f"*{g} " in grid for g in range(16))
        assert "GD901 straggler" in text_of(app.query_one("#verdicts"))
        assert app.query_one("#verdicts").region.height >= 3 and app.query_one("#verdicts").region.y < 24
        await pilot.press("c")  # one row per GPU, pinned: the list scrolls
        assert (
            app._drawn_mode == "full"
            and app.query_one("#gpus").virtual_size.height > app.query_one("#gpus").size.height
        )
        assert str(app.query_one("#gpus").border_subtitle).endswith("c: compact")  # set again only when it changes
        assert "GD901 straggler" in text_of(app.query_one("#verdicts"))


async def test_the_status_line_fits_80_columns_and_keeps_its_flags() -> None:
    app, session = live_app(synthetic_run("healthy", 2))
    async with app.run_test(size=(80, 24)) as pilot:
        session.queue.put(synthetic_run("healthy", 1)[0])
        await wait_for(pilot, lambda: app.samples_seen == 1)
        await pilot.press("p")
        app.ended = "recording ended"
        session.record_error = "recording /tmp/x.jsonl stopped after 5 samples: No space left on device"
        app._draw_status()
        status = text_of(app.query_one("#status")).rstrip("\n")
        assert len(status) <= 78 and "PAUSED" in status and "recording ended" in status
        assert "No space" in status or "recording /tmp" in status


def test_status_text_keeps_parts_by_priority_and_cuts_only_what_may_be_cut() -> None:
    parts = [
        ("PAUSED", "", False),
        ("t+01:00", "", False),
        ("a very long source label " * 4, "", True),
        ("x" * 30, "", False),
    ]
    text = status_text(parts, 50).plain
    assert text.startswith("PAUSED | t+01:00 | a very long") and text.endswith("…") and len(text) == 50
    assert "xxx" not in text


async def test_replay_status_shows_the_recorded_interval_and_the_speed() -> None:
    rec = read_recording(str(RECORDINGS / "straggler.jsonl"))
    app = WatchApp(Session(ReplaySource(rec, speed=10)), live=False, preload=rec.samples[:3])
    async with app.run_test(size=SIZE):
        status = text_of(app.query_one("#status"))
        assert "every 1 s at 10x" in status and "every 0.1 s" not in status


async def test_replay_status_says_a_slow_recording_plays_at_the_capped_pace() -> None:
    """Samples a minute apart are played 2 s apart (no wait of a replay is longer): the status line says
    so, not "every 60 s" (nor "at 10x", which would still wait 6 s) as if that were the pace."""
    rec = read_recording(str(RECORDINGS / "straggler.jsonl"))
    t0 = rec.samples[0].t
    rec.samples = [dataclasses.replace(s, t=t0 + 60.0 * i) for i, s in enumerate(rec.samples[:5])]
    for speed in (1, 10):
        app = WatchApp(Session(ReplaySource(rec, speed=speed)), live=False, preload=rec.samples[:3])
        async with app.run_test(size=SIZE):
            status = text_of(app.query_one("#status"))
            assert "every 60 s, played every 2 s (capped)" in status, status
            assert "at 10x" not in status


async def test_idle_gpus_are_idle_not_balanced() -> None:
    run = synthetic_run("idle", 40)
    rec = read_recording(str(RECORDINGS / "healthy.jsonl"))
    rec.samples = run
    app = WatchApp(Session(ReplaySource(rec)), live=False, preload=run)
    async with app.run_test(size=SIZE):
        verdicts = text_of(app.query_one("#verdicts"))
        assert "idle" in verdicts and "balanced" not in verdicts


async def test_gpu_rows_that_scroll_fit_beside_the_scrollbar() -> None:
    """One row per GPU, pinned by `c`, where they do not all fit: the list scrolls and its scrollbar takes a
    column; the rows are fitted to what is left (they were one column wider and wrapped: every GPU on two
    lines, its utilization history on the second)."""
    run = synthetic_run("straggler", 150, n_gpus=32)  # more history than a row has room for
    rec = read_recording(str(RECORDINGS / "straggler.jsonl"))
    rec.samples = run
    app = WatchApp(Session(ReplaySource(rec)), live=False, preload=run)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("c")
        gpus, rows = app.query_one("#gpus"), app.query_one("#gpu-lines")
        assert app._drawn_mode == "full" and gpus.virtual_size.height > gpus.size.height  # it scrolls
        lines = text_of(rows).rstrip("\n").splitlines()
        assert len(lines) == 33 and all(len(line) <= rows.size.width for line in lines)
        assert all("▁" in line or "█" in line or "▅" in line for line in lines[1:])  # each with its history


async def test_a_replay_at_a_high_speed_does_not_flood_the_dashboard_with_timers() -> None:
    """`watch --replay FILE --speed 1000000`: the sample interval is a microsecond; the staleness timer ran at
    that interval and starved the event loop (a blank screen that ignored q and SIGTERM). It now runs at most
    every STALE_CHECK_S, and keys are answered."""
    rec = read_recording(str(RECORDINGS / "healthy.jsonl"))
    session = Session(ReplaySource(rec, speed=1e6), thresholds=NO_WARMUP)  # not started: nothing is fed
    assert session.source.interval < 1e-5
    session.last_arrival = time.monotonic()
    app = WatchApp(session, live=True)
    checks = 0

    def count() -> None:
        nonlocal checks
        checks += 1

    app._check_stale = count  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        start = time.monotonic()
        await pilot.pause(1.0)
        took = time.monotonic() - start
        await pilot.press("p")
        await wait_for(pilot, lambda: app.paused)
    assert checks <= took / 0.25 + 2, (checks, took)  # thousands a second before


def whole_refreshes(widget: Any) -> list[int]:
    """A counter of the refreshes of `widget` as a whole (no region given: the widget repainted whole)."""
    count = [0]
    refresh = widget.refresh

    def counting(*regions: Any, **how: Any) -> Any:
        if not regions:
            count[0] += 1
        return refresh(*regions, **how)

    widget.refresh = counting
    return count


async def test_a_sample_repaints_neither_the_gpu_panel_nor_the_status_line_whole() -> None:
    """Sample after sample, the GPU panel's subtitle ("8x H100 80GB HBM3, c: compact") stays the same: it is
    not set again, since setting it repaints the whole panel, border and all (issue 22: ~8% of the 128-GPU
    dashboard's main thread). The status line's clock moves each sample: only what changed is repainted,
    not the whole line. Both still show what changes: the subtitle after `c`, the clock each sample."""
    app, session = live_app()
    samples = synthetic_run("healthy", 8)
    async with app.run_test(size=SIZE) as pilot:
        session.queue.put(samples[0])
        await wait_for(pilot, lambda: app.samples_seen == 1)
        gpus, status = app.query_one("#gpus"), app.query_one("#status")
        panel, line = whole_refreshes(gpus), whole_refreshes(status)
        for n, s in enumerate(samples[1:6], start=1):
            session.queue.put(s)
            await wait_for(pilot, lambda n=n: app.samples_seen == n + 1)
            assert f"t+00:{n:02d}" in text_of(status)
        assert str(gpus.border_subtitle) == "8x H100 80GB HBM3, c: compact"
        assert panel[0] == 0, f"the GPU panel was repainted whole {panel[0]} times in 5 samples"
        assert line[0] == 0, f"the status line was repainted whole {line[0]} times in 5 samples"
        await pilot.press("c")  # compact: the subtitle changes, and is set
        assert str(gpus.border_subtitle) == "8x H100 80GB HBM3, compact: c for rows"
        assert panel[0] >= 1
        session.queue.put(samples[6])
        await wait_for(pilot, lambda: app.samples_seen == 7)
        assert str(gpus.border_subtitle) == "8x H100 80GB HBM3, compact: c for rows"


def table_writes(table: ProcessTable) -> list[int]:
    """A counter of what writes rows or cells into `table`."""
    count = [0]
    for name in ("update_cell", "update_cell_at", "add_row", "add_rows", "remove_row", "clear", "add_columns"):
        method = getattr(table, name)

        def counting(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            count[0] += 1
            return _method(*args, **kwargs)

        setattr(table, name, counting)
    return count


async def test_the_process_table_is_not_written_while_it_is_hidden() -> None:
    """At 80x24, 8 GPUs and their ranks leave no room for the process table: the readings that come while it
    is hidden write nothing into it (issue 22: 128 rows nobody saw, every sample), yet once it has room it
    shows the latest reading."""
    app, session = live_app()
    run = synthetic_run("straggler", 11, ranks=True)  # processes in samples 0, 5 and 10
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(ProcessTable)
        session.queue.put(run[0])
        await wait_for(pilot, lambda: app.samples_seen == 1 and not table.display)
        writes = table_writes(table)
        for s in run[1:]:
            session.queue.put(s)
        await wait_for(pilot, lambda: app.samples_seen == 11)
        assert not table.display
        assert writes[0] == 0, f"{writes[0]} writes into the hidden process table"
        await pilot.resize_terminal(150, 60)
        await wait_for(pilot, lambda: table.display, timeout=30)
        latest = sorted(run[10].procs or (), key=SORTS[app.sort])
        assert writes[0] > 0 and table.shown == latest
        cpu = [str(table.get_row_at(i)[-3]) for i in range(table.row_count)]
        assert cpu == [f"{p.cpu:.0f}" for p in latest]  # this reading's figures, not those of sample 0 or 5


async def test_a_resize_after_a_replay_ended_redraws_the_panels_at_the_new_size() -> None:
    """No sample comes after a replay has ended: a resize alone must share out the new height. The panels
    were drawn for the size before the resize (Textual had not taken the new one yet) and kept it for good:
    a larger terminal left the process table hidden below blank rows, a smaller one pushed the verdicts
    off the screen."""
    run = synthetic_run("straggler", 60, ranks=True)  # past the warm-up: a verdict holds
    rec = read_recording(str(RECORDINGS / "straggler.jsonl"))
    rec.samples = run
    session = Session(ReplaySource(rec), thresholds=NO_WARMUP)
    app = WatchApp(session, live=False, preload=run)  # played to its end: nothing more comes
    async with app.run_test(size=(80, 24)) as pilot:
        table, verdicts = app.query_one(ProcessTable), app.query_one("#verdicts")
        assert not table.display
        await pilot.resize_terminal(150, 60)
        await wait_for(pilot, lambda: table.display and table.region.bottom == 60 - 1, timeout=30)
        assert table.row_count == len(run[55].procs or ())  # the last reading with processes
        assert app._drawn_mode == "full" and app.query_one("#gpus").region.height == 2 + 1 + 8  # a row per GPU
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: not table.display and verdicts.region.bottom <= 24 - 1, timeout=30)
        assert "GD901 straggler" in text_of(verdicts)


async def test_only_the_gpu_rows_in_view_are_made_and_the_last_gpu_scrolled_to_shows_the_latest_sample(
    monkeypatch: Any,
) -> None:
    """128 GPUs as rows (`c` pins them, where the grid was chosen) at 200x60: about 40 are in view, and the
    others are not made each sample (issue 22: all 128 lines and their histories were, 7.5 ms a sample); yet
    the last GPU scrolled to shows the latest sample's utilization."""
    made = [0]  # GPU rows formatted: each asks the history for its GPU's once
    real = watch_app.gpu_rows
    monkeypatch.setattr(watch_app, "gpu_rows", lambda gpus, history, *rest: real(gpus, Reads(history, made), *rest))
    app, session = live_app()
    run = synthetic_run("healthy", 6, n_gpus=128, ranks=True)
    async with app.run_test(size=(200, 60)) as pilot:
        panel, block = app.query_one("#gpus"), app.query_one("#gpu-lines")
        drawn = record_drawn(block)
        for i, s in enumerate(run):
            if i == 1:
                await pilot.press("c")  # the rows, not the grid
                await wait_for(pilot, lambda: app._drawn_mode == "full", timeout=30)
            made[0] = 0
            session.queue.put(s)
            await wait_for(pilot, lambda s=s: app.last is not None and app.last.sample is s, timeout=30)
            await pilot.pause()
            if i >= 1:
                assert 0 < made[0] <= panel.size.height + 1, f"{made[0]} GPU rows made, {panel.size.height} in view"
        assert panel.size.height < 128 and block.size.height == 129  # the header and a row per GPU: it scrolls
        panel.scroll_end(animate=False)
        await pilot.pause()
        last = run[-1].gpus[-1]
        assert last.index == 127
        bottom = drawn[block.size.height - 1]  # made when scrolled to, from the latest sample
        assert bottom.split()[:2] == ["127", f"{last.util}%"], bottom


async def test_a_gpu_row_scrolled_to_while_paused_shows_the_history_as_it_was_drawn() -> None:
    """Paused, with 64 GPUs as rows: the samples that come meanwhile go on into the history, but a row made
    when scrolled to (gpu_rows makes them on demand) shows it as it was when drawing paused, beside the
    utilization drawn then; resumed, the whole history."""
    app, session = live_app()
    run = synthetic_run("healthy", 30, n_gpus=64, ranks=True)
    busy = [  # GPU 63 idle for 10 samples, then busy: its history tells which samples a row was made from
        dataclasses.replace(s, gpus=tuple(dataclasses.replace(g, util=100 * (i >= 10)) for g in s.gpus))
        for i, s in enumerate(run)
    ]
    async with app.run_test(size=(120, 40)) as pilot:
        panel, block = app.query_one("#gpus"), app.query_one("#gpu-lines", Lines)
        for i, s in enumerate(busy):
            if i == 1:
                await pilot.press("c")  # the rows, not the grid
                await wait_for(pilot, lambda: app._drawn_mode == "full", timeout=30)
            if i == 10:
                await pilot.press("p")
            session.queue.put(s)
            await wait_for(pilot, lambda s=s: app.last is not None and app.last.sample is s, timeout=30)
            await pilot.pause()
        assert panel.size.height < 64
        panel.scroll_end(animate=False)
        await pilot.pause()
        bottom = block._lines[-1].plain
        assert bottom.split()[:2] == ["63", "0%"] and bottom.endswith(" " + "▁" * 10), bottom
        await pilot.press("p")
        await pilot.pause()
        assert block._lines[-1].plain.endswith(" " + "▁" * 10 + "█" * 20), block._lines[-1].plain


async def test_only_the_rank_rows_in_view_are_made_and_a_row_scrolled_to_shows_the_latest_sample(
    monkeypatch: Any,
) -> None:
    """128 ranks at 200x60: about 40 rank rows are in view; the others are not made each sample (issue 22:
    all 128 were formatted, compared and refreshed every sample), yet a row scrolled to shows the latest
    sample's figures, even one drawn before, then out of view while samples came."""
    made = [0]  # rank rows formatted: each asks the balance for its rank's figures once
    real = watch_app.rank_rows
    monkeypatch.setattr(
        watch_app, "rank_rows", lambda readings, stats, *rest: real(readings, Reads(stats, made), *rest)
    )
    app, session = live_app()
    run = synthetic_run("healthy", 12, n_gpus=128, ranks=True)  # no verdict: the ranks in order, 127 last
    async with app.run_test(size=(200, 60)) as pilot:
        panel, block = app.query_one("#ranks"), app.query_one("#rank-lines")
        drawn = record_drawn(block)

        async def feed(samples: list[Any]) -> None:
            for s in samples:
                made[0] = 0
                session.queue.put(s)
                await wait_for(pilot, lambda s=s: app.last is not None and app.last.sample is s, timeout=30)
                await pilot.pause()
                assert 0 < made[0] <= panel.size.height + 1, f"{made[0]} rank rows made, {panel.size.height} in view"

        def last_rows(sample: Sample) -> None:
            bottom = block.size.height - 1  # the last rank's row: 127
            last = next(r for r in sample.ranks or () if r.rank == 127)
            assert drawn[bottom].split()[0] == "127" and f" {last.last_step:>11} " in drawn[bottom], drawn[bottom]

        await feed(run[:4])
        assert panel.size.height < 128 and block.size.height == 129  # the header and a row per rank: it scrolls
        panel.scroll_end(animate=False)
        await pilot.pause()
        last_rows(run[3])
        panel.scroll_home(animate=False)
        await pilot.pause()
        await feed(run[4:])  # rank 127's row, drawn before, is out of view
        panel.scroll_end(animate=False)
        await pilot.pause()
        last_rows(run[11])
