"""Write docs/checks/GDxxx.md for every finding code, retired ones included (and an index).

python scripts/gen_check_docs.py           write the pages
python scripts/gen_check_docs.py --check   write nothing; exit 1 and list the pages that are stale

A code that vanished from the code without being listed as retired (gpudoctor/engine/codes.py
RETIRED) is an error, never a page silently deleted: a removed code keeps its page, which says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpudoctor.catalogue import catalogue, explain_text

DOCS = Path(__file__).resolve().parent.parent / "docs" / "checks"


def pages() -> dict[str, str]:
    reg = catalogue()
    every = sorted({*reg.codes, *reg.retired})
    out = {f"{code}.md": explain_text(code) or "" for code in every}
    index = ["# Finding codes\n", "| code | name | check | title |", "|---|---|---|---|"]
    for code in every:
        if code in reg.codes:
            c = reg.codes[code]
            index.append(f"| [{code}]({code}.md) | {c.name} | {reg.owner[code]} | {c.title} |")
        else:
            r = reg.retired[code]
            index.append(f"| [{code}]({code}.md) | {r.name} | retired in {r.removed_in} | {r.title} |")
    out["README.md"] = "\n".join(index) + "\n"
    return out


def vanished(docs: Path = DOCS, wanted: dict[str, str] | None = None) -> list[str]:
    """Pages of codes that are neither given nor listed as retired: a code removed by mistake."""
    wanted = pages() if wanted is None else wanted
    return sorted(p.name for p in docs.glob("GD*.md") if p.name not in wanted) if docs.is_dir() else []


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
    gone = vanished(docs, wanted)
    if gone:
        raise SystemExit(
            f"codes vanished without being retired: {', '.join(n[:-3] for n in gone)}; list each in "
            "gpudoctor/engine/codes.py RETIRED (a code is never reused) instead of deleting its page"
        )
    docs.mkdir(parents=True, exist_ok=True)
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
