"""Finding codes of the watch verdicts (area GD9). Must not import textual."""

from __future__ import annotations

from gpudoctor.registry import Code, register_codes

CODES: list[Code] = []

register_codes("watch", CODES)
