"""The dashboard's blocks of lines (the host line, the GPUs, the training ranks, the verdicts): a widget
that draws ready-made lines of rich Text through Textual's line API, rendering only what is in view and
only what changed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Span, Text
from textual.geometry import Region, Size
from textual.selection import Selection
from textual.strip import Strip
from textual.visual import Visual, visualize
from textual.widget import Widget


class Lines(Widget):
    """A block of ready-made lines, one Text each, drawn through Textual's line API (as its Log is): only
    the lines in view are rendered, and a new sample repaints only the lines whose text changed. A line
    wider than the block is cut, never wrapped: the heights the app shares out count one line per Text.

    A line is rendered the way a Static renders its content (Textual's Content from the rich Text, the
    same cells and styles); when only its characters changed (the same length, styles and spans, one
    cell each), its last strip is reused with the new characters put into the same segments.

    Issue 22: as a Static, every line of every block (128 rank rows, most of them out of view) went
    through Textual's text layout each sample, most of the dashboard's CPU at 128 GPUs."""

    DEFAULT_CSS = """
    Lines {
        height: auto;
        text-wrap: nowrap;
        text-overflow: clip;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._lines: list[Text] = []
        self._keys: list[LineKey] = []
        self._drawn: dict[int, Drawn] = {}  # line -> how it was last rendered
        self._whole: list[Strip] | None = None  # the block rendered whole, while text is selected

    @property
    def content(self) -> Text:
        """What the block shows, as one Text (as Static.content is)."""
        return Text("\n").join(self._lines)

    def show(self, lines: Sequence[Text]) -> None:
        keys = [(line.plain, line.style, tuple(line.spans)) for line in lines]
        old = self._keys
        if keys == old:
            return
        self._lines, self._keys, self._whole = list(lines), keys, None
        if len(keys) != len(old):  # a new height: the only case that needs a layout pass
            self._drawn = {y: v for y, v in self._drawn.items() if y < len(keys)}
            self.refresh(layout=True)
            return
        changed = [y for y, (new, was) in enumerate(zip(keys, old, strict=True)) if new != was]
        self.refresh(*(Region(0, y, self.size.width, 1) for y in changed))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return max((line.cell_len for line in self._lines), default=0)

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        return selection.extract(self.content.plain), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self._whole = None
        self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y >= len(self._lines):
            return Strip.blank(width, self.visual_style.rich_style)
        if self.text_selection is not None:  # as a Static draws it, the selection highlighted
            if self._whole is None or len(self._whole) != len(self._lines):
                self._whole = Visual.to_strips(self, visualize(self, self.content), width, None, self.visual_style)
            return self._whole[y] if y < len(self._whole) else Strip.blank(width, self.visual_style.rich_style)
        key = self._keys[y]
        drawn = self._drawn.get(y)
        if drawn is not None and drawn.width == width:
            if drawn.key == key:
                return drawn.strip
            strip = _same_shape(drawn, key[0]) if drawn.key[1:] == key[1:] else None
            if strip is not None:
                self._drawn[y] = Drawn(key, width, strip, drawn.cuts)
                return strip
        line = Visual.to_strips(self, visualize(self, self._lines[y]), width, 1, self.visual_style)
        strip = line[0].apply_offsets(0, y) if line else Strip.blank(width, self.visual_style.rich_style)
        self._drawn[y] = Drawn(key, width, strip, _cuts(strip, key[0]))
        return strip


LineKey = tuple[str, Any, tuple[Span, ...]]  # what decides how a line looks: its characters, style and spans


class Drawn(NamedTuple):
    key: LineKey
    width: int
    strip: Strip
    cuts: list[tuple[int, int]] | None  # each segment's characters in the line; None: not one to one


def _same_shape(drawn: Drawn, plain: str) -> Strip | None:
    """The strip drawn before with `plain`'s characters in its segments, where the line is as long, one
    cell a character (its styles and spans are the same: the caller checked)."""
    if drawn.cuts is None or len(drawn.key[0]) != len(plain) or cell_len(plain) != len(plain):
        return None
    segments = [Segment(plain[a:b], seg.style) for seg, (a, b) in zip(drawn.strip, drawn.cuts, strict=True)]
    return Strip(segments, drawn.strip.cell_length)


def _cuts(strip: Strip, plain: str) -> list[tuple[int, int]] | None:
    """Where each segment's text lies in `plain`, when the segments spell it exactly, one cell a
    character (a line cut to the width, or with wide characters, is rendered again each time)."""
    if "".join(seg.text for seg in strip) != plain or cell_len(plain) != len(plain):
        return None
    cuts, at = [], 0
    for seg in strip:
        cuts.append((at, at + len(seg.text)))
        at += len(seg.text)
    return cuts
