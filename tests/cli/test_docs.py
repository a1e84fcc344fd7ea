"""Every finding code has its docs page, equal to the generator's output (scripts/gen_check_docs.py,
which lists stale pages and deletes none silently), and `explain` works."""

from __future__ import annotations

import pytest

from gpudoctor.catalogue import catalogue
from scripts.gen_check_docs import DOCS, pages
from tests.helpers.cli import run_cli

ALL_CODES = sorted(catalogue().codes)


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
    c = catalogue().codes[code]
    assert len(c.what) > 60 and len(c.why) > 60 and len(c.fix) > 40


def test_gen_check_docs_help_writes_nothing_and_check_lists_stale_pages(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from scripts import gen_check_docs as gen

    wanted = {"GD999.md": "page\n", "README.md": "index\n"}
    (tmp_path / "GD998.md").write_text("gone\n")
    assert gen.stale_pages(tmp_path, wanted) == ["GD998.md", "GD999.md", "README.md"]
    # A code that vanished without being listed as retired (engine/codes.py) stops the generator:
    # its page is never deleted silently (issue 18's code lifecycle).
    with pytest.raises(SystemExit, match="GD998"):
        gen.write(tmp_path, wanted)
    assert (tmp_path / "GD998.md").exists()
    (tmp_path / "GD998.md").unlink()
    assert gen.write(tmp_path, wanted) == 2
    assert gen.stale_pages(tmp_path, wanted) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["GD999.md", "README.md"]
    with pytest.raises(SystemExit) as exc:
        gen.main(["--help"])
    assert exc.value.code == 0 and "--check" in capsys.readouterr().out
