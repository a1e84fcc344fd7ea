"""Machine text made safe to show: one line, no control characters.

Names and command lines gpudoctor shows come from other people: a co-tenant's process on a GPU,
a recording someone sent, an environment value. A newline inside one would start a line of its own
(a CI runner reads `::error::...` at the start of a stdout line as a workflow command); an escape
sequence would drive the terminal (retitle it, plant a link, hide text).
"""

from __future__ import annotations

import re

# C0/C1 controls, and the Unicode format characters that hide or reorder text: zero-width spaces
# and marks, bidi embeddings, overrides and isolates (U+202E reverses what follows), line and
# paragraph separators (a terminal may end the line there), the byte-order mark.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def printable(text: object) -> str:
    """`text` as one safe line: a newline shown as the two characters `\\n`, other controls as `?`."""
    return CONTROL.sub("?", str(text).replace("\n", "\\n"))


def needs_cleaning(text: str) -> bool:
    return "\n" in text or CONTROL.search(text) is not None
