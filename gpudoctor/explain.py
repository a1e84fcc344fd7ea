"""`gpudoctor explain CODE` and the docs/checks/ pages: one text, two places.

docs/checks/GDxxx.md is generated from the same text (`python scripts/gen_check_docs.py`);
a test keeps the two in step.
"""

from __future__ import annotations

from gpudoctor.registry import CHECKS, CODE_OWNER, CODES, load_all


def explain_text(code: str) -> str | None:
    load_all()
    info = CODES.get(code)
    if info is None:
        return None
    owner = CODE_OWNER[code]
    chk = CHECKS.get(owner)
    kind = "active: runs a workload, skipped by --quick" if chk and chk.active else "static"
    if chk and chk.level >= 3:
        kind = "deep: runs under sustained load, only with `--level 3`"
    check_line = f"check `{owner}` ({kind})" if chk else f"`gpudoctor {owner}`"
    return (
        f"# {info.code} {info.name}: {info.title}\n\n"
        f"Raised by {check_line}. Select or ignore it with `--select {info.code}` / `--ignore {info.code}`.\n\n"
        f"## What it checks\n\n{info.what}\n\n"
        f"## Why it matters\n\n{info.why}\n\n"
        f"## How to fix it\n\n{info.fix}\n"
    )
