"""`watch` sets the heap it started with aside from the cyclic garbage collector (gpudoctor/watch/heap.py):
at 128 GPUs the collections walking the dashboard's ~110,000 long-lived objects were ~15% of its main
thread. Only the command does it: a dashboard or a session made in code leaves the collector alone."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from gpudoctor.watch import heap
from gpudoctor.watch.recording import RecordWriter
from gpudoctor.watch.synthetic import synthetic_run
from gpudoctor.watch.ui.app import WatchApp
from tests.helpers.cli import run_cli
from tests.watch.ui.test_app import live_app, wait_for


@pytest.mark.parametrize("settle", [True, False], ids=["the command's dashboard", "one made in code"])
async def test_the_dashboard_settles_its_heap_after_its_first_frame_when_the_command_runs_it(
    settle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert gc.get_freeze_count() == 0
    calls = []
    real = heap.settle
    monkeypatch.setattr(heap, "settle", lambda: calls.append(1) or real())
    _, session = live_app()
    app = WatchApp(session, live=True, settle_heap=settle)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert gc.get_freeze_count() == 0  # not before: Textual's widgets and styles are made with the first frame
        session.queue.put(synthetic_run("healthy", 1)[0])
        await wait_for(pilot, lambda: app.samples_seen == 1)
        await pilot.pause()
        assert (gc.get_freeze_count() > 0) is settle
        assert any(o is app for o in gc.get_objects()) is not settle  # set aside: no generation holds it
        session.queue.put(synthetic_run("healthy", 2)[1])
        await wait_for(pilot, lambda: app.samples_seen == 2)
        assert len(calls) == int(settle)  # once, after the first frame


def test_headless_watch_settles_its_heap_and_report_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = tmp_path / "run.jsonl"
    writer = RecordWriter(str(rec), {"interval": 1.0})
    for s in synthetic_run("healthy", 3):
        writer.write(s)
    writer.close()
    assert run_cli(capsys, "report", str(rec)).exit_code == 0
    assert gc.get_freeze_count() == 0
    assert run_cli(capsys, "watch", "--replay", str(rec), "--no-tui", "--speed", "1000").exit_code == 0
    assert gc.get_freeze_count() > 0  # the conftest gives this process its collector back after the test
