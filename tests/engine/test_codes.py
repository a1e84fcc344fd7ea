"""Codes have a lifecycle: a removed code stays listed as retired, keeps its page and is never reused."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpudoctor import catalogue as cat
from gpudoctor.engine import Code, Registry, check
from gpudoctor.engine.codes import CODE_RE, RETIRED, Retired
from gpudoctor.engine.registry import checks_in
from tests.paths import REPO

GONE = Retired("GD998", "old-thing", "An old check", "0.1.0", "It measured nothing anyone used.", ("GD401",))


def _gen_docs():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_check_docs", REPO / "scripts" / "gen_check_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_retired_code_cannot_be_declared_again() -> None:
    reused = Code("GD998", "new-thing", "Something new", what="w", why="y", fix="f")

    @check("reuser", "Reuses a code", codes=[reused])
    def reuser(ctx: object) -> list[object]:
        return []

    with pytest.raises(ValueError, match="GD998 was retired"):
        Registry([reuser.__gpudoctor_check__], retired=[GONE])  # type: ignore[attr-defined]


def test_the_lifecycle_table_is_well_formed() -> None:
    codes = [r.code for r in RETIRED]
    assert len(codes) == len(set(codes)) and all(CODE_RE.match(c) for c in codes)
    live = cat.catalogue().codes
    assert not set(codes) & set(live), "a retired code is declared again"


def test_a_retired_code_is_still_explained_and_keeps_its_page(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    base = cat.catalogue()
    with_gone = Registry(base.checks.values(), {}, runs=base.runs, retired=[GONE])
    monkeypatch.setattr(cat, "catalogue", lambda: with_gone)
    text = cat.explain_text("GD998")
    assert text is not None and "Retired in gpudoctor 0.1.0" in text and "GD401" in text
    doc = cat.explain_doc("GD998")
    assert doc is not None and doc["kind"] == "retired" and doc["replaced_by"] == ["GD401"]
    gen = _gen_docs()
    pages = gen.pages()
    assert "GD998.md" in pages and "retired in 0.1.0" in pages["README.md"]


def test_a_code_that_vanished_without_being_retired_stops_the_docs_generator(tmp_path: Path) -> None:
    gen = _gen_docs()
    docs = tmp_path / "checks"
    gen.write(docs)
    (docs / "GD997.md").write_text("# GD997 a code nobody retired\n")
    assert gen.vanished(docs) == ["GD997.md"]
    with pytest.raises(SystemExit, match="GD997"):
        gen.write(docs)
    assert (docs / "GD997.md").exists(), "its page is never deleted silently"


def test_marking_a_function_registers_nothing_until_a_registry_collects_it() -> None:
    import types

    module = types.ModuleType("gpudoctor_test_module")
    code = Code("GD996", "marked", "Marked only", what="w", why="y", fix="f")

    def probe(ctx: object) -> list[object]:
        return []

    probe.__module__ = module.__name__
    module.probe = check("marked", "Marked only", codes=[code])(probe)  # type: ignore[attr-defined]
    assert "GD996" not in cat.catalogue().codes
    assert [c.name for c in checks_in(module)] == ["marked"]
