"""The dashboard's line blocks draw what a Textual Static draws with the same lines (Textual itself is the
oracle): the same characters and the same styles in every cell, after a first sample, after a sample that
changes only characters (the strip reused with new characters), and after one that changes styles."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
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

    def show(self, lines: list[Text], window: range | None = None) -> None:
        self.query_one("#static", Static).update(Text("\n").join(lines))
        self.query_one(Lines).show(lines, window)


def cells(widget: Any, crop: Region | None = None) -> list[list[tuple[str, tuple[Any, ...]]]]:
    """Each cell the widget draws (border and padding too) in `crop` (all): its character and how it looks."""
    out = []
    for strip in widget.render_lines(crop or Region(0, 0, *widget.outer_size)):
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
    line wider than the block whose cut-off part changes, a new width, a new border title, lines shown out of
    the window looked at (a list that scrolls) whose styles changed."""
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
        ("window", rows(5, mark="!")),  # only the header looked at: the marked row below changed style
        ("window", rows(6)),
    ]
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        for step in steps:
            window = None
            if isinstance(step, tuple) and step[0] == "window":
                window, step = range(1), step[1]
            elif isinstance(step, tuple) and step[0] == "title":
                for widget in (app.query_one("#static"), app.query_one(Lines)):
                    widget.border_title = "verdicts"
                step = step[1]
            elif isinstance(step, tuple):
                await pilot.resize_terminal(step[0], HEIGHT)
                step = step[1]
            app.show(step, window)
            await pilot.pause()
            static, block = cells(app.query_one("#static")), cells(app.query_one(Lines))
            assert block == static, step
            assert block == cells(app.query_one(Lines))  # drawn again from what was reused: the same
            part = Region(3, 1, 9, 4)  # some columns: where only they changed on screen
            assert cells(app.query_one(Lines), part) == cells(app.query_one("#static"), part)


class Scrolling(App[None]):
    CSS = "VerticalScroll { height: 4; }"

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Lines()


async def test_lines_out_of_the_window_are_current_when_scrolled_to() -> None:
    """A list that scrolls is shown with the window in view: the lines below it are not looked at, but those
    of the latest show are what appears when they are scrolled to (even when the lines in view did not
    change)."""
    app = Scrolling()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        block = app.query_one(Lines)
        first = [Text(f"row {i} first") for i in range(20)]
        block.show(first, range(4))
        await pilot.pause()
        block.show([*first[:4], *(Text(f"row {i} then", style="bold") for i in range(4, 20))], range(4))
        await pilot.pause()
        app.query_one(VerticalScroll).scroll_end(animate=False)
        await pilot.pause()
        drawn = ["".join(ch for ch, _ in line).rstrip() for line in cells(block)]
        assert drawn == [f"row {i} first" for i in range(4)] + [f"row {i} then" for i in range(4, 20)]


def _cases(rng: random.Random, width: int) -> Iterator[tuple[list[str], list[str], list[str | None], list[Region]]]:
    """3,000 random samples of 6 lines: the lines before and after, each line's style ("" unchanged, "bold"
    changed, None not looked at) and the regions `_regions` refreshes for them."""
    from gpudoctor.watch.ui.lines import _regions  # here: the other tests also run on a block without it

    for _ in range(3000):
        old = ["".join(rng.choice("ab") for _ in range(rng.randint(0, 15))) for _ in range(6)]
        new = [line if rng.random() < 0.3 else _mutate(line, rng) for line in old]
        styles = [rng.choice(["", "", "", "", "bold", None]) for _ in new]
        keys = [None if style is None else (line, style, ()) for line, style in zip(new, styles, strict=True)]
        yield old, new, styles, _regions(keys, [(line, "", ()) for line in old], width)  # type: ignore[arg-type]


def test_the_regions_refreshed_cover_every_cell_that_changed() -> None:
    """A sample refreshes, per run of changed lines, only the columns that changed (Textual sends the terminal
    only those): every cell whose character changed is in one; a line whose length or styles changed, or
    that was not looked at (out of the window in view), is refreshed whole."""
    width = 12
    for old, new, styles, regions in _cases(random.Random(5), width):
        covered = {(x, y) for r in regions for y in r.line_range for x in range(r.x, r.right)}
        for y, (a, b) in enumerate(zip(new, old, strict=True)):
            if styles[y] != "" or len(a) != len(b):
                assert all((x, y) in covered for x in range(width)), (new, old, styles, regions)
            else:
                assert all((x, y) in covered for x in range(min(len(a), width)) if a[x] != b[x]), (new, old, regions)


