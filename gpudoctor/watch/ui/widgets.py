"""What the dashboard draws, as pure functions of the data and the space there is (testable, and
cheap: lines of rich Text, no table layout engine), plus the widgets that show them.

The GPU rows adapt to the width: the index with its verdict mark, utilization and memory are
always there; the other columns drop in this order as the width shrinks: the name first, then PCIe
rx/tx, SM clock, temperature, power. The utilization history (one character per sample, newest on
the right) takes what is left and never more. Where one row per GPU does not fit the height, the
compact mode packs several GPUs per line (index, mark, utilization, memory).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar, overload

from rich.cells import cell_len
from rich.text import Span, Text
from textual.geometry import Region
from textual.widgets import DataTable

from gpudoctor.watch.analysis import POWER_THROTTLE_BITS, THERMAL_THROTTLE_BITS, Balance, RankStats, Verdict
from gpudoctor.watch.model import LOST, STALE, GpuReading, HostReading, ProcReading, RankReading, clock
from gpudoctor.watch.summary import Event

BLOCKS = "▁▁▂▃▄▅▆▇█"  # zero still draws the baseline, so a flat-lined GPU stays visible
HISTORY = 240  # samples kept per GPU for the history (4 minutes at 1 s)
MIN_SPARK = 8  # narrower than this, the history is left out


def _block(v: float) -> str:
    return BLOCKS[min(8, max(0, round(v / 100 * 8)))]


_BLOCK_OF = tuple(_block(v) for v in range(101))  # utilization 0-100% -> its block: looked up, not computed


def sparkline(values: Sequence[int] | deque[int], width: int) -> str:
    """The last `width` samples, one block character each (newest on the right)."""
    if width <= 0:
        return ""
    vals = list(values)[-width:]
    table = _BLOCK_OF  # 128 GPU rows of 60 blocks each sample: this was most of the rows' cost
    return "".join([table[v] if type(v) is int and 0 <= v <= 100 else _block(v) for v in vals])


def _util_style(util: int | None) -> str:
    if util is None:
        return ""
    return "green" if util >= 80 else "yellow" if util >= 40 else "red"


def mem_text(g: GpuReading, short: bool = False) -> str:
    if g.mem_used is None:
        return "n/a"
    used = g.mem_used / 1024
    if short or not g.mem_total:
        return f"{used:.0f}G" if used >= 10 else f"{used:.1f}G"
    return f"{used:.1f}/{g.mem_total / 1024:.0f}G"


# Drop order, first dropped first: the name, PCIe, SM clock, temperature, power (README, docs/watch.md).
OPTIONAL = ("name", "pcie", "clock", "temp", "power")


def _cell(g: GpuReading, name: str) -> tuple[str, str]:
    """One optional column of a GPU row: its text and style."""
    if name == "name":
        return g.name.removeprefix("NVIDIA "), ""
    if name == "power":
        if g.power is None:
            return "n/a", ""
        limit = f"/{g.power_limit:.0f}" if g.power_limit else ""
        capped = g.throttle is not None and g.throttle & POWER_THROTTLE_BITS
        return f"{g.power:.0f}{limit}W", "bold red" if capped else ""
    if name == "temp":
        hot = g.throttle is not None and g.throttle & THERMAL_THROTTLE_BITS
        return "n/a" if g.temp is None else f"{g.temp}C", "bold red" if hot else ""
    if name == "clock":
        return "n/a" if g.sm_clock is None else f"{g.sm_clock}", ""
    if name == "pcie":
        if g.pcie_rx is None and g.pcie_tx is None:
            return "n/a", ""
        rx = "n/a" if g.pcie_rx is None else str(g.pcie_rx)
        tx = "n/a" if g.pcie_tx is None else str(g.pcie_tx)
        return f"{rx}/{tx}", ""
    raise ValueError(name)


HEADERS = {"name": "name", "power": "power", "temp": "temp", "clock": "SM MHz", "pcie": "PCIe rx/tx MB/s"}


def gpu_rows(
    gpus: Sequence[GpuReading],
    history: dict[int, deque[int]],
    marks: dict[int, str],
    notes: dict[int, str],
    width: int,
    stale: bool = False,
) -> OnDemand[tuple[int, GpuReading]]:
    """A header and one line per GPU, fitted to `width` (see the module docstring). The columns' widths are
    taken from every GPU; each GPU's line is made when first asked for: the dashboard asks for those in view
    (issue 22: 128 lines with their histories, made every sample, were 7.5 ms of it with a third in view). A line
    reads `history` when it is made: the caller leaves it as it was while the lines are shown (the app's pause)."""
    idx_w = max([3, *(len(str(g.index)) + 1 for g in gpus)])
    mem_w = max(6, *(len(mem_text(g)) for g in gpus))
    fixed = [("GPU", idx_w, "right"), ("util", 4, "right"), ("memory", mem_w, "right")]
    optional = OPTIONAL if len({g.name for g in gpus}) > 1 else OPTIONAL[1:]  # one model: named in the title
    cells = {name: [_cell(g, name) for g in gpus] for name in optional}
    widths = {name: max(len(HEADERS[name]), *(len(c[0]) for c in cells[name])) for name in optional}
    note_w = max([0, *(len(n) for n in notes.values())])
    used = sum(w for _, w, _ in fixed) + len(fixed) - 1 + (note_w + 1 if note_w else 0)
    kept: list[str] = []
    for name in reversed(optional):  # power first: the most useful after the fixed three
        if used + 1 + widths[name] <= width:
            kept.append(name)
            used += 1 + widths[name]
    spark_w = width - used - 1
    spark_w = spark_w if spark_w >= MIN_SPARK else 0
    header = Text(style="bold")
    header.append(f"{'GPU':>{idx_w}} {'util':>4} {'memory':>{fixed[2][1]}}")
    for name in kept:
        header.append(f" {HEADERS[name]:>{widths[name]}}" if name != "name" else f" {HEADERS[name]:<{widths[name]}}")
    if note_w:
        header.append(f" {'':<{note_w}}")
    if spark_w:
        header.append(f" {'utilization history':<{spark_w}}"[: spark_w + 1])

    def row(item: tuple[int, GpuReading]) -> Text:
        i, g = item
        mark = marks.get(g.index, "")
        line = Text()
        mark_style = "bold red" if mark == "!" else "bold yellow" if mark else ""
        line.append(f"{mark + str(g.index):>{idx_w}}", style=mark_style)
        dim = stale or g.state == STALE
        if g.state == LOST:
            line.append(f" {'LOST':>4}", style="bold red")
            line.append(f" {'':>{fixed[2][1]}}")
        else:
            util = "n/a" if g.util is None else f"{g.util}%"
            line.append(f" {util:>4}", style=_util_style(g.util))
            line.append(f" {mem_text(g):>{fixed[2][1]}}")
        for name in kept:
            text, style = cells[name][i] if g.state != LOST else ("", "")
            pad = " " * (widths[name] - len(text))
            if name == "name":
                line.append(" ")
                line.append(text, style=style)
                line.append(pad)
            else:
                line.append(" " + pad)
                line.append(text, style=style)
        if note_w:
            line.append(f" {notes.get(g.index, ''):<{note_w}}", style="bold red")
        if spark_w and g.state != LOST:
            line.append(" ")
            line.append(sparkline(history.get(g.index, ()), spark_w), style="cyan")
        if dim:
            line.stylize("dim")
            line.append(" (stale)" if width - len(line.plain) >= 8 else "", style="dim")
        return line

    return OnDemand([header], list(enumerate(gpus)), row)


CELL_W = 15  # "!31 100%  80G" and two spaces


def gpu_grid(gpus: Sequence[GpuReading], marks: dict[int, str], width: int) -> list[Text]:
    """Compact mode: several GPUs per line, each with its mark, index, utilization and memory."""
    per_line = max(1, (width + 1) // CELL_W)
    lines = []
    for start in range(0, len(gpus), per_line):
        pieces: list[tuple[str, str]] = []
        for g in gpus[start : start + per_line]:
            mark = marks.get(g.index, "")
            pieces.append((f"{mark + str(g.index):>3}", _mark_style(mark)))
            if g.state == LOST:
                pieces += [(f" {'LOST':>4} {'':>4}", "bold red"), ("  ", "")]
            else:
                util = "n/a" if g.util is None else f"{g.util}%"
                pieces.append((f" {util:>4}", _util_style(g.util)))
                pieces.append((f" {mem_text(g, short=True):>4}  ", ""))
        line = assemble(pieces)
        line.rstrip()
        lines.append(line)
    return lines


def _mark_style(mark: str) -> str:
    return "bold red" if mark == "!" else "bold yellow" if mark else ""


def assemble(pieces: Sequence[tuple[str, str]]) -> Text:
    """A line of (text, style) pieces, as Text.append one by one makes it (a span for each styled piece),
    for a tenth of its cost: the dashboard builds a line per GPU and per rank every second (issue 22)."""
    spans, at = [], 0
    for text, style in pieces:
        if style:
            spans.append(Span(at, at + len(text), style))
        at += len(text)
    return Text("".join(text for text, _ in pieces), spans=spans)


def grid_height(n_gpus: int, width: int) -> int:
    return -(-n_gpus // max(1, (width + 1) // CELL_W))


def host_line(cpu: float | None, host: HostReading | None) -> Text:
    """CPU %, load, RAM and swap: input starvation and OOM kills start on the host."""
    text = Text()
    text.append("host ", style="bold")
    text.append(f"CPU {'n/a' if cpu is None else f'{cpu:.0f}%'}")
    if host is not None:
        if host.load1 is not None:
            text.append(f"  load {host.load1:.1f}")
        if host.ram_used is not None and host.ram_total:
            share = host.ram_used / host.ram_total
            style = "bold red" if share >= 0.95 else "yellow" if share >= 0.85 else ""
            text.append(f"  RAM {host.ram_used / 1024:.0f}/{host.ram_total / 1024:.0f} GiB", style=style)
        if host.swap_total:
            used = host.swap_used or 0
            style = "yellow" if used / host.swap_total >= 0.25 else ""
            text.append(f"  swap {used / 1024:.1f}/{host.swap_total / 1024:.0f} GiB", style=style)
    return text


def rank_rows(
    readings: Sequence[RankReading],
    stats: dict[tuple[int | None, int], RankStats],
    marks: dict[tuple[int | None, int], str],
    now: float,
    width: int,
) -> OnDemand[RankReading]:
    """A header and one line per training rank: step time and input-wait share over the window, how late
    it ends its steps, its last step and how long ago; ranks named by a verdict first. PID and last step
    drop first when narrow. Each rank's line is made when first asked for: the dashboard asks for those
    in view (issue 22: 128 made every sample, a third of them shown at 200x60)."""
    readings = sorted(readings, key=lambda r: ((r.rank, r.pid) not in marks, r.rank is None, r.rank or 0, r.pid))
    show_pid = width >= 60
    show_last = width >= 72
    header = Text(style="bold")
    header.append(f"{'rank':>5}" + (f" {'PID':>8}" if show_pid else "") + f" {'step':>8} {'input':>6} {'late':>7}")
    header.append((f" {'last step':>11}" if show_last else "") + f" {'ago':>6}")

    def row(r: RankReading) -> Text:
        key = (r.rank, r.pid)
        st = stats.get(key)
        mark = marks.get(key, "")
        rank = "?" if r.rank is None else str(r.rank)
        step = "n/a" if st is None or st.step_s is None else f"{1000 * st.step_s:.0f} ms"
        wait = "n/a" if st is None or st.wait_share is None else f"{100 * st.wait_share:.0f}%"
        late = "n/a" if st is None or st.late_s is None else f"{1000 * st.late_s:+.0f}ms"
        ago = "-" if r.last_end is None else clock(max(0.0, now - r.last_end))
        rest = (f" {r.pid:>8}" if show_pid else "") + f" {step:>8} {wait:>6} {late:>7}"
        rest += (f" {'-' if r.last_step is None else r.last_step:>11}" if show_last else "") + f" {ago:>6}"
        return assemble([(f"{mark + rank:>5}", _mark_style(mark)), (rest, "")])

    return OnDemand([header], readings, row)


T = TypeVar("T")


class OnDemand(Sequence[Text], Generic[T]):
    """Lines given first (a header), then one line per item, made from it the first time it is asked for."""

    def __init__(self, head: list[Text], items: Sequence[T], make: Callable[[T], Text]) -> None:
        self._head, self._items, self._make = len(head), items, make
        self._made: list[Text | None] = [*head, *([None] * len(items))]

    def __len__(self) -> int:
        return len(self._made)

    @overload
    def __getitem__(self, i: int) -> Text: ...
    @overload
    def __getitem__(self, i: slice) -> list[Text]: ...
    def __getitem__(self, i: int | slice) -> Text | list[Text]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        i = range(len(self))[i]  # a negative index counts from the end; too far raises IndexError
        line = self._made[i]
        if line is None:
            line = self._made[i] = self._make(self._items[i - self._head])
        return line


def event_lines(events: Sequence[Event], width: int, start: float, room: int, hints: bool) -> list[Text]:
    """The event log: every verdict that fired, held ones first, within `room` lines."""
    out: list[Text] = []
    for i, e in enumerate(events):
        if len(out) >= room:
            break
        if len(out) == room - 1 and i < len(events) - 1:
            out.append(Text(f"+{len(events) - i} more in the log (all in the summary at the end)", style="dim"))
            break
        v = e.verdict
        style = ("bold red" if v.severity == "fail" else "bold yellow") if e.active else "dim"
        line = Text()
        line.append(f"{v.code} {v.name}", style=style)
        when = f"{clock(e.first - start)}-{clock(e.last - start)}"
        times = f" x{e.times}" if e.times > 1 else ""
        line.append(f"  {v.subject}  {when}{times}")
        if e.worst_text:
            line.append(f"  worst {e.worst_text}")
        line.append(f"  {e.message}", style="" if e.active else "dim")  # a cleared one is dim, not gone
        line.truncate(width, overflow="ellipsis")
        out.append(line)
        if hints and e.active and len(out) < room:
            hint = Text(f"    hint: {v.hint}", style="dim")
            hint.truncate(width, overflow="ellipsis")
            out.append(hint)
    return out


def balance_line(balance: Balance, window_s: float, width: int) -> Text:
    text = Text()
    if balance.warming is not None:
        text.append(f"warming up: balance verdicts from {balance.warming:.0f} s on   ", style="yellow")
    if balance.idle:
        text.append("idle: every GPU below 5% utilization, nothing to judge   ", style="bold")
    elif balance.mean_util:
        mean = sum(balance.mean_util.values()) / len(balance.mean_util)
        text.append(f"{window_s:.0f} s window: mean util {mean:.0f}%")
        if balance.util_spread is not None:
            text.append(f"  spread {balance.util_spread:.0f} pts")
    if balance.ranks:
        steps = [r.step_s for r in balance.ranks.values() if r.step_s is not None]
        waits = [r.wait_share for r in balance.ranks.values() if r.wait_share is not None]
        text.append(f"{'  ' if text else ''}{len(balance.ranks)} ranks")
        if steps:
            text.append(f": step {1000 * statistics.median(steps):.0f} ms (median)")
        if waits:
            text.append(f", input wait {100 * statistics.median(waits):.0f}%")
    if balance.mem_mean:
        top = max(balance.mem_mean, key=balance.mem_mean.__getitem__)
        median = statistics.median(balance.mem_mean.values())
        text.append(f"  mem max {balance.mem_mean[top] / 1024:.1f} GiB (GPU {top}), median {median / 1024:.1f}")
    text.truncate(width, overflow="ellipsis")
    return text


def marks_for(
    verdicts: Sequence[Verdict], sticky: dict[int, str]
) -> tuple[dict[int, str], dict[tuple[int | None, int], str]]:
    """GPU and rank marks: `!` a failing verdict (and, for good, a GPU with an XID or lost), `*` a warning."""
    gpus: dict[int, str] = {k: "!" for k in sticky}
    ranks: dict[tuple[int | None, int], str] = {}
    for v in verdicts:
        mark = "!" if v.severity == "fail" else "*"
        for g in v.gpus:
            gpus[g] = "!" if gpus.get(g) == "!" else mark
        for r in v.ranks:
            key = (r.rank, r.pid)
            ranks[key] = "!" if ranks.get(key) == "!" else mark
    return gpus, ranks


def status_text(parts: Sequence[tuple[str, str, bool]], width: int) -> Text:
    """The status line from (text, style, can be cut) parts in priority order: each part is kept if it fits
    (a cuttable one shortened to fit), the others dropped; shown in their given order."""
    kept: dict[int, str] = {}
    used = 0
    for i, (text, _, cut) in enumerate(parts):
        need = len(text) + (3 if kept else 0)
        if used + need <= width:
            kept[i] = text
            used += need
        elif cut and width - used - (3 if kept else 0) >= 12:
            room = width - used - (3 if kept else 0)
            kept[i] = text[: room - 1] + "…"
            used = width
    out = Text(no_wrap=True, overflow="crop")
    for n, i in enumerate(sorted(kept)):
        if n:
            out.append(" | ", style="dim")
        out.append(kept[i], style=parts[i][1])
    return out


SORTS = {
    "GPU memory": lambda p: -(p.gpu_mem or 0),
    "SM%": lambda p: -(p.sm or 0),
    "CPU%": lambda p: -(p.cpu or 0.0),
    "PID": lambda p: p.pid,
    "GPU": lambda p: (-1 if p.gpu is None else p.gpu, p.pid),
}


class ProcessTable(DataTable):
    """PID, user, GPU, GPU memory, SM%, CPU%, RSS, command, in the chosen order, keeping the selected
    process selected (by PID and GPU) wherever the new order puts it.

    Row i shows the i-th process of the order, and a new reading writes only the cells that changed, with
    one refresh for them all: clearing and adding every row made Textual measure every cell again, a
    tenth of the dashboard's CPU at 128 GPUs (issue 22). Columns widen for a wider cell and never narrow,
    as they did then. While the table is hidden (no room for it), a reading waits and only the latest is
    written, when the table is shown again or asked which process is selected."""

    _batch = False  # cells are being written: their refreshes wait for the last one
    _held = False  # a refresh came while they were
    _pending: tuple[tuple[ProcReading, ...], str] | None = None  # the reading not written yet

    GPU_COLUMNS = ("GPU", "GPU mem", "SM%")  # left out when no process listed uses a GPU (CPU ranks)

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = False
        self.with_gpus = True
        self.shown: list[ProcReading] = []  # the process of each row
        self._cells: list[tuple[str | Text, ...]] = []  # what each row's cells hold
        self._keys = self.add_columns("PID", "user", *self.GPU_COLUMNS, "CPU%", "RSS", "command")

    def _columns(self, with_gpus: bool) -> None:
        if with_gpus == self.with_gpus:
            return
        self.with_gpus = with_gpus
        self.clear(columns=True)
        self._cells = []
        self._keys = self.add_columns("PID", "user", *(self.GPU_COLUMNS if with_gpus else ()), "CPU%", "RSS", "command")

    def refresh(self, *regions: Region, **how: bool) -> ProcessTable:
        if self._batch and not regions and not how:  # update_cell's, of the whole table for each cell
            self._held = True
            return self
        super().refresh(*regions, **how)
        return self

    @property
    def selected(self) -> ProcReading | None:
        self.catch_up()  # a key signals the process the latest reading puts under the cursor
        row = self.cursor_row
        return self.shown[row] if self.row_count and 0 <= row < len(self.shown) else None

    def _row(self, p: ProcReading) -> tuple[str | Text, ...]:
        gpu_cells = (
            "-" if p.gpu is None else str(p.gpu),
            "n/a" if p.gpu_mem is None else f"{p.gpu_mem} MiB",
            "n/a" if p.sm is None else f"{p.sm}",
        )
        return (
            str(p.pid),
            Text(p.user or "?"),  # Text, not a str: Textual would read a str as markup
            *(gpu_cells if self.with_gpus else ()),
            "n/a" if p.cpu is None else f"{p.cpu:.0f}",
            "n/a" if p.rss is None else f"{p.rss} MiB",
            Text(p.own_command or p.command) if p.command else Text(p.note, style="italic"),
        )

    def show(self, procs: tuple[ProcReading, ...], sort: str) -> None:
        self._pending = (procs, sort)
        if self.display:  # hidden: 128 rows nobody sees are not written every sample (issue 22)
            self.catch_up()

    def catch_up(self) -> None:
        """Write the reading last given to show(), if it is not written yet."""
        if self._pending is None:
            return
        procs, sort = self._pending
        self._pending = None
        chosen = self.selected
        keep = (chosen.pid, chosen.gpu) if chosen is not None else None
        self._columns(with_gpus=not procs or any(p.gpu is not None for p in procs))
        self.shown = sorted(procs, key=SORTS[sort])
        rows = [self._row(p) for p in self.shown]
        old, self._cells = self._cells, rows
        self._batch = True
        try:
            for i, (row, was) in enumerate(zip(rows, old, strict=False)):  # the rows both have
                for key, cell, before in zip(self._keys, row, was, strict=True):
                    if cell != before:
                        width = cell.cell_len if isinstance(cell, Text) else cell_len(cell)
                        self.update_cell(str(i), key, cell, update_width=width > self.columns[key].content_width)
        finally:
            self._batch = False
        if self._held:
            self._held = False
            self.refresh()
        for i in range(len(old), len(rows)):
            self.add_row(*rows[i], key=str(i))
        for i in reversed(range(len(rows), len(old))):
            self.remove_row(str(i))
        where = next((i for i, p in enumerate(self.shown) if (p.pid, p.gpu) == keep), None)
        if where is None:  # nothing was selected, or it has gone: the top row, as for a new table
            self.scroll_y = 0
        self.move_cursor(row=where or 0, animate=False)  # the view scrolls only as far as it must to show it
