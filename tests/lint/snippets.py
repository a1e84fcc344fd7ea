"""Lint a script written in a test: the findings as (code, line) pairs, or whole."""

from __future__ import annotations

import textwrap
from pathlib import Path

from gpudoctor.findings import Finding
from gpudoctor.lint import lint_paths


def lint_source(tmp_path: Path, code: str, launcher: str = "auto", name: str = "train.py") -> list[Finding]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    return lint_paths([path], launcher=launcher)


def codes(tmp_path: Path, code: str, launcher: str = "auto") -> list[tuple[str, int]]:
    """(code, line) of each finding: line 1 is the snippet's first non-empty line."""
    return [(f.code, f.evidence["line"]) for f in lint_source(tmp_path, code, launcher)]
