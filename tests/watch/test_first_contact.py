"""`watch` on first contact (issue 24): `--demo` into a pipe ends by itself; a job without a GPU gets
a process table of its own processes (CPU%, RSS) instead of half an empty screen; the help fits an
80x24 terminal."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.text import Text

from gpudoctor.watch.model import ProcReading, RankReading, Sample
from gpudoctor.watch.recording import read_recording
from gpudoctor.watch.session import Session
from gpudoctor.watch.sources import HostSource, ReplaySource
from gpudoctor.watch.ui.app import HELP, HelpScreen, WatchApp
from gpudoctor.watch.ui.widgets import ProcessTable
from tests.helpers.processes import GpudoctorCli
from tests.paths import FIXTURES

# -- --demo into a pipe ----------------------------------------------------------------------------


def test_demo_without_a_terminal_ends_by_itself(gpudoctor_cli: GpudoctorCli) -> None:
    # 60 s of warm-up and 30 s of verdicts at 45x: 2 s. Before issue 24 it ran until killed.
    r = gpudoctor_cli("watch", "--demo", "straggler", "--gpus", "4", "--speed", "45", timeout=90)
    assert r.returncode == 0, r.stderr
    assert "--demo without a terminal ends after 2 s (--duration to choose)" in r.stderr
    assert "GD901 straggler" in r.stdout


# -- a job without a GPU: its processes --------------------------------------------------------------


def test_the_host_source_lists_the_jobs_processes_with_cpu_and_rss() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        source = HostSource(0.1, 0.1, "no NVIDIA driver")
        source.pids = lambda: {os.getpid(), child.pid}
        source.open()
        stop = threading.Event()
        first = source.next(stop)
        time.sleep(0.2)
        second = source.next(stop)
        assert first is not None and second is not None and second.procs is not None
        rows = {p.pid: p for p in second.procs}
        assert set(rows) == {os.getpid(), child.pid}
        me = rows[os.getpid()]
        assert me.gpu is None and me.rss is not None and me.rss > 0 and me.cpu is not None
        assert "python" in rows[child.pid].command and rows[child.pid].started is not None
        # a recording keeps them: a process without a GPU reads back as one
        again = Sample.from_json(second.to_json())
        assert again.procs is not None and {p.gpu for p in again.procs} == {None}
    finally:
        child.kill()
        child.wait()


def _cpu_job_sample(i: int) -> Sample:
    procs = tuple(
        ProcReading(4000 + r, None, user="me", cpu=97.0, rss=900 + r, command=f"python train.py --rank {r}")
        for r in range(2)
    )
    ranks = tuple(RankReading(pid=4000 + r, rank=r, steps=10, step_s=0.2, last_step=10 * i) for r in range(2))
    return Sample(1_700_000_000.0 + i, (), 55.0, procs, ranks=ranks)


async def test_a_job_without_a_gpu_fills_the_screen_with_its_processes() -> None:
    rec = read_recording(str(FIXTURES / "recordings" / "healthy.jsonl"))
    rec.samples = []
    session = Session(ReplaySource(rec))
    session.last_arrival = time.monotonic()
    app = WatchApp(session, live=True)
    async with app.run_test(size=(80, 24)) as pilot:
        session.queue.put(_cpu_job_sample(0))
        deadline = time.monotonic() + 10
        while app.samples_seen < 1:
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        await pilot.pause(0.1)
        table = app.query_one(ProcessTable)
        procs = app.query_one("#procs")
        assert procs.display and table.row_count == 2
        labels = [str(c.label) for c in table.columns.values()]
        assert labels == ["PID", "user", "CPU%", "RSS", "command"]  # no empty GPU columns
        # the table takes the room the GPUs would have had: down to the key line
        assert procs.region.bottom == 23, procs.region


# -- the help at 80x24 -------------------------------------------------------------------------------


def _rendered(markup: str, width: int) -> list[str]:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(Text.from_markup(markup))
    return console.export_text().rstrip("\n").splitlines()


async def test_the_help_fits_80x24_without_a_ragged_wrap() -> None:
    rec = read_recording(str(FIXTURES / "recordings" / "healthy.jsonl"))
    app = WatchApp(Session(ReplaySource(rec)), live=False, preload=rec.samples)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        help_box: Any = app.screen.query_one("#help")
        width, height = help_box.content_size
        region = help_box.region
        assert region.y >= 0 and region.bottom <= 24 and region.right <= 80
        lines = _rendered(HELP, width)
        assert len(lines) <= height, f"{len(lines)} lines in {height} rows: the end is cut off"
        # Every key line stays one line: nothing wraps back to the left margin under a key.
        for line in HELP.splitlines():
            if line.startswith("  "):
                assert len(Text.from_markup(line).plain) <= width, line
        # No line of the paragraph is a stub left by a hard line break (`one; a GPU` / `stale: NVML did`).
        paragraph = [ln for ln in lines if ln and not ln.startswith(" ")][1:-1]
        assert all(len(ln.rstrip()) > width // 2 for ln in paragraph[:-1]), paragraph
