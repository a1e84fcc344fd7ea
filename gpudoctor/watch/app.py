"""The Textual dashboard. It draws what the session hands it and decides nothing itself.

Samples arrive from the session's queue through a thread worker (so a stalled NVML call
never blocks the UI); the only timer runs once per interval to notice stale readings.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import signal
import time
from typing import Any

from rich.markup import escape
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from gpudoctor.watch.model import Sample, plural
from gpudoctor.watch.session import End, Session, Update
from gpudoctor.watch.sources import Notice
from gpudoctor.watch.widgets import SORTS, BalancePanel, GpuTable, ProcessTable

INTERRUPTED = "interrupted"  # what the app returns on Ctrl-C: gpudoctor exits 130, as without a dashboard
# Signals that end the dashboard like Ctrl-C. They are taken by the event loop (not raised as an
# exception at whatever line the UI is running), so the app always shuts down cleanly.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

HELP = """\
[b]gpudoctor watch[/b]: are all my GPUs working evenly?

  [b]q[/b]  quit (a command started by gpudoctor is stopped too)
  [b]ctrl+c[/b]  interrupt: stop the command, exit 130
  [b]p[/b]  pause / resume drawing (sampling and --record go on)
  [b]s[/b]  sort the process table: GPU memory, CPU%, PID, GPU
  [b]?[/b]  this help

GPU numbers marked [yellow]*[/] are named by a verdict, [red]![/] are suspects.
A dimmed row is stale: NVML did not answer in time. n/a: the GPU does not report it.
Every verdict code has a page: gpudoctor explain GD901 ... GD908.

