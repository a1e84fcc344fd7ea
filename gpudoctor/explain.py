"""`gpudoctor explain CODE`, `gpudoctor list-checks` and the docs/checks/ pages: one text, three places.

docs/checks/GDxxx.md is generated from the same text (`python scripts/gen_check_docs.py`);
a test keeps the two in step. Every code is listed: those of the checks, gpudoctor's own
(GD001, raised by the check runner) and the verdicts of `gpudoctor watch` (GD9xx), which
`check --select` does not take.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.registry import CHECKS, CODE_OWNER, CODES, LEVELS, NOT_IN_CHECK, load_all


def _raised_by(code: str) -> dict[str, Any]:
    """Who raises `code`: a check (static, active or deep), the check runner itself, the
    comparison with a baseline, or another command (watch's verdicts)."""
    owner = CODE_OWNER[code]
    chk = CHECKS.get(owner)
    if chk is not None:
        return {"check": owner, "kind": LEVELS[chk.level], "level": chk.level, "selectable": True}
    if owner == "check":  # the check runner's own codes (GD001): never filtered out
        return {"check": "check", "kind": "runner", "level": None, "selectable": False}
    return {"check": owner, "kind": owner, "level": None, "selectable": owner not in NOT_IN_CHECK}


def code_rows() -> list[dict[str, Any]]:
    """Every finding code, sorted by code, with who raises it and its title."""
    load_all()
    rows = []
    for code in sorted(CODES):
        info = CODES[code]
        by = _raised_by(code)
        rows.append(
            {
                "code": code,
                "name": info.name,
                "check": by["check"],
                "kind": by["kind"],
                "active": by["kind"] in ("active", "deep"),
                "level": by["level"],
                "selectable": by["selectable"],
                "title": info.title,
            }
        )
    return rows


def explain_doc(code: str) -> dict[str, Any] | None:
    """`explain CODE --json`: the code's texts and who raises it, or None for an unknown code."""
    load_all()
    info = CODES.get(code)
    if info is None:
        return None
    by = _raised_by(code)
    return {
        "schema_version": 1,
        "command": "explain",
        "code": info.code,
        "name": info.name,
        "title": info.title,
        "raised_by": by["check"],
        "kind": by["kind"],
        "level": by["level"],
        "selectable": by["selectable"],
        "what": info.what,
        "why": info.why,
        "fix": info.fix,
    }


def _raised_line(code: str) -> str:
    by = _raised_by(code)
    select = f"Select or ignore it with `--select {code}` / `--ignore {code}`."
    if by["kind"] == "runner":
        return "Raised by `gpudoctor check` itself, for any check; --select and --ignore never hide it."
    if by["kind"] == "baseline":
        return f"Raised by `gpudoctor check --baseline FILE` and `gpudoctor diff A B`. {select}"
    if not by["selectable"]:
        also = " (and `gpudoctor report` on its recordings)" if by["check"] == "watch" else ""
        return f"Raised by `gpudoctor {by['check']}`{also}; `gpudoctor check --select` does not take it."
    kind = {
        "static": "static",
        "active": "active: runs a workload, skipped by --quick",
        "deep": "deep: runs under sustained load, only with `--level 3`",
    }[by["kind"]]
    return f"Raised by check `{by['check']}` ({kind}). {select}"


def explain_text(code: str) -> str | None:
    load_all()
    info = CODES.get(code)
    if info is None:
        return None
    return (
        f"# {info.code} {info.name}: {info.title}\n\n"
        f"{_raised_line(code)}\n\n"
        f"## What it checks\n\n{info.what}\n\n"
        f"## Why it matters\n\n{info.why}\n\n"
        f"## How to fix it\n\n{info.fix}\n"
    )
