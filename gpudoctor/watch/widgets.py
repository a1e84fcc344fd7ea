"""Dashboard widgets. Each is updated once per sample with ready data; none polls or animates."""

from __future__ import annotations

import statistics
from collections import deque

from rich.table import Table
from rich.text import Text
from textual.widgets import DataTable, Static

from gpudoctor.watch.analysis import POWER_THROTTLE_BITS, THERMAL_THROTTLE_BITS, Balance, Verdict
from gpudoctor.watch.model import LOST, STALE, GpuReading, ProcReading

BLOCKS = "▁▁▂▃▄▅▆▇█"  # zero still draws the baseline, so a flat-lined GPU stays visible
HISTORY = 120  # samples kept per GPU for the sparkline (2 minutes at 1 s)
SPARK_WIDTH = 40


def sparkline(values: deque[int] | list[int], width: int = SPARK_WIDTH) -> str:
    """Utilization history as block characters, averaging runs of samples to fit `width`."""
    vals = list(values)
    if not vals:
        return ""
    step = max(1, -(-len(vals) // width))
    chunks = [vals[i : i + step] for i in range(0, len(vals), step)]
    return "".join(BLOCKS[min(8, round(sum(c) / len(c) / 100 * 8))] for c in chunks)


def _na(value: object, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def _mem(g: GpuReading) -> str:
    if g.mem_used is None:
        return "n/a"
    total = f"{g.mem_total / 1024:.0f}" if g.mem_total else "?"
    return f"{g.mem_used / 1024:5.1f}/{total} GiB"


def _power(g: GpuReading) -> Text:
    if g.power is None:
        return Text("n/a")
    limit = f"/{g.power_limit:.0f}" if g.power_limit else ""
    style = "bold red" if g.throttle and g.throttle & POWER_THROTTLE_BITS else ""
    return Text(f"{g.power:4.0f}{limit} W", style=style)


def _temp(g: GpuReading) -> Text:
    if g.temp is None:
        return Text("n/a")
    hot = g.throttle is not None and g.throttle & THERMAL_THROTTLE_BITS
    return Text(f"{g.temp} C", style="bold red" if hot else "")


def _pcie(g: GpuReading) -> str:
    if g.pcie_rx is None and g.pcie_tx is None:
        return "n/a"
    return f"{_na(g.pcie_rx, '{:>5}')}/{_na(g.pcie_tx, '{:<5}')}"


def _util(g: GpuReading) -> Text:
    if g.util is None:
        return Text("n/a")
    style = "green" if g.util >= 80 else "yellow" if g.util >= 40 else "red"
    return Text(f"{g.util:3d}%", style=style)


class GpuTable(Static):
    """One row per GPU with a utilization sparkline; redrawn once per sample."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.history: dict[int, deque[int]] = {}

    def add_history(self, gpus: tuple[GpuReading, ...]) -> None:
        for g in gpus:
            h = self.history.setdefault(g.index, deque(maxlen=HISTORY))
            if g.util is not None and g.state != LOST:
                h.append(g.util)

    def show(self, gpus: tuple[GpuReading, ...], flagged: dict[int, str], stale: bool) -> None:
        table = Table(expand=True, box=None, padding=(0, 1), header_style="bold")
        for name, justify in (
            ("GPU", "right"),
            ("name", "left"),
            ("util", "right"),
            ("memory", "right"),
            ("power", "right"),
            ("temp", "right"),
            ("SM MHz", "right"),
            ("PCIe rx/tx MB/s", "right"),
            ("utilization, last 2 min", "left"),
        ):
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for g in gpus:
            mark = flagged.get(g.index, "")
            idx = Text(f"{mark}{g.index}", style="bold red" if mark == "!" else "bold yellow" if mark else "")
            name = g.name.removeprefix("NVIDIA ")
            if g.state == LOST:
                table.add_row(idx, name, Text("LOST", style="bold red"), "", "", "", "", "", "GPU is lost")
                continue
            row_style = "dim" if stale or g.state == STALE else ""
            table.add_row(
                idx,
                name + (" (stale)" if row_style else ""),
                _util(g),
                _mem(g),
                _power(g),
                _temp(g),
                _na(g.sm_clock, "{}"),
                _pcie(g),
                Text(sparkline(self.history.get(g.index, [])), style="cyan"),
                style=row_style,
            )
        self.update(table)


class BalancePanel(Static):
    def show(self, balance: Balance, verdicts: tuple[Verdict, ...], window_s: float) -> None:
        text = Text()
        if balance.mean_util:
            mean = sum(balance.mean_util.values()) / len(balance.mean_util)
            text.append(f"window {window_s:.0f} s   mean utilization {mean:.0f}%   ")
            if balance.util_spread is not None:
                text.append(f"spread (max-min) {balance.util_spread:.0f} points   ")
        if balance.mem_mean:
            top = max(balance.mem_mean, key=balance.mem_mean.__getitem__)
            median = statistics.median(balance.mem_mean.values())
            text.append(
                f"memory: max {balance.mem_mean[top] / 1024:.1f} GiB (GPU {top}), median {median / 1024:.1f} GiB"
            )
        text.append("\n")
        if not verdicts:
            text.append("balanced: no verdicts", style="green")
        for v in verdicts:
            style = "bold red" if v.severity == "fail" else "bold yellow"
            text.append(f"{v.code} {v.name}", style=style)
            text.append(f"  GPU {', '.join(map(str, v.gpus))}: {v.message}\n")
            text.append(f"    hint: {v.hint}\n", style="dim")
        text.rstrip()
        self.update(text)


SORTS = {
    "GPU memory": lambda p: -(p.gpu_mem or 0),
    "CPU%": lambda p: -(p.cpu or 0.0),
    "PID": lambda p: p.pid,
    "GPU": lambda p: (p.gpu, p.pid),
}


class ProcessTable(DataTable):
    """PID, user, GPU, GPU memory, CPU%, RSS, command; rebuilt only when a process reading arrives."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = False
        self.add_columns("PID", "user", "GPU", "GPU mem", "CPU%", "RSS", "command")

    def show(self, procs: tuple[ProcReading, ...], sort: str) -> None:
        self.clear()
        for p in sorted(procs, key=SORTS[sort]):
            self.add_row(
                str(p.pid),
                p.user or "?",
                str(p.gpu),
                _na(p.gpu_mem, "{} MiB"),
                _na(p.cpu, "{:.0f}"),
                _na(p.rss, "{} MiB"),
                p.command or Text(p.note, style="italic"),
            )
