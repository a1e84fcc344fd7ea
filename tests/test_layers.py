"""The package's layers, held by its imports: a folder is a layer with one rule (docs/architecture.md).

Read with Python's `ast` over every module, every import counted, those inside functions too (a
lazy import is still a dependency); only `if TYPE_CHECKING:` blocks are left out (annotations).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.paths import REPO

PACKAGE = REPO / "gpudoctor"

# Layer of a module, by the longest matching prefix. Top = orchestration above every command's core.
LAYERS = {
    "gpudoctor.errors": "base",
    "gpudoctor.findings": "base",
    "gpudoctor.snapshot": "base",
    "gpudoctor.records": "base",
    "gpudoctor.version": "base",
    "gpudoctor.training_step": "base",
    "gpudoctor.training_data": "base",
    "gpudoctor.training_loss": "base",
    "gpudoctor.schemas": "base",
    "gpudoctor.safety": "safety",
    "gpudoctor.knowledge": "knowledge",
    "gpudoctor.probe": "probe",
    "gpudoctor.engine": "engine",
    "gpudoctor.launch": "launch",
    "gpudoctor.workloads": "workloads",
    "gpudoctor.checks": "checks",
    "gpudoctor.checks.active": "active",
    "gpudoctor.checks.deep": "active",
    "gpudoctor.compare": "compare",
    "gpudoctor.lint": "lint",
    "gpudoctor.render": "render",
    "gpudoctor.watch": "watch",
    "gpudoctor.watch.ui": "ui",
    "gpudoctor.pipeline": "top",
    "gpudoctor.api": "top",
    "gpudoctor.policy": "top",
    "gpudoctor.catalogue": "top",
    "gpudoctor.fleet": "top",  # `gpudoctor fleet`: reads files (compare/), judges with checks/active's code
    "gpudoctor": "top",  # the package face (gpudoctor/__init__.py)
    "gpudoctor.__main__": "cli",
    "gpudoctor.cli": "cli",
}
# A package whose face assembles what is below it sits at the top of its folder: the checks'
# registry (gpudoctor/checks/__init__.py) names the starters of the active and deep runs.
FACES = {"gpudoctor.checks": "active"}

_BELOW_ENGINE = {"base", "safety", "knowledge"}
# What each layer may import (besides itself). Everything else is an arrow running back up.
MAY_IMPORT = {
    "base": {"safety"},
    "safety": {"base"},
    "knowledge": {"base"},
    "probe": _BELOW_ENGINE,
    "engine": _BELOW_ENGINE,
    "launch": _BELOW_ENGINE | {"probe"},
    "workloads": _BELOW_ENGINE | {"probe", "launch"},
    "checks": _BELOW_ENGINE | {"engine"},  # static checks read the snapshot: no probe, launch, workloads
    "active": _BELOW_ENGINE | {"engine", "checks", "probe", "launch"},
    "compare": _BELOW_ENGINE | {"engine"},
    "lint": _BELOW_ENGINE | {"engine"},  # of the engine, its codes only (NARROW)
    "render": {"base", "safety"},
    "watch": _BELOW_ENGINE | {"probe", "engine"},
    "ui": _BELOW_ENGINE | {"watch"},
    "top": _BELOW_ENGINE | {"probe", "engine", "launch", "checks", "active", "compare", "lint", "render", "watch"},
    "cli": set(LAYERS.values()),
}

# Where a layer may import only some modules of a layer below: lint's rules are pure functions
# over a parsed script, they need the engine's Code and nothing of the check framework.
NARROW = {"lint": {"engine": ("gpudoctor.engine.codes",)}}

# Third-party libraries with one home each.
ONLY_IN = {
    "pynvml": ("gpudoctor.probe.nvml",),
    "textual": ("gpudoctor.watch.ui",),
    "torch": ("gpudoctor.workloads",),
    "click": ("gpudoctor.cli",),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    if module in FACES:
        return FACES[module]
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@functools.cache
def imports(path: Path) -> tuple[tuple[str, int], ...]:
    """(imported module, line) for every import outside `if TYPE_CHECKING:` blocks. Each file is
    parsed once a session: every test here reads every module (the heavy libraries' test alone read
    each file once per library, about 40 s of the suite on a loaded machine)."""
    return tuple(_scan_imports(path))


def _scan_imports(path: Path) -> Iterator[tuple[str, int]]:
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skip: set[int] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            skip |= {id(n) for child in node.body for n in ast.walk(child)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            submodules = [f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")]
            if len(submodules) < len(node.names):  # names defined in `base` itself
                yield base, node.lineno
            for full in submodules:  # `from gpudoctor.checks import nodes`: the submodule itself
                yield full, node.lineno


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_layer_table_covers_every_module() -> None:
    assert MODULES and all(layer(module_name(p)) for p in MODULES)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_back_up_a_layer(path: Path) -> None:
    me = layer(module_name(path))
    wrong = []
    for target, line in imports(path):
        if not target.startswith("gpudoctor"):
            continue
        theirs = layer(target)
        if theirs != me and theirs not in MAY_IMPORT[me]:
            wrong.append(f"line {line}: {me} imports {target} ({theirs})")
    assert not wrong, wrong


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_narrow_layers_import_only_what_they_are_allowed(path: Path) -> None:
    me = layer(module_name(path))
    allowed = NARROW.get(me, {})
    wrong = [
        f"line {line}: {me} imports {target}"
        for target, line in imports(path)
        if target.startswith("gpudoctor") and layer(target) in allowed and target not in allowed[layer(target)]
    ]
    assert not wrong, wrong


@pytest.mark.parametrize("library", sorted(ONLY_IN))
def test_each_heavy_library_has_one_home(library: str) -> None:
    homes = ONLY_IN[library]
    outside = [
        f"{module_name(p)}:{line}"
        for p in MODULES
        for target, line in imports(p)
        if target.split(".")[0] == library and not module_name(p).startswith(homes)
    ]
    assert not outside, f"{library} is imported outside {homes}: {outside}"


def test_no_import_circle() -> None:
    graph = {module_name(p): {t for t, _ in imports(p) if t.startswith("gpudoctor")} for p in MODULES}
    names = set(graph)
    # a package's face (__init__) is what `from gpudoctor.x import y` loads first: count its own arrows only
    edges = {
        m: {t for t in targets if t in names and t != m and not m.startswith(t + ".")} for m, targets in graph.items()
    }
    seen: dict[str, int] = {}
    circles = []

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if seen.get(nxt) == 1:
                circles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in seen:
                visit(nxt, stack)
        stack.pop()
        seen[node] = 2

    for node in sorted(edges):
        if node not in seen:
            visit(node, [])
    assert not circles, circles