def _mutate(line: str, rng: random.Random) -> str:
    if rng.random() < 0.2:
        return line + "a"  # another length
    return "".join(ch if rng.random() < 0.8 else rng.choice("ab") for ch in line)


def steps(step: int, n: int = 4) -> list[Text]:
    """Rows as the rank rows are: a rank (one marked), a PID, and a step count that changes each sample, only
    its characters (the same length and styles)."""
    return [
        Text.assemble(
            (f"{'*' if r == 1 else ' '}{r:>4}", "bold yellow" if r == 1 else ""),
            (f" {4000 + r:>8}", ""),
            (f" {100 + 7 * step + r:>6} ms", "cyan"),
            " done",
        )
        for r in range(n)
    ]


def calls_of(widget: Any, name: str) -> list[tuple[Any, ...]]:
    """The arguments of each call of `widget`'s method `name` from now on."""
    calls: list[tuple[Any, ...]] = []
    method = getattr(widget, name)

    def spying(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return method(*args, **kwargs)

    setattr(widget, name, spying)
    return calls


def changed_cells(new: list[Text], old: list[Text]) -> set[tuple[int, int]]:
    """(column, line) of each character that differs (the lines as long as before)."""
    return {
        (x, y) for y, (a, b) in enumerate(zip(new, old, strict=True)) for x in range(len(a)) if a.plain[x] != b.plain[x]
    }


def covered(regions: tuple[Region, ...]) -> set[tuple[int, int]]:
    return {(x, y) for r in regions for y in r.line_range for x in range(r.x, r.right)}


def both(block: Lines, static: Static) -> Callable[[list[Text]], None]:
    """Show lines in the block and, to compare with, in a Static."""

    def show(lines: list[Text]) -> None:
        static.update(Text("\n").join(lines))
        block.show(lines)

    return show


async def test_a_row_whose_characters_changed_is_reused_not_rendered_again() -> None:
    """Issue 22: most samples change only the characters of a row (a step count), not its styles or length:
    the row Textual drew last time (styles, padding, border applied) is reused with the new characters, and
    no line is rendered through Textual's styles again, yet every cell is what a Static draws. A style that
    changes is rendered again."""
    app = Pair()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        block, static = app.query_one(Lines), app.query_one("#static", Static)
        show = both(block, static)
        for step in (0, 1):  # drawn once by Textual, then a second sample to reuse it from
            show(steps(step))
            await pilot.pause()
        rendered = calls_of(block, "render_line")  # Textual's line API: each line it renders through its styles
        for step in range(2, 7):
            show(steps(step))
            await pilot.pause()
            assert rendered == [], f"{len(rendered)} lines rendered again for new characters"
            assert cells(block) == cells(static), step
            assert f" {100 + 7 * step + 3:>6} ms" in "".join(ch for ch, _ in cells(block)[4])
        restyled = steps(7)
        restyled[2].stylize("dim")  # one line's style
        show(restyled)
        await pilot.pause()
        assert rendered and cells(block) == cells(static)


async def test_a_run_of_changed_lines_is_refreshed_as_one_region() -> None:
    """The 128 rank rows all change each sample: one region is refreshed for them, not one each (each costs
    Textual a region to track and merge); lines apart are regions apart."""
    app = Alone()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        block = app.query_one(Lines)
        block.show(steps(0, n=128))
        await pilot.pause()
        refreshes = calls_of(block, "refresh")
        block.show(steps(1, n=128))
        assert len(refreshes) == 1 and len(refreshes[0]) == 1, refreshes
        (region,) = refreshes[0]
        assert (region.y, region.height) == (0, 128)
        refreshes.clear()
        block.show([*steps(2, n=128)[:2], *steps(1, n=128)[2:4], *steps(2, n=128)[4:]])  # 0-1 and 4-127
        assert len(refreshes) == 1 and [(r.y, r.height) for r in refreshes[0]] == [(0, 2), (4, 124)], refreshes


async def test_a_changed_line_refreshes_only_the_columns_that_changed() -> None:
    """Textual sends the terminal only what the refreshed regions cover: a sample that changes the rows' step
    count refreshes the columns it changed (every changed cell, and none left or right of the changed run),
    not whole rows; and the block shows the new characters, as a Static does."""
    app = Pair()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        block, static = app.query_one(Lines), app.query_one("#static", Static)
        old = steps(0)
        block.show(old)
        await pilot.pause()
        refreshes = calls_of(block, "refresh")
        for step in (1, 2, 15):
            new = steps(step)
            block.show(new)
            static.update(Text("\n").join(new))
            await pilot.pause()
            changed = changed_cells(new, old)
            regions = tuple(r for call in refreshes for r in call)
            assert changed <= covered(regions), (changed, regions)
            first, last = min(x for x, _ in changed), max(x for x, _ in changed)
            assert all(first <= r.x and r.right <= last + 1 for r in regions), (first, last, regions)
            assert cells(block) == cells(static)
            refreshes.clear()
            old = new


async def test_a_block_drawn_cut_at_the_side_still_reuses_its_rows() -> None:
    """Textual asks a block clipped at the side for some columns only: it cuts its rows as Textual would
    (what a Static draws there), and keeps what it drew, so the next sample's new characters still reuse the
    rows rather than render every line through Textual's styles again."""
    app = Pair()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        block, static = app.query_one(Lines), app.query_one("#static", Static)
        show = both(block, static)
        for step in (0, 1):  # drawn once by Textual, then a second sample to reuse it from
            show(steps(step))
            await pilot.pause()
        part = Region(3, 1, 12, 4)
        assert cells(block, part) == cells(static, part)
        rendered = calls_of(block, "render_line")
        for step in (2, 3):
            show(steps(step))
            await pilot.pause()
            assert cells(block, part) == cells(static, part) and cells(block) == cells(static)
        assert rendered == [], f"{len(rendered)} lines rendered again after a cut"


async def test_rows_out_of_view_do_not_widen_the_refresh_of_the_rows_in_view() -> None:
    """The rank rows in view (the window the app gives) refresh only the columns that changed; the rows out
    of it are not looked at, so they are refreshed whole, in regions of their own: they were run together
    with the rows in view, and widened those to the whole width (every column of the 128 rank rows sent
    again each sample)."""
    app = Scrolling()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        block = app.query_one(Lines)
        block.show(steps(0, n=20), range(4))
        await pilot.pause()
        refreshes = calls_of(block, "refresh")
        block.show(steps(1, n=20), range(4))
        regions = tuple(r for call in refreshes for r in call)
        in_view = changed_cells(steps(1, n=4), steps(0, n=4))
        first, last = min(x for x, _ in in_view), max(x for x, _ in in_view)
        assert in_view <= covered(regions), regions
        assert all(first <= r.x and r.right <= last + 1 for r in regions if r.y < 4), (first, last, regions)
        assert {(x, y) for y in range(4, 20) for x in range(block.size.width)} <= covered(regions), regions
        await pilot.pause()
        app.query_one(VerticalScroll).scroll_end(animate=False)
        await pilot.pause()
        drawn = ["".join(ch for ch, _ in line).rstrip() for line in cells(block)]
        assert drawn == [line.plain.rstrip() for line in steps(1, n=20)]


def test_the_regions_refreshed_are_no_wider_than_the_columns_that_changed() -> None:
    """The other half of the test above: a region over lines looked at spans no more than the columns that
    changed in them (from the first changed character to the last; a line whose length or styles changed:
    the whole width); a line not looked at (out of the window in view) widens no region over lines that
    were."""
    width = 12
    for old, new, styles, regions in _cases(random.Random(7), width):
        for r in regions:
            seen = [y for y in r.line_range if styles[y] is not None]
            if not seen:
                continue
            spans = []
            for y in seen:
                a, b = new[y], old[y]
                if styles[y] or len(a) != len(b):
                    spans.append((0, width))
                else:
                    diff = [x for x in range(len(a)) if a[x] != b[x]]
                    spans.append((min(diff, default=width), max(diff, default=-1) + 1))
            lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
            assert r.x >= min(lo, width) and r.right <= min(max(hi, lo), width), (new, old, styles, regions)
