"""Write the sample outputs in README.md and docs/ from the commands that print them.

python scripts/gen_doc_outputs.py           rewrite every marked block with what its commands print now
python scripts/gen_doc_outputs.py --check   write nothing; exit 1 and list the blocks that are stale

A block is marked by the line `<!-- docs:output -->` just before its fence. Inside, each line that
starts with `$ ` is a command (bash, run from the repository root with this tree's `gpudoctor` first
on PATH, no colour, no policy of the machine's own beyond the repository's); the lines up to the
next `$ ` are what it prints on standard output, whole (no elision: the block is what a reader who
runs it sees). tests/e2e/test_docs_run.py keeps every marked block in step, and checks the other
blocks: Python that names what it uses, `gpudoctor` command lines that parse, policies that load.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTPUT_MARK = "<!-- docs:output -->"
FRAGMENT_MARK = "<!-- docs:fragment -->"  # a Python block that shows a part of a program (names come from around it)
FENCE = re.compile(r"^```([\w+-]*)\s*$")
RUN_S = 120.0


def documents(root: Path = REPO) -> list[Path]:
    """README.md and every Markdown file under docs/ (the generated code pages aside)."""
    docs = sorted(p for p in (root / "docs").rglob("*.md") if p.parent.name != "checks")
    return [root / "README.md", *docs]


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: list[str]  # the lines between the fences
    mark: str  # the marker line just before the fence ("" for none)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path}:{self.line}"


def blocks(path: Path, text: str | None = None) -> list[Block]:
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = before if before in (OUTPUT_MARK, FRAGMENT_MARK) else ""
        out.append(Block(path, i + 1, m.group(1), lines[i + 1 : end], mark))
        i = end + 1
    return out


def commands(block: Block) -> list[str]:
    return [line[2:] for line in block.body if line.startswith("$ ")]


def _shim(directory: Path) -> None:
    """A `gpudoctor` on PATH that runs this tree's code with this Python."""
    shim = directory / "gpudoctor"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gpudoctor "$@"\n')
    shim.chmod(0o755)


def environment(bin_dir: Path) -> dict[str, str]:
    dropped = ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "CI", "FORCE_COLOR", "COLUMNS", "RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("GPUDOCTOR_")}
    path = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env | {"PATH": path, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "TERM": "dumb", "OMP_NUM_THREADS": "1"}


def run(command: str, env: dict[str, str]) -> list[str]:
    done = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_S, check=False
    )
    return done.stdout.rstrip("\n").splitlines()


def refreshed(block: Block, env: dict[str, str]) -> list[str]:
    """The block's body as its commands print it now."""
    out: list[str] = []
    for command in commands(block):
        out.append(f"$ {command}")
        out += [line.rstrip() for line in run(command, env)]
    return out


def stale(paths: list[Path] | None = None) -> list[tuple[Block, list[str]]]:
    """Every marked block whose text is not what its commands print, with what they print."""
    found = []
    with tempfile.TemporaryDirectory(prefix="gpudoctor-docs-") as tmp:
        _shim(Path(tmp))
        env = environment(Path(tmp))
        for path in paths or documents():
            for block in blocks(path):
                if block.mark != OUTPUT_MARK:
                    continue
                if not commands(block):
                    raise SystemExit(f"{block.where}: a {OUTPUT_MARK} block without a `$ command` line")
                fresh = refreshed(block, env)
                if fresh != block.body:
                    found.append((block, fresh))
    return found


def write(changes: list[tuple[Block, list[str]]]) -> int:
    by_path: dict[Path, list[tuple[Block, list[str]]]] = {}
    for block, fresh in changes:
        by_path.setdefault(block.path, []).append((block, fresh))
    for path, edits in by_path.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for block, fresh in sorted(edits, key=lambda e: e[0].line, reverse=True):  # bottom first: lines stay put
            lines[block.line : block.line + len(block.body)] = fresh
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(changes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block is stale")
    args = parser.parse_args(argv)
    changes = stale()
    if args.check:
        for block, _ in changes:
            print(f"stale: {block.where}: $ {commands(block)[0]}")
        return 1 if changes else 0
    print(f"rewrote {write(changes)} block(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
