"""One parsed script, indexed for the rules: parents, scopes, assignments, in-file calls.

Everything is built in one pass over the tree with an explicit stack (a deeply nested expression
must not exhaust Python's recursion), so the cost is linear in the file's size. The rules ask:
where is this node (its statement, function, class), what was this name assigned, which in-file
function does this call reach, and from where is that function called.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpudoctor.lint.names import Names, text

T = TypeVar("T")
Scope = ast.AST  # a FunctionDef, an AsyncFunctionDef, a Lambda or the Module
FUNCTION_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef)
Function = ast.FunctionDef | ast.AsyncFunctionDef


def is_main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":`, which runs whenever the file is run as a script."""
    return isinstance(node, ast.If) and any(
        isinstance(n, ast.Constant) and n.value == "__main__" for n in ast.walk(node.test)
    )


_BLOCKS = ("body", "orelse", "finalbody", "handlers")
_HOLDERS = (ast.Module, ast.stmt, ast.ExceptHandler, ast.match_case)  # the nodes that hold statements


def _param_names(func: ast.AST) -> set[str]:
    args = func.args  # type: ignore[attr-defined]
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    return {a.arg for a in every if a is not None}


@dataclass(frozen=True)
class Site:
    """A place that runs an in-file function: a call, or a reference handed on (a spawn target,
    a callback), which runs it with arguments we cannot see."""

    node: ast.AST
    call: ast.Call | None  # None for a reference
    offset: int  # 1 for a method or a constructor (self is not an argument at the site)


