"""Write docs/checks/GDxxx.md for every registered finding code (and an index)."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.explain import explain_text
from gpudoctor.registry import CODE_OWNER, CODES, load_all

DOCS = Path(__file__).resolve().parent.parent / "docs" / "checks"


def pages() -> dict[str, str]:
    load_all()
    out = {f"{code}.md": explain_text(code) or "" for code in sorted(CODES)}
    index = ["# Finding codes\n", "| code | name | check | title |", "|---|---|---|---|"]
    for code in sorted(CODES):
        c = CODES[code]
        index.append(f"| [{code}]({code}.md) | {c.name} | {CODE_OWNER[code]} | {c.title} |")
    out["README.md"] = "\n".join(index) + "\n"
    return out


def main() -> None:
    DOCS.mkdir(parents=True, exist_ok=True)
    wanted = pages()
    for stale in DOCS.glob("GD*.md"):
        if stale.name not in wanted:
            stale.unlink()
    for name, text in wanted.items():
        (DOCS / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(wanted)} pages to {DOCS}")


if __name__ == "__main__":
    main()