Press any key to close."""


class SampleArrived(Message):
    def __init__(self, sample: Sample) -> None:
        super().__init__()
        self.sample = sample


class NoticeArrived(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class SourceEnded(Message):
    def __init__(self, end: End) -> None:
        super().__init__()
        self.end = end


class HelpScreen(ModalScreen[None]):
    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")

    def on_key(self) -> None:
        self.dismiss()


class WatchApp(App[str]):
    CSS_PATH = "app.tcss"
    TITLE = "gpudoctor watch"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        # Textual's own ctrl+c only says "press ctrl+q to quit"; here it interrupts, as in a shell.
        Binding("ctrl+c", "interrupt", "interrupt", show=False, priority=True),
        Binding("p", "pause", "pause"),
        Binding("s", "sort", "sort"),
        Binding("question_mark", "help", "help", key_display="?"),
    ]

    def __init__(
        self, session: Session, *, live: bool = True, preload: list[Sample] | None = None, duration: float | None = None
    ) -> None:
        super().__init__()
        self.session = session
        self.live = live
        self.preload = preload or []
        self.duration = duration
        self.paused = False
        self.stale = False
        self.ended: str | None = None
        self.sort = next(iter(SORTS))
        self.last: Update | None = None
        self.procs: tuple[Any, ...] = ()
        self.samples_seen = 0
        self.started = time.monotonic()
        self.signum: int | None = None  # the signal that ended the app (SIGTERM, SIGHUP), if one did
        self.notice: str | None = None  # the latest thing the session said (a skipped gap in a replay)

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        with Vertical(id="main"):
            yield GpuTable(id="gpus")
            yield BalancePanel(id="balance")
            yield ProcessTable(id="procs")
        yield Footer()

    def on_mount(self) -> None:
        if self.live:
            loop = asyncio.get_running_loop()
            for sig in STOP_SIGNALS:
                with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
                    loop.add_signal_handler(sig, self._signalled, sig)
        self.query_one("#balance").border_title = "balance"
        self.query_one("#procs").border_title = "processes"
        self.query_one("#gpus").border_title = "GPUs"
        for s in self.preload:
            self._take(s)
        self._draw()
        if self.live:
            self._pump()
            self.set_interval(self.session.source.interval, self._check_stale)
            if self.duration is not None:
                self.set_timer(self.duration, lambda: self.exit("duration"))

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _pump(self) -> None:
        """Moves samples from the session queue to the UI thread as messages."""
        worker = get_current_worker()
        while not worker.is_cancelled:
            try:
                item = self.session.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if isinstance(item, End):
                self.post_message(SourceEnded(item))
                return
            if isinstance(item, Notice):
                self.post_message(NoticeArrived(item.text))
                continue
            self.post_message(SampleArrived(item))

    def on_sample_arrived(self, message: SampleArrived) -> None:
        self._take(message.sample)
        if self.stale:
            self.stale = False
        self._draw()

    def on_notice_arrived(self, message: NoticeArrived) -> None:
        self.notice = message.text
        self._draw_status()

    def on_source_ended(self, message: SourceEnded) -> None:
        if message.end.reason == "job":
            self.exit("job")
        else:
            self.ended = "recording ended" + ("" if self.session.damage is None else " (the summary notes its damage)")
            if message.end.detail:
                self.ended = f"sampling stopped: {message.end.detail}"
            self._draw_status()

    def _take(self, sample: Sample) -> None:
        self.last = self.session.handle(sample)
        self.samples_seen += 1
        self.query_one(GpuTable).add_history(self.last.sample.gpus)
        if self.last.sample.procs is not None:
            self.procs = self.last.sample.procs
            if not self.paused:
                self.query_one(ProcessTable).show(self.procs, self.sort)

    def _check_stale(self) -> None:
        quiet = time.monotonic() - self.session.last_arrival
        stale = self.ended is None and quiet >= self.session.stale_after
        if stale != self.stale:
            self.stale = stale
            self._draw()

    # -- drawing ---------------------------------------------------------------------------------
    def _draw(self) -> None:
        self._draw_status()
        if self.paused or self.last is None:
            return
        flagged: dict[int, str] = {}
        for v in self.last.verdicts:
            for g in v.gpus:
                flagged[g] = "!" if v.severity == "fail" else flagged.get(g, "*")
        self.query_one(GpuTable).show(self.last.sample.gpus, flagged, self.stale)
        self.query_one(BalancePanel).show(
            self.last.builder.balance, self.last.verdicts, self.session.thresholds.window_s
        )

    def _draw_status(self) -> None:
        parts = [f"source: {self.session.source.label}"]
        if self.last is not None:
            b = self.last.builder
            elapsed = int((b.end or 0) - (b.start or 0))
            parts.append(plural(len(self.last.sample.gpus), "GPU"))
            parts.append(f"t+{elapsed // 60:02d}:{elapsed % 60:02d}")
        else:
            parts.append("waiting for the first reading")
        parts.append(f"interval {self.session.source.interval:g} s")
        job = self.session.job
        if job is not None:
            parts.append(f"following PID {job.root.pid}: {job.command[:60]}")
        if self.stale:
            parts.append("[b red]STALE: no reading from NVML[/]")
        if self.paused:
            parts.append("[b yellow]PAUSED[/]")
        if self.ended:
            parts.append(f"[b]{self.ended}[/]")
        if self.notice:
            parts.append(escape(self.notice))
        if self.session.record_error:
            parts.append(f"[b red]{escape(self.session.record_error)}[/]")
        parts.append(f"processes by {self.sort}")
        self.query_one("#status", Static).update("  |  ".join(parts))

    # -- keys ------------------------------------------------------------------------------------
    def action_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused:
            self.query_one(ProcessTable).show(self.procs, self.sort)
        self._draw()

    def action_sort(self) -> None:
        keys = list(SORTS)
        self.sort = keys[(keys.index(self.sort) + 1) % len(keys)]
        self.query_one(ProcessTable).show(self.procs, self.sort)
        self._draw_status()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        self.exit("quit")

    def action_interrupt(self) -> None:
        self.exit(INTERRUPTED)

    def _signalled(self, signum: int) -> None:
        self.signum = signum
        self.exit(INTERRUPTED)


def run_app(session: Session, duration: float | None = None) -> tuple[str | None, int | None]:
    """Run the dashboard; returns why it ended and the signal that ended it (None: no signal)."""
    app = WatchApp(session, duration=duration)
    result = app.run()
    return result, app.signum
