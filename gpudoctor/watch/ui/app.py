"""The Textual dashboard. It draws what the session hands it and decides nothing itself.

Samples arrive from the session's queue through a thread worker (so a stalled NVML call
never blocks the UI); the only timer runs once per interval (at most every STALE_CHECK_S) to notice
stale readings.

Beside it: layout.py shares out the height between the panels, widgets.py makes their lines,
screens.py holds the key bar, the help and the question before a signal, and process_signal.py
says which process a key may signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import signal
import sys
import time
from collections import deque
from typing import Any

import psutil
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Static
from textual.worker import get_current_worker

from gpudoctor.safety.safe_text import printable
from gpudoctor.safety.signals import STOP_SIGNALS
from gpudoctor.watch import heap
from gpudoctor.watch.model import ProcReading, Sample
from gpudoctor.watch.session import End, Session, Update
from gpudoctor.watch.sources import Notice
from gpudoctor.watch.summary import unlisted_text
from gpudoctor.watch.terminal import TerminalOutput
from gpudoctor.watch.ui.layout import Heights, share_heights
from gpudoctor.watch.ui.lines import Lines
from gpudoctor.watch.ui.process_signal import may_signal, signal_target
from gpudoctor.watch.ui.screens import HELP as HELP  # re-exported: tests/watch read the help from here
from gpudoctor.watch.ui.screens import KEYS, ConfirmSignal, HelpScreen
from gpudoctor.watch.ui.widgets import (
    HISTORY,
    SORTS,
    ProcessTable,
    balance_line,
    event_lines,
    gpu_grid,
    gpu_rows,
    host_line,
    marks_for,
    rank_rows,
    status_text,
)

INTERRUPTED = "interrupted"  # what the app returns on Ctrl-C: gpudoctor exits 130, as without a dashboard
STALE_CHECK_S = 0.25  # how often the app asks whether samples stopped (stale_after is 2 s at least)


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


def terminal_driver(output: TerminalOutput) -> Any:
    """Textual's Linux driver writing through `output` (None elsewhere: Textual's own)."""
    if sys.platform == "win32":
        return None
    from textual.drivers.linux_driver import LinuxDriver

    class Driver(LinuxDriver):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._file = output

    return Driver


class WatchApp(App[str]):
    CSS_PATH = "app.tcss"
    TITLE = "gpudoctor watch"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        # Textual's own ctrl+c only says "press ctrl+q to quit"; here it interrupts, as in a shell.
        Binding("ctrl+c", "interrupt", "interrupt", show=False, priority=True),
        Binding("p", "pause", "pause"),
        Binding("c", "compact", "compact"),
        Binding("s", "sort", "sort"),
        Binding("t", "signal('SIGTERM')", "SIGTERM"),
        Binding("i", "signal('SIGINT')", "SIGINT", show=False),
        Binding("question_mark", "help", "help", key_display="?"),
    ]

    def __init__(
        self,
        session: Session,
        *,
        live: bool = True,
        preload: list[Sample] | None = None,
        duration: float | None = None,
        driver_class: Any = None,
        output: TerminalOutput | None = None,
        settle_heap: bool = False,
    ) -> None:
        super().__init__(driver_class=driver_class)
        self.output = output  # the terminal stream (run_app), told to stop waiting on a stop signal
        self.settle_heap = settle_heap  # run_app: the heap is settled once the first sample is on the screen
        self._loop: asyncio.AbstractEventLoop | None = None
        self.session = session
        self.live = live
        self.preload = preload or []
        self.duration = duration
        self.paused = False
        self.stale = False
        self.ended: str | None = None
        self.sort = next(iter(SORTS))
        self.mode = "auto"  # GPU rows: "auto" (chosen by height), or "compact"/"full" pinned by the `c` key
        self.last: Update | None = None
        self.procs: tuple[ProcReading, ...] = ()
        self.samples_seen = 0
        self.started = time.monotonic()
        self.signum: int | None = None  # the signal that ended the app (SIGTERM, SIGHUP), if one did
        self.notice: str | None = None  # the latest thing the session said (a skipped gap in a replay)
        self.history: dict[int, Any] = {}
        self._heights: dict[str, Any] = {}
        self._drawn_mode = "full"
        self._subtitle: str | None = None  # the GPU panel's subtitle as last set

    def compose(self) -> ComposeResult:
        yield Lines(id="status")  # as a Static, its one line went through Textual's text layout each sample
        yield Lines(id="host")
        with Vertical(id="main"):
            with VerticalScroll(id="gpus"):
                yield Lines(id="gpu-lines")
            with VerticalScroll(id="ranks"):
                yield Lines(id="rank-lines")
            yield Lines(id="verdicts")
            yield ProcessTable(id="procs")
        yield Static(KEYS, id="keys")  # not Textual's Footer: a widget per key costs the first frame ~0.1 s

    def on_mount(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.signum is not None:  # a stop signal came while the app started
            self.exit(INTERRUPTED)
            return
        self.query_one("#gpus").border_title = "GPUs"
        self.query_one("#ranks").border_title = "training steps"
        self.query_one("#verdicts").border_title = "verdicts"
        self.query_one("#procs").border_title = "processes"
        self.query_one(ProcessTable).focus()
        for s in self.preload:
            self._take(s)
        self._draw()
        if self.live:
            self._pump()
            # Never more often than STALE_CHECK_S: a replay at a high --speed has an interval of microseconds,
            # and a timer that short starves the event loop (keys, signals) of the dashboard.
            self.set_interval(max(self.session.source.interval, STALE_CHECK_S), self._check_stale)
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
            if item is None:  # on_unmount: the app is ending
                return
            if isinstance(item, End):
                self.post_message(SourceEnded(item))
                return
            if isinstance(item, Notice):
                self.post_message(NoticeArrived(item.text))
                continue
            self.post_message(SampleArrived(item))

    def on_unmount(self) -> None:
        if self.live:  # wake the pump now: the event loop waits for its thread on the way out
            self.session.queue.put(None)

    def on_sample_arrived(self, message: SampleArrived) -> None:
        self._take(message.sample)
        if self.stale:
            self.stale = False
        self._draw()
        if self.settle_heap:  # after the first frame: Textual's widgets, styles and caches are made by then
            self.settle_heap = False
            self.call_after_refresh(heap.settle)

    def on_notice_arrived(self, message: NoticeArrived) -> None:
        self.notice = message.text
        self._draw_status()

    def on_source_ended(self, message: SourceEnded) -> None:
        if message.end.reason == "job":
            self.exit("job")
        else:
            damaged = self.session.damage or getattr(self.session.source, "damage", None)
            self.ended = "recording ended" + ("" if damaged is None else " (damaged: see the summary)")
            if message.end.detail:
                self.ended = f"sampling stopped: {message.end.detail}"
            self._draw()  # the final screen: every verdict that fired stays in the log

    def on_resize(self) -> None:
        # Called before App._on_resize takes the new size: drawn now, the panels kept the old heights until the
        # next sample (for good once a replay had ended).
        self.call_later(self._draw)

    def _take(self, sample: Sample) -> None:
        self.last = self.session.handle(sample)
        self.samples_seen += 1
        for g in self.last.sample.gpus:
            h = self.history.get(g.index)
            if h is None:
                h = self.history[g.index] = deque(maxlen=HISTORY)
            if g.util is not None and g.alive:
                h.append(g.util)
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
        width, height = self.size
        inner = max(20, width - 4)  # borders and padding
        update = self.last
        builder = update.builder
        sample = update.sample
        sticky = {
            k: "XID " + ",".join(map(str, sorted(st.xids))) if st.xids else "LOST"
            for k, st in builder.gpu_stats.items()
            if st.xids or st.lost
        }
        gpu_marks, rank_marks = marks_for(update.verdicts, sticky)
        self.query_one("#host", Lines).show([host_line(sample.cpu, sample.host)])
        events = builder.events()
        active = [e for e in events if e.active]
        n_gpus, ranks = len(sample.gpus), sample.ranks or ()
        heights = share_heights(
            height,
            inner,
            n_gpus=n_gpus,
            n_ranks=len(ranks),
            n_events=len(events),
            n_active=len(active),
            any_procs=bool(self.procs),
            mode=self.mode,
        )
        mode = heights.mode
        self._set_heights(heights)
        table = self.query_one(ProcessTable)
        if table.display:  # shown again: the reading that came while it was hidden
            table.catch_up()
        if n_gpus:
            gpu_lines = self.query_one("#gpu-lines", Lines)
            if mode == "full":  # where the list scrolls, its scrollbar takes a column from the rows
                row_w = inner - heights.gpus_scroll
                rows = gpu_rows(sample.gpus, self.history, gpu_marks, sticky, row_w, self.stale)
                gpu_lines.show(rows, self._in_view("#gpus"))
            else:
                gpu_lines.show(gpu_grid(sample.gpus, gpu_marks, inner))
        self._drawn_mode = mode
        names = {g.name.removeprefix("NVIDIA ") for g in sample.gpus if g.name}
        model = f" {names.pop()}" if len(names) == 1 else ""
        how = "compact: c for rows" if mode == "compact" else "c: compact"
        subtitle = f"{n_gpus}x{model}, {how}"
        if subtitle != self._subtitle:  # setting it repaints the whole panel, border and all, even unchanged
            self._subtitle = subtitle
            self.query_one("#gpus").border_subtitle = subtitle
        if ranks:
            rows = rank_rows(ranks, builder.balance.ranks, rank_marks, sample.t, inner)
            self.query_one("#rank-lines", Lines).show(rows, self._in_view("#ranks"))
        room = max(1, heights.verdicts - 3)
        log = [balance_line(builder.balance, self.session.thresholds.window_s, inner)]
        if not events:
            text = "no verdicts yet" if builder.balance.warming is not None else "balanced: no verdicts"
            if builder.balance.idle:
                text = "no verdicts: the GPUs are idle"
            log.append(Text(text, style="green"))
        beyond = "; ".join(unlisted_text(code, n) for code, n in sorted(builder.unlisted.items()))
        log += event_lines(events, inner, builder.start or sample.t, room - bool(beyond), heights.hints)
        if beyond:  # the log lists the subjects the summary lists; what held beyond them is said in one line
            log.append(Text(beyond, style="yellow", overflow="ellipsis", no_wrap=True))
            log[-1].truncate(inner, overflow="ellipsis")
        self.query_one("#verdicts", Lines).show(log)

    def _in_view(self, panel_id: str) -> range:
        """The rows of a scrolling panel's lines in view (the header is row 0): the others are made if scrolled to."""
        panel = self.query_one(panel_id)
        top = int(panel.scroll_y)
        return range(top, top + panel.size.height + 1)

    def _set_heights(self, heights: Heights) -> None:
        wanted = {
            "#gpus": heights.gpus,
            "#ranks": heights.ranks,
            "#verdicts": heights.verdicts,
            "#procs": heights.procs,
        }
        for selector, h in wanted.items():
            if self._heights.get(selector) == h:
                continue
            self._heights[selector] = h
            widget = self.query_one(selector)
            widget.display = h > 0
            widget.styles.height = max(h, 0)

    def _draw_status(self) -> None:
        source = self.session.source
        parts: list[tuple[str, str, bool]] = []
        if self.stale:
            parts.append(("STALE: no reading from NVML", "bold red", False))
        if self.paused:
            parts.append(("PAUSED", "bold yellow", False))
        if self.ended:
            parts.append((self.ended, "bold", True))
        if self.session.record_error:
            parts.append((self.session.record_error, "bold red", True))
        if self.last is not None:
            b = self.last.builder
            elapsed = int((b.end or 0) - (b.start or 0))
            parts.append((f"t+{elapsed // 60:02d}:{elapsed % 60:02d}", "bold", False))
        else:
            parts.append(("waiting for the first reading", "", False))
        recorded = getattr(source, "recorded_interval", None)
        speed = getattr(source, "speed", 1.0)
        if getattr(source, "capped", False):  # the recording's pace at this speed waits longer than a replay does
            parts.append((f"every {recorded:g} s, played every {source.interval:g} s (capped)", "", False))
        elif recorded is not None:  # a replay or a demo: what the recording says, and how fast it plays
            parts.append((f"every {recorded:g} s" + (f" at {speed:g}x" if speed != 1 else ""), "", False))
        else:
            parts.append((f"every {source.interval:g} s", "", False))
        if self.notice:  # after the clock: a long note is cut, the clock is not
            parts.append((self.notice, "yellow", True))
        job = self.session.job
        parts.append((source.label, "", True))
        if job is not None:
            parts.append((f"PID {job.root.pid}: {printable(job.display)}", "", True))
        parts.append((f"processes by {self.sort}", "dim", False))
        line = status_text(parts, max(20, self.size.width - 2))
        self.query_one("#status", Lines).show([line])

    # -- keys ------------------------------------------------------------------------------------
    def action_pause(self) -> None:
        self.paused = not self.paused
        if self.paused:
            # The GPU rows on the screen are made from the history when scrolled to (gpu_rows): the samples that
            # come while paused go on into a copy, so that a row scrolled to shows the history as it was drawn.
            self.history = {k: h.copy() for k, h in self.history.items()}
        else:
            self.query_one(ProcessTable).show(self.procs, self.sort)
        self._draw()

    def action_compact(self) -> None:
        self.mode = "full" if self._drawn_mode == "compact" else "compact"
        self._draw()

    def action_sort(self) -> None:
        keys = list(SORTS)
        self.sort = keys[(keys.index(self.sort) + 1) % len(keys)]
        self.query_one(ProcessTable).show(self.procs, self.sort)
        self._draw_status()

    def action_signal(self, name: str) -> None:
        chosen = self.query_one(ProcessTable).selected
        if chosen is None:
            self.notify("no process selected", severity="warning")
            return
        if not self.live or not getattr(self.session.source, "real_processes", False):
            self.notify("a recording or a demo: there is no live process to signal", severity="warning")
            return
        why = may_signal(chosen)
        if why is not None:
            self.notify(why, severity="warning")
            return
        sig = signal.Signals[name]

        def send(yes: bool | None) -> None:
            if not yes:
                return
            target = signal_target(chosen)  # again: it may have ended while the question was open
            if isinstance(target, str):
                self.notify(target, severity="warning")
                return
            try:
                target.send_signal(sig)
            except psutil.Error as exc:
                self.notify(f"PID {chosen.pid}: {exc}", severity="error")
                return
            self.notify(f"sent {name} to PID {chosen.pid}")

        shown = chosen.own_command or chosen.command
        self.push_screen(ConfirmSignal(f"Send {name} to PID {chosen.pid} ({shown[:60]})?"), send)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        self.exit("quit")

    def action_interrupt(self) -> None:
        self.exit(INTERRUPTED)

    def stop_signal(self, signum: int, frame: Any = None) -> None:
        """The handler of SIGTERM, SIGHUP and SIGINT while the dashboard runs: end it like Ctrl-C.

        A plain handler, not the event loop's (add_signal_handler): it also runs while the loop is
        blocked in a write to a terminal nobody reads (it interrupts that wait in the main thread),
        and tells the output to stop waiting for that terminal, so the loop gets to the exit. It only
        sets flags and schedules the exit, never raises into the UI's code. The first signal is the
        one that counts (SIGHUP: 129)."""
        if self.signum is None:
            self.signum = signum
        if self.output is not None:
            self.output.stopping = True
        loop = self._loop
        if loop is not None:  # else on_mount exits at once
            with contextlib.suppress(RuntimeError):  # the loop is closed: the app has ended already
                loop.call_soon_threadsafe(self.exit, INTERRUPTED)


def run_app(session: Session, duration: float | None = None) -> tuple[str | None, int | None]:
    """Run the dashboard; returns why it ended and the signal that ended it (None: no signal).

    SIGTERM, SIGHUP and SIGINT end it like Ctrl-C (`WatchApp.stop_signal`); an ignored one (nohup)
    stays ignored. gpudoctor's own handlers are back when this returns."""
    output = TerminalOutput(sys.__stderr__)  # where Textual's Linux driver writes
    app = WatchApp(session, duration=duration, driver_class=terminal_driver(output), output=output, settle_heap=True)
    taken = [sig for sig in (*STOP_SIGNALS, signal.SIGINT) if signal.getsignal(sig) is not signal.SIG_IGN]
    previous = {sig: signal.signal(sig, app.stop_signal) for sig in taken}
    try:
        result = app.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        output.close()
    return result, app.signum
