"""The dashboard's line blocks draw what a Textual Static draws with the same lines (Textual itself is the
oracle): the same characters and the same styles in every cell, after a first sample, after a sample that
changes only characters (the strip reused with new characters), and after one that changes styles."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widgets import Static

from gpudoctor.watch.ui.lines import Lines

WIDTH, HEIGHT = 70, 12
CSS = "Static, Lines { height: 6; padding: 0 1; border: round $primary; text-wrap: nowrap; text-overflow: clip; }"


def rows(step: int, mark: str = "*") -> list[Text]:
    """A header, marked and plain rows, a dim stale row and a history in colour, as the dashboard has."""
    header = Text(f"{'GPU':>4} {'util':>4} {'history':<20}", style="bold")
    lines = [header]
    for gpu in range(3):
        line = Text()
        line.append(f"{mark if gpu == 1 else ''}{gpu:>3}", style="bold yellow" if gpu == 1 else "")
        util = 90 + (gpu * 3 + step) % 10
        line.append(f" {util:>3}%", style="green" if util >= 95 else "yellow")
        line.append(" " + "▁▂▃▄▅▆▇█"[(step + gpu) % 8] * 20, style="cyan")
        lines.append(line)
    stale = Text(f"{3:>4} {step % 100:>3}% (stale)")
    stale.stylize("dim")
    lines.append(stale)
    return lines


class Pair(App[None]):
    CSS = CSS

    def compose(self) -> ComposeResult:
        yield Static(id="static")
        yield Lines(id="lines")

    def show(self, lines: list[Text]) -> None:
        self.query_one("#static", Static).update(Text("\n").join(lines))
        self.query_one(Lines).show(lines)


def cells(widget: Any) -> list[list[tuple[str, tuple[Any, ...]]]]:
    """Each cell the widget draws (border and padding too): its character and how it looks."""
    out = []
    for strip in widget.render_lines(Region(0, 0, *widget.outer_size)):
        line = []
        for segment in strip:
            st = segment.style
            look = () if st is None else (st.color, st.bgcolor, st.bold, st.dim, st.italic, st.underline, st.reverse)
            line.extend((ch, look) for ch in segment.text)
        out.append(line)
    return out


async def test_the_lines_draw_what_a_static_draws_with_the_same_text() -> None:
    app = Pair()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        for lines in (rows(0), rows(1), rows(2), rows(2, mark="!")):  # first; characters; again; a style
            app.show(lines)
            await pilot.pause()
            static, block = cells(app.query_one("#static")), cells(app.query_one(Lines))
            assert block == static
            assert [("".join(ch for ch, _ in line)) for line in block][1:] != [""] * 5


class Alone(App[None]):
    def compose(self) -> ComposeResult:
        yield Lines()


async def test_a_line_wider_than_the_block_is_cut_not_wrapped() -> None:
    app = Alone()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        block = app.query_one(Lines)
        block.show([Text("x" * 200), Text("next")])
        await pilot.pause()
        assert block.size.height == 2  # the heights the dashboard shares out count one line per Text
        drawn = ["".join(ch for ch, _ in line) for line in cells(block)]
        assert drawn == ["x" * WIDTH, "next".ljust(WIDTH)]


async def test_a_reused_row_never_shows_stale_characters() -> None:
    """Rows are reused with new characters where only characters changed; in every other case they are drawn
    again, and always as a Static draws them: one line changing (not its neighbours), a line growing, a
    line wider than the block whose cut-off part changes, a new width, a new border title."""
    app = Pair()
    wide = [Text("a" * 100, style="bold"), Text("b" * 10)]
    steps: list[Any] = [
        rows(0),
        rows(1),  # characters only: rows reused
        [*rows(1)[:2], Text("changed"), *rows(1)[3:]],  # one line, another length
        rows(2),
        wide,
        [Text("a" * 60 + "c" * 40, style="bold"), Text("b" * 10)],  # only what is cut off changed
        [Text("c" * 100, style="bold"), Text("b" * 10)],  # and now what shows
        [Text("d" * (WIDTH - 4) + " "), Text("b" * 10)],  # one wider than the block, its last cell as padding
        [Text("d" * (WIDTH - 4) + "x"), Text("b" * 10)],  # the x is cut off, not drawn into the padding
        (60, rows(3)),  # a narrower terminal
        ("title", rows(3)),
        rows(4),
    ]
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        for step in steps:
            if isinstance(step, tuple) and step[0] == "title":
                for widget in (app.query_one("#static"), app.query_one(Lines)):
                    widget.border_title = "verdicts"
                step = step[1]
            elif isinstance(step, tuple):
                await pilot.resize_terminal(step[0], HEIGHT)
                step = step[1]
            app.show(step)
            await pilot.pause()
            static, block = cells(app.query_one("#static")), cells(app.query_one(Lines))
            assert block == static, step
            assert block == cells(app.query_one(Lines))  # drawn again from what was reused: the same
