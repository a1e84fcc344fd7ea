"""Write docs/checks/GDxxx.md for every registered finding code (and an index).

python scripts/gen_check_docs.py           write the pages, remove pages of codes that are gone
python scripts/gen_check_docs.py --check   write nothing; exit 1 and list the pages that are stale
"""

from __future__ import annotations

import argparse
import sys
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


def stale_pages(docs: Path = DOCS, wanted: dict[str, str] | None = None) -> list[str]:
    """Page names that differ from what would be written, are missing, or should be removed."""
    wanted = pages() if wanted is None else wanted
    out = []
    for name, text in wanted.items():
        page = docs / name
        if not page.is_file() or page.read_text(encoding="utf-8") != text:
            out.append(name)
    out += [p.name for p in docs.glob("GD*.md") if p.name not in wanted] if docs.is_dir() else []
    return sorted(out)


def write(docs: Path = DOCS, wanted: dict[str, str] | None = None) -> int:
    wanted = pages() if wanted is None else wanted
    docs.mkdir(parents=True, exist_ok=True)
    for stale in docs.glob("GD*.md"):
        if stale.name not in wanted:
            stale.unlink()
    for name, text in wanted.items():
        (docs / name).write_text(text, encoding="utf-8")
    return len(wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 and list the stale pages (for CI and tests)"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        if stale:
            print(f"{len(stale)} stale page(s) in {DOCS} (run python scripts/gen_check_docs.py):")
            for name in stale:
                print(f"  {name}")
            return 1
        print(f"docs/checks is up to date ({len(pages())} pages)")
        return 0
    count = write()
    print(f"wrote {count} pages to {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
