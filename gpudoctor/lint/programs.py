"""Which linted files make one program: an entry script (a file no other linted file imports)
with every linted file it imports, directly or not. A file's program is the union of the
programs of the entry scripts that reach it. Imports are matched by path, never by running them:
`from trainer import Trainer` or `from .trainer import Trainer` in a/main.py is a/trainer.py,
`from mingpt.trainer import Trainer` is mingpt/trainer.py under a/ or a directory above it.
"""

from __future__ import annotations

import ast
import os

from gpudoctor.lint.source import Source

_UP = 3  # directories above the importer searched for the root of an absolute import


def programs(sources: dict[str, Source | None]) -> dict[str, set[str]]:
    """path -> the paths of its program (itself included)."""
    by_file = {_norm(p): p for p in sources}
    edges: dict[str, set[str]] = {p: set() for p in sources}
    for path, src in sources.items():
        if src is None or path.startswith("<"):
            continue
        for candidate in _candidates(path, src.nodes):
            target = by_file.get(candidate)
            if target is not None and target != path:
                edges[path].add(target)
    imported = {t for targets in edges.values() for t in targets}
    roots = [p for p in sources if p not in imported]
    reach: dict[str, set[str]] = {}
    for root in roots:
        members = _descendants(root, edges)
        for member in members:
            reach.setdefault(member, set()).update(members)
    return {p: reach.get(p) or _descendants(p, edges) for p in sources}


def _descendants(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for nxt in edges[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _norm(path: str) -> str:
    return os.path.normpath(os.path.abspath(path))


def _candidates(path: str, nodes: list[ast.AST]) -> set[str]:
    here = os.path.dirname(_norm(path))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                out |= _module_files(here, alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") if node.module else []
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
                out |= _files_at(base, parts)
                for alias in node.names:
                    out |= _files_at(base, [*parts, alias.name])
            else:
                out |= _module_files(here, parts)
                for alias in node.names:
                    out |= _module_files(here, [*parts, alias.name])
    return out


def _module_files(here: str, parts: list[str]) -> set[str]:
    out: set[str] = set()
    base = here
    for _ in range(_UP + 1):
        out |= _files_at(base, parts)
        base = os.path.dirname(base)
    return out


def _files_at(base: str, parts: list[str]) -> set[str]:
    if not parts or not all(parts):
        return set()
    stem = os.path.join(base, *parts)
    return {stem + ".py", os.path.join(stem, "__init__.py")}
