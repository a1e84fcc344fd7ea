"""safe_text.printable: machine text shown as one line that cannot drive a terminal or hide itself."""

from __future__ import annotations

import pytest

from gpudoctor.safety.safe_text import printable


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("train.py\n::error::x", "train.py\\n::error::x"),  # a newline cannot start a line of its own
        ("a\x1b]0;TITLE\x07b", "a?]0;TITLE?b"),  # escape sequences lose their ESC/BEL
        ("train \u202eevil", "train ?evil"),  # a bidi override cannot reverse what follows
        ("train \u2028hidden tail", "train ?hidden tail"),  # a line separator cannot hide the tail
        ("a\u200bb\ufeffc\u2066d", "a?b?c?d"),  # zero-width and isolate characters are shown
        ("H100 80GB HBM3 — NVIDIA", "H100 80GB HBM3 — NVIDIA"),  # ordinary Unicode is kept
    ],
)
def test_printable_shows_what_could_hide_or_drive(raw: str, shown: str) -> None:
    assert printable(raw) == shown
