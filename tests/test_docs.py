"""Every finding code has its docs page, equal to the generator's output, and `explain` works."""

from __future__ import annotations

import pytest

from gpudoctor.registry import CODES, load_all
from scripts.gen_check_docs import DOCS, pages
from tests.clirun import run_cli

load_all()
ALL_CODES = sorted(CODES)


@pytest.mark.parametrize("code", ALL_CODES)
def test_docs_page_matches_generated_text(code: str) -> None:
    page = DOCS / f"{code}.md"
    assert page.exists(), f"missing {page}: run .venv/bin/python scripts/gen_check_docs.py"
    assert page.read_text(encoding="utf-8") == pages()[f"{code}.md"], f"{page} is stale: regenerate it"


def test_no_page_for_an_unknown_code() -> None:
    assert {p.stem for p in DOCS.glob("GD*.md")} <= set(ALL_CODES)


@pytest.mark.parametrize("code", ALL_CODES)
def test_explain_prints_what_why_and_fix(capsys: pytest.CaptureFixture[str], code: str) -> None:
    r = run_cli(capsys, "explain", code.lower())
    assert r.exit_code == 0
    assert r.out.startswith(f"# {code} ")
    for heading in ("## What it checks", "## Why it matters", "## How to fix it"):
        assert heading in r.out


def test_explain_unknown_code_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "explain", "GD999")
    assert r.exit_code == 2
    assert r.err.strip() == "gpudoctor: unknown finding code 'GD999' (see `gpudoctor list-checks`)"


@pytest.mark.parametrize("code", ["GD201", "GD301", "GD402", "GD501"])
def test_core_code_texts_are_substantial(code: str) -> None:
    c = CODES[code]
    assert len(c.what) > 60 and len(c.why) > 60 and len(c.fix) > 40