@dataclass
class Source:
    path: str
    tree: ast.Module
    names: Names = field(init=False)
    parent: dict[ast.AST, ast.AST] = field(init=False, default_factory=dict)
    scope: dict[ast.AST, Scope] = field(init=False, default_factory=dict)
    nodes: list[ast.AST] = field(init=False, default_factory=list)  # every node, parents first
    # a statement -> (the field of its parent that holds it: "body", "orelse", ..., its index there)
    place: dict[ast.AST, tuple[str, int]] = field(init=False, default_factory=dict)
    calls: list[ast.Call] = field(init=False, default_factory=list)
    by_api: dict[str, list[ast.Call]] = field(init=False, default_factory=dict)
    functions: list[Function] = field(init=False, default_factory=list)
    # (scope, "name" or "self.attr") -> the values assigned; None where the value is not visible
    assigns: dict[tuple[ast.AST, str], list[ast.expr | None]] = field(init=False, default_factory=dict)
    sites: dict[ast.AST, list[Site]] = field(init=False, default_factory=dict)
    _defs: dict[tuple[ast.AST, str], ast.AST] = field(init=False, default_factory=dict)
    _memo: dict[tuple[str, int, str], Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._index()
        self.names = Names(self.nodes)
        for call in self.calls:
            key = self.names.call(call)
            if key is not None:
                self.by_api.setdefault(key, []).append(call)
        self._link_sites()

    # ---- building --------------------------------------------------------------------------

    def _index(self) -> None:
        stack: list[tuple[ast.AST, Scope]] = [(self.tree, self.tree)]
        while stack:
            node, scope = stack.pop()
            self.nodes.append(node)
            self.scope[node] = scope
            inner = node if isinstance(node, (*FUNCTION_TYPES, ast.Lambda)) else scope
            if isinstance(node, (*FUNCTION_TYPES, ast.ClassDef)):
                self._defs[(scope, node.name)] = node
                if isinstance(node, FUNCTION_TYPES):
                    self.functions.append(node)
            elif isinstance(node, ast.Call):
                self.calls.append(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                self._record_assign(node, scope)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                self._record_targets(node.target, None, scope)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                self._record_targets(node.optional_vars, None, scope)
            if isinstance(node, _HOLDERS):
                for name in _BLOCKS:
                    block = getattr(node, name, None)
                    if isinstance(block, list):
                        for i, stmt in enumerate(block):
                            self.place[stmt] = (name, i)
            children = list(ast.iter_child_nodes(node))
            for child in reversed(children):
                self.parent[child] = node
                stack.append((child, inner))
        self.calls.sort(key=lambda c: (c.lineno, c.col_offset))
        self.functions.sort(key=lambda f: f.lineno)

    def _record_assign(self, node: ast.AST, scope: Scope) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._record_targets(target, node.value, scope)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self._record_targets(node.target, node.value, scope)
        elif isinstance(node, ast.AugAssign):
            self._record_targets(node.target, None, scope)
        elif isinstance(node, ast.NamedExpr):
            self._record_targets(node.target, node.value, scope)

    def _record_targets(self, target: ast.AST, value: ast.expr | None, scope: Scope) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
            if values is not None and len(values) != len(target.elts):
                values = None
            for i, elt in enumerate(target.elts):
                self._record_targets(elt, values[i] if values is not None else None, scope)
            return
        if isinstance(target, ast.Starred):
            self._record_targets(target.value, None, scope)
            return
        key = text(target)
        if key is None:
            return
        owner: ast.AST = scope
        if key.startswith("self.") and isinstance(scope, FUNCTION_TYPES):
            cls = self.parent_of_type(scope, ast.ClassDef, direct=True)
            if cls is not None:
                owner = cls  # self.x is one variable across the class's methods
        self.assigns.setdefault((owner, key), []).append(value)

    def _link_sites(self) -> None:
        called: set[int] = set()
        for call in self.calls:
            target = self.resolve_call(call)
            if target is not None:
                func, offset = target
                self.sites.setdefault(func, []).append(Site(call, call, offset))
            called.add(id(call.func))
        for node in self.nodes:
            if id(node) in called or not isinstance(node, (ast.Name, ast.Attribute)):
                continue
            if not isinstance(getattr(node, "ctx", None), ast.Load):
                continue
            if isinstance(node, ast.Name):
                func = self.lookup_def(node.id, self.scope[node])
            elif isinstance(node.value, ast.Name) and node.value.id == "self":
                func = self._method(self._class_of(node), node.attr)
            else:
                continue
            if isinstance(func, FUNCTION_TYPES):
                self.sites.setdefault(func, []).append(Site(node, None, 0))

    # ---- questions ---------------------------------------------------------------------------

    def parent_of_type(self, node: ast.AST, kind: type | tuple[type, ...], direct: bool = False) -> ast.AST | None:
        cur = self.parent.get(node)
        while cur is not None:
            if isinstance(cur, kind):
                return cur
            if direct:
                return None
            cur = self.parent.get(cur)
        return None

    def block_of(self, stmt: ast.AST) -> tuple[list[ast.stmt], int] | None:
        """The list of statements holding `stmt`, and its index there (None: not in a block)."""
        place = self.place.get(stmt)
        parent = self.parent.get(stmt)
        if place is None or parent is None:
            return None
        return getattr(parent, place[0]), place[1]

    def statement(self, node: ast.AST) -> ast.stmt | None:
        cur: ast.AST | None = node
        while cur is not None and not isinstance(cur, ast.stmt):
            cur = self.parent.get(cur)
        return cur

    def function_of(self, node: ast.AST) -> Function | None:
        """The innermost function whose body holds `node` (None at module level)."""
        scope = self.scope.get(node)
        while isinstance(scope, ast.Lambda):
            scope = self.scope.get(scope)
        return scope if isinstance(scope, FUNCTION_TYPES) else None

    def _class_of(self, node: ast.AST) -> ast.ClassDef | None:
        func = self.function_of(node)
        if func is None:
            return None
        cls = self.parent.get(func)
        return cls if isinstance(cls, ast.ClassDef) else None

    def lookup_def(self, name: str, scope: ast.AST | None) -> ast.AST | None:
        """The def or class `name` visible from `scope` (enclosing functions, then the module)."""
        while scope is not None:
            found = self._defs.get((scope, name))
            if found is not None:
                return found
            if scope is self.tree:
                return None
            scope = self.scope.get(scope)
        return None

    def _method(self, cls: ast.AST | None, name: str, depth: int = 0) -> Function | None:
        if not isinstance(cls, ast.ClassDef) or depth > 5:
            return None
        for stmt in cls.body:
            if isinstance(stmt, FUNCTION_TYPES) and stmt.name == name:
                return stmt
        for base in cls.bases:  # an in-file base class
            if isinstance(base, ast.Name):
                parent = self.lookup_def(base.id, self.scope.get(cls))
                found = self._method(parent, name, depth + 1)
                if found is not None:
                    return found
        return None

    def resolve_call(self, call: ast.Call) -> tuple[Function, int] | None:
        """The in-file function `call` runs, and how many of its parameters the site does not pass."""
        func = call.func
        scope = self.scope.get(call)
        if isinstance(func, ast.Name):
            target = self.lookup_def(func.id, scope)
            if isinstance(target, FUNCTION_TYPES):
                return target, 0
            if isinstance(target, ast.ClassDef):
                init = self._method(target, "__init__")
                return (init, 1) if init is not None else None
            return None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner == "self":
                method = self._method(self._class_of(call), func.attr)
                return (method, 1) if method is not None else None
            cls = self._instance_class(owner, scope)
            if cls is not None:
                method = self._method(cls, func.attr)
                return (method, 1) if method is not None else None
        return None

    def _instance_class(self, name: str, scope: ast.AST | None) -> ast.ClassDef | None:
        """The in-file class `name` holds when every assignment of it constructs that class."""
        return self.remember("class", name, scope, lambda: self._constructed(name, scope), None)

    def _constructed(self, name: str, scope: ast.AST | None) -> ast.ClassDef | None:
        values = self.values(name, scope)
        classes = set()
        for v in values:
            if not (isinstance(v, ast.Call) and isinstance(v.func, ast.Name)):
                return None
            cls = self.lookup_def(v.func.id, self.scope.get(v))
            if not isinstance(cls, ast.ClassDef):
                return None
            classes.add(cls)
        return classes.pop() if len(classes) == 1 else None

    def values(self, key: str, scope: ast.AST | None) -> list[ast.expr | None]:
        """What `key` ("name" or "self.attr") was assigned, seen from `scope`: the innermost scope
        that assigns it (for self.attr, the class); [] when nothing in the file does."""
        if key.startswith("self."):
            func = scope if isinstance(scope, FUNCTION_TYPES) else None
            cls = self.parent.get(func) if func is not None else None
            return list(self.assigns.get((cls, key), [])) if isinstance(cls, ast.ClassDef) else []
        while scope is not None:
            found = self.assigns.get((scope, key))
            if found is not None:
                return list(found)
            if isinstance(scope, (*FUNCTION_TYPES, ast.Lambda)) and key in _param_names(scope):
                return [None]  # a parameter: its value comes from the callers
            if scope is self.tree:
                break
            scope = self.scope.get(scope)
        return []

    def remember(self, question: str, key: str, scope: ast.AST | None, compute: Callable[[], T], default: T) -> T:
        """The answer to `question` about the variable `key` seen from `scope`, computed once: a
        variable assigned and read thousands of times must not cost thousands squared. While it
        is being computed (a variable defined through itself) the answer is `default`."""
        memo_key = (question, id(scope), key)
        if memo_key in self._memo:
            return self._memo[memo_key]  # type: ignore[no-any-return]
        self._memo[memo_key] = default
        answer = compute()
        self._memo[memo_key] = answer
        return answer

    def any_value(self, question: str, expr: ast.AST, test: Callable[[ast.expr], bool]) -> bool:
        """`test` holds for some value the variable `expr` was assigned (remembered per variable)."""
        return self._through_values(question, expr, test, every=False)

    def every_value(self, question: str, expr: ast.AST, test: Callable[[ast.expr], bool]) -> bool:
        """`test` holds for every value the variable `expr` was assigned, and something assigned it."""
        return self._through_values(question, expr, test, every=True)

    def _through_values(self, question: str, expr: ast.AST, test: Callable[[ast.expr], bool], every: bool) -> bool:
        key = text(expr)
        if key is None:
            return False
        scope = self.scope.get(expr)

        def decide() -> bool:
            values = self.values(key, scope)
            if every:
                return bool(values) and all(v is not None and test(v) for v in values)
            return any(v is not None and test(v) for v in values)

        return self.remember(question, key, scope, decide, False)

    def param_index(self, name: str, scope: ast.AST | None) -> tuple[Function, int] | None:
        """(function, position) when `name` is a parameter of the function `scope` (not reassigned)."""
        if not isinstance(scope, FUNCTION_TYPES) or (scope, name) in self.assigns:
            return None
        args = [*scope.args.posonlyargs, *scope.args.args]
        for i, a in enumerate(args):
            if a.arg == name:
                return scope, i
        for a in scope.args.kwonlyargs:
            if a.arg == name:
                return scope, -1
        return None

    def site_argument(self, site: Site, func: Function, index: int) -> ast.expr | None:
        """The expression a call site passes for parameter `index` of `func` (None: not visible)."""
        call = site.call
        if call is None or index < 0:
            return None
        params = [*func.args.posonlyargs, *func.args.args]
        pos = index - site.offset
        name = params[index].arg if index < len(params) else None
        for kw in call.keywords:
            if kw.arg == name:
                return kw.value
        if 0 <= pos < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: pos + 1]):
            return call.args[pos]
        return None

    def walk(self, node: ast.AST) -> Iterator[ast.AST]:
        """Every node under `node` (itself included), not entering nested functions or classes."""
        stack = [node]
        while stack:
            cur = stack.pop()
            yield cur
            for child in ast.iter_child_nodes(cur):
                if not isinstance(child, (*FUNCTION_TYPES, ast.ClassDef, ast.Lambda)):
                    stack.append(child)

    def calls_to(self, *keys: str) -> list[ast.Call]:
        out = [c for k in keys for c in self.by_api.get(k, [])]
        return sorted(out, key=lambda c: (c.lineno, c.col_offset))
