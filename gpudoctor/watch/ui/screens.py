"""What the dashboard shows besides the watch itself: the key bar, the help screen and the question
asked before a key signals a process (modal screens: a key closes them)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.screen import ModalScreen
from textual.widgets import Static

# The bottom line: not Textual's Footer (a widget per key costs the first frame ~0.1 s).
KEYS = Text.assemble(
    *(
        part
        for key, what in (
            ("q", "quit"),
            ("p", "pause"),
            ("c", "compact"),
            ("s", "sort"),
            ("t", "SIGTERM"),
            ("?", "help"),
        )
        for part in ((f" {key} ", "bold reverse"), (f" {what} ", ""))
    )
)

# Key lines fit the help's 74 columns at 80x24 (no wrap under a key); the paragraph is one line of
# source that Textual wraps to the width it gets. All of it fits 24 rows (tests/watch/ui).
HELP = """\
[b]gpudoctor watch[/b]: are all my GPUs working evenly?

  [b]q[/b]        quit (a command gpudoctor started is stopped too)
  [b]ctrl+c[/b]   interrupt: stop the command, exit 130
  [b]p[/b]        pause / resume drawing (sampling and --record go on)
  [b]c[/b]        compact GPU rows (several GPUs a line) / one row per GPU
  [b]s[/b]        sort processes: GPU memory, SM%, CPU%, PID, GPU
  [b]up/down[/b]  select a process (the selection follows it)
  [b]t[/b] / [b]i[/b]    SIGTERM / SIGINT the selected process (asks first; yours only)
  [b]?[/b]        this help

GPU and rank numbers marked [yellow]*[/] are named by a verdict, [red]![/] by a failing one; a GPU \
that reported an XID or was lost keeps its [red]![/] to the end. A dimmed row is stale: NVML did not \
answer in time. n/a: not reported. The verdicts panel lists every verdict that fired, held ones \
first. `gpudoctor explain GD901` ... GD911.

Press any key to close."""


class HelpScreen(ModalScreen[None]):
    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")

    def on_key(self) -> None:
        self.dismiss()


class ConfirmSignal(ModalScreen[bool]):
    """Send this signal to this process? y sends, anything else does not."""

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Static(f"{escape(self.question)}\n\n[b]y[/b] send it    any other key: do not", id="confirm")

    def on_key(self, event: Any) -> None:
        event.stop()
        self.dismiss(event.key == "y")
