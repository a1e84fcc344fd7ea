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
    the lines in view are rendered, and a new sample repaints only the lines whose text changed, and in
    them only the columns that changed. A line wider than the block is cut, never wrapped: the heights the
    app shares out count one line per Text. A long list that scrolls is shown with the window in view: the
    lines out of it are made only if they are scrolled to.

    A line is rendered the way a Static renders its content (Textual's Content from the rich Text, the
    same cells and styles), then through Textual's styles (padding, border, background) and line filters.
    When only its characters changed (the same length, styles and spans, one cell each), the row it
    ended as last time is reused with the new characters put into the same segments: the pipeline would
    only give the same segments again, at many times the cost.

    Issue 22: as a Static, every line of every block (128 rank rows, most of them out of view) went
    through Textual's text layout each sample, most of the dashboard's CPU at 128 GPUs; then, the rank
    rows and GPU lines that change every sample were most of what was left."""

    DEFAULT_CSS = """
    Lines {
        height: auto;
        text-wrap: nowrap;
        text-overflow: clip;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._lines: Sequence[Text] = []
        self._keys: list[LineKey | None] = []  # None: not looked at yet
        self._drawn: dict[int, Drawn] = {}  # widget row (border and padding included) -> the strip drawn there
        self._look: tuple[Any, ...] = ()  # what the drawn strips also depend on: size, colours, filters
        self._whole: list[Strip] | None = None  # the block rendered whole, while text is selected

    @property
    def content(self) -> Text:
        """What the block shows, as one Text (as Static.content is)."""
        return Text("\n").join(self._lines)

    def show(self, lines: Sequence[Text], window: range | None = None) -> None:
        """Show `lines`; only those in `window` (all: None) are looked at now, the others are counted as
        changed and taken from `lines` if they are drawn (a long list that scrolls: only what is in view)."""
        keys = [_key_of(lines[y]) if window is None or y in window else None for y in range(len(lines))]
        old = self._keys
        if keys == old and None not in keys:
            return
        self._lines, self._keys, self._whole = lines, keys, None
        if len(keys) != len(old):  # a new height: the only case that needs a layout pass
            self.refresh(layout=True)
            return
        self.refresh(*_regions(keys, old, self.size.width))

    def refresh(self, *regions: Region, **how: Any) -> Lines:
        if not regions:  # the whole widget: a new size, style, border title or selection may draw it otherwise
            self._drawn.clear()
        super().refresh(*regions, **how)
        return self

    def notify_style_update(self) -> None:
        self._drawn.clear()
        super().notify_style_update()

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
        """Content line `y` as a Static renders it (Textual's styles and filters are applied after)."""
        width = self.size.width
        if y >= len(self._lines):
            return Strip.blank(width, self.visual_style.rich_style)
        if self.text_selection is not None:  # as a Static draws it, the selection highlighted
            if self._whole is None or len(self._whole) != len(self._lines):
                self._whole = Visual.to_strips(self, visualize(self, self.content), width, None, self.visual_style)
            return self._whole[y] if y < len(self._whole) else Strip.blank(width, self.visual_style.rich_style)
        line = Visual.to_strips(self, visualize(self, self._lines[y]), width, 1, self.visual_style)
        return line[0].apply_offsets(0, y) if line else Strip.blank(width, self.visual_style.rich_style)

    def render_lines(self, crop: Region) -> list[Strip]:
        """The widget's rows in `crop`: each one reused where it can be, the others rendered by Textual."""
        size = self.region.size
        look = (size, self.background_colors, tuple(self.get_line_filters()))
        if self.text_selection is not None:  # rare: drawn as Textual draws it, the selection highlighted
            self._drawn.clear()
            return super().render_lines(crop)
        if look != self._look:
            self._drawn.clear()
            self._look = look
        top, left = self.styles.gutter.top, self.styles.gutter.left
        strips = [self._reuse(y, y - top, left) for y in crop.line_range]
        i = 0
        while i < len(strips):  # the others, a run of rows at a time
            if strips[i] is not None:
                i += 1
                continue
            end = i
            while end < len(strips) and strips[end] is None:
                end += 1
            run = Region(0, crop.y + i, size.width, end - i)
            strips[i:end] = super().render_lines(run)
            for y in run.line_range:
                self._drawn[y] = _drawn(self._key(y - top), strips[y - crop.y], left, self.size.width)
            i = end
        if crop.column_span != (0, size.width):  # only some columns changed on screen: whole rows, cut (as Textual)
            x1, x2 = crop.column_span
            return [strip.crop(x1, x2) for strip in strips]  # type: ignore[union-attr]  # no None left
        return strips  # type: ignore[return-value]  # every None was replaced

    def _key(self, line: int) -> LineKey | None:
        """What content line `line` looks like; None: a border, padding or blank row."""
        if not 0 <= line < len(self._keys):
            return None
        key = self._keys[line]
        if key is None:  # out of the window it was shown with: looked at now that it is drawn
            key = self._keys[line] = _key_of(self._lines[line])
        return key

    def _reuse(self, y: int, line: int, left: int) -> Strip | None:
        """Row `y` as drawn last time, with the characters of content line `line` now; None where it must be
        rendered again (not drawn yet, or the line's length, styles or spans changed)."""
        drawn = self._drawn.get(y)
        if drawn is None:
            return None
        key = self._key(line)
        if key == drawn.key:
            return drawn.strip
        if key is None or drawn.key is None or drawn.lengths is None or key[1:] != drawn.key[1:]:
            return None
        plain = key[0]
        if len(plain) != len(drawn.key[0]) or cell_len(plain) != len(plain):
            return None
        text = drawn.text[:left] + plain + drawn.text[left + len(plain) :]
        segments, at = [], 0
        for seg, n in zip(drawn.strip, drawn.lengths, strict=True):
            piece = text[at : at + n]
            segments.append(seg if piece == seg.text else Segment(piece, seg.style, seg.control))  # fewer objects
            at += n
        strip = Strip(segments, drawn.strip.cell_length)
        self._drawn[y] = Drawn(key, strip, text, drawn.lengths)
        return strip


def _key_of(line: Text) -> LineKey:
    return line.plain, line.style, tuple(line.spans)


def _regions(keys: list[LineKey | None], old: list[LineKey | None], width: int) -> list[Region]:
    """A region for each run of changed lines, over the columns that changed in them: one region for the 128
    rank rows a sample changes, not one each (each costs Textual a region to track and merge), and only
    their step count's columns (Textual sends the terminal only what the regions cover)."""
    regions: list[Region] = []
    for y, (new, was) in enumerate(zip(keys, old, strict=True)):
        if new == was and new is not None:  # None: not looked at, so maybe changed
            continue
        run = regions[-1] if regions and regions[-1].bottom == y else None
        if run is not None and (keys[run.y] is None) != (new is None):
            run = None  # lines not looked at (out of view: drawn whole if scrolled to) widen no run in view
        if run is not None and _only_in(new, was, run.x, run.right):  # the common case, checked for ~1 µs
            x0, x1 = run.x, run.right
        else:
            x0, x1 = _columns(new, was, width)
            if run is not None:
                x0, x1 = min(x0, run.x), max(x1, run.right)
        if run is not None:
            regions[-1] = Region(x0, run.y, x1 - x0, run.height + 1)
        else:
            regions.append(Region(x0, y, x1 - x0, 1))
    return regions


def _same_shape(new: LineKey | None, was: LineKey | None) -> bool:
    """Whether only a line's characters changed (the same length, styles and spans, one cell each)."""
    if new is None or was is None or new[1:] != was[1:] or len(new[0]) != len(was[0]):
        return False
    return cell_len(new[0]) == len(new[0]) and cell_len(was[0]) == len(was[0])


def _only_in(new: LineKey | None, was: LineKey | None, x0: int, x1: int) -> bool:
    """Whether a line changed only characters, and only in columns x0 to x1."""
    return _same_shape(new, was) and new[0][:x0] == was[0][:x0] and new[0][x1:] == was[0][x1:]  # type: ignore[index]


def _columns(new: LineKey | None, was: LineKey | None, width: int) -> tuple[int, int]:
    """The columns of a line that changed: from the first character that differs to the last, where only
    characters changed; else the whole width."""
    if not _same_shape(new, was):
        return 0, width
    a, b = new[0], was[0]  # type: ignore[index]
    start = _same_start(a, b)
    end = len(a) - _same_start(a[::-1], b[::-1])
    return min(start, width), min(max(end, start), width)


def _same_start(a: str, b: str) -> int:
    """How many characters `a` and `b` share at their start (~10 µs a line: once per run of lines)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


LineKey = tuple[str, Any, tuple[Span, ...]]  # what decides how a line looks: its characters, style and spans


class Drawn(NamedTuple):
    key: LineKey | None  # the content line drawn in the row; None: a border, padding or blank row
    strip: Strip  # the row as Textual drew it: styles, padding, border and line filters applied
    text: str  # its characters
    lengths: list[int] | None  # each segment's length in `text`; None: not one cell a character


def _drawn(key: LineKey | None, strip: Strip, left: int, width: int) -> Drawn:
    """How row `strip` was drawn, and whether its characters may be swapped: where the content line's
    characters lie as they are at `left` (not cut to the `width` of the content), one cell each."""
    text = "".join(seg.text for seg in strip)
    plain = "" if key is None else key[0]
    swappable = (
        key is not None
        and len(plain) <= width
        and text[left : left + len(plain)] == plain
        and cell_len(text) == len(text)
        and not any(seg.control for seg in strip)
    )
    return Drawn(key, strip, text, [len(seg.text) for seg in strip] if swappable else None)
