"""What has surely happened before a call: `set_device` ran, the RNG was seeded, a model was moved.

One walk over each function's statements carries a state forward: a fact holds after an `if`
only when both branches establish it (a branch that returns does not count), a loop's body may
not run at all, a `with` or `try` body runs. A call to an in-file function adds the facts that
function surely establishes. A function's entry facts are those that hold at every in-file call
site; a function handed to mp.spawn (a reference, not a call) starts with none: its process is
new, and neither the parent's set_device nor its seed reaches it. A function no one in the file calls
(a Lightning DataModule's `setup`, called by the framework) starts with what the file's top-level
code (its `if __name__ == "__main__":` block included) surely established: `seed_everything(42)`.

Facts: "set_device", and "seed" or "seed_rank" (the last seeding call, by whether its seed depends
on the rank). Placements, for GD759: where the last `.cuda()`/`.to(...)` put each model variable
("default": `.cuda()`, `.to("cuda")`; "indexed"; "other").
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from gpudoctor.lint.guards import MAX_CALL_DEPTH, mentions_rank
from gpudoctor.lint.names import constant, keyword, text
from gpudoctor.lint.source import FUNCTION_TYPES, Source, is_main_guard

DEFAULT, INDEXED, OTHER = "default", "indexed", "other"
_TRIES = (ast.Try, getattr(ast, "TryStar", ast.Try))  # `try ... except*` is Python 3.11's
_HEADERS = {
    ast.If: ("test",),
    ast.While: ("test",),
    ast.For: ("target", "iter"),
    ast.AsyncFor: ("target", "iter"),
    ast.With: ("items",),
    ast.AsyncWith: ("items",),
    ast.Match: ("subject",),
}


@dataclass
class _State:
    facts: frozenset[str] = frozenset()
    places: dict[str, tuple[str, int]] = field(default_factory=dict)  # model -> (where, line moved)

    def copy(self) -> _State:
        return _State(self.facts, dict(self.places))


def _meet(states: list[_State]) -> _State:
    """What holds after branches: the facts and placements all of them agree on."""
    if not states:
        return _State()
    facts = frozenset.intersection(*(s.facts for s in states))
    first = states[0].places
    places = {k: v for k, v in first.items() if all(s.places.get(k) == v for s in states[1:])}
    return _State(facts, places)


def _ends(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


class Flow:
    def __init__(self, src: Source) -> None:
        self.src = src
        self._facts_at: dict[ast.Call, frozenset[str]] = {}
        self._places_at: dict[ast.Call, dict[str, tuple[str, int]]] = {}
        self._end: dict[ast.AST, frozenset[str]] = {}
        self._entry: dict[ast.AST, frozenset[str]] = {}
        self._module_end = self._walk_body(src.tree.body, _State(), 0).facts
        for func in src.functions:
            self._summary(func, 0)

    # ---- questions ------------------------------------------------------------------------

    def facts(self, call: ast.Call, depth: int = 0) -> frozenset[str]:
        """The facts that hold on every path to `call` (its function's callers included)."""
        local = self._facts_at.get(call, frozenset())
        func = self.src.function_of(call)
        return local | (self._entry_facts(func, depth) if func is not None else frozenset())

    def placement(self, call: ast.Call, model: str) -> tuple[str, int] | None:
        """Where the last move before `call` put `model` (a variable or self attribute), and its line."""
        return self._places_at.get(call, {}).get(model)

    # ---- the walk ---------------------------------------------------------------------------

    def _summary(self, func: ast.AST, depth: int) -> frozenset[str]:
        if func in self._end:
            return self._end[func]
        if depth > MAX_CALL_DEPTH:
            return frozenset()
        self._end[func] = frozenset()  # a recursive call establishes nothing new
        assert isinstance(func, FUNCTION_TYPES)
        state = self._walk_body(func.body, _State(), depth)
        self._end[func] = state.facts
        return state.facts

    def _entry_facts(self, func: ast.AST, depth: int) -> frozenset[str]:
        if func in self._entry:
            return self._entry[func]
        if depth > MAX_CALL_DEPTH:
            return frozenset()
        self._entry[func] = frozenset()
        sites = self.src.sites.get(func, [])
        result: frozenset[str] = frozenset()
        if not sites:  # called by a framework or another file: after this file's own top-level code ran
            result = self._module_end
        elif all(site.call is not None for site in sites):
            result = frozenset.intersection(*(self.facts(s.call, depth + 1) for s in sites if s.call is not None))
        self._entry[func] = result
        return result

    def _walk_body(self, body: list[ast.stmt], state: _State, depth: int) -> _State:
        for stmt in body:
            state = self._walk_stmt(stmt, state, depth)
        return state

    def _walk_stmt(self, stmt: ast.stmt, state: _State, depth: int) -> _State:
        if isinstance(stmt, (*FUNCTION_TYPES, ast.ClassDef)):
            return state
        headers = _HEADERS.get(type(stmt))
        if headers is None and not isinstance(stmt, _TRIES):
            self._effects([stmt], state, depth)
            self._place(stmt, state)
            return state
        parts = [getattr(stmt, h) for h in headers or ()]
        self._effects([n for p in parts for n in (p if isinstance(p, list) else [p])], state, depth)
        if is_main_guard(stmt):  # the script's body: it runs
            return self._walk_body(stmt.body, state, depth)
        if isinstance(stmt, ast.If):
            branches = []
            for block in (stmt.body, stmt.orelse):
                end = self._walk_body(block, state.copy(), depth)
                if not _ends(block):
                    branches.append(end)
            return _meet(branches) if branches else state
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            end = self._walk_body(stmt.body, state.copy(), depth)
            self._walk_body(stmt.orelse, state.copy(), depth)
            return _meet([state, end])
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            return self._walk_body(stmt.body, state, depth)
        if isinstance(stmt, ast.Match):
            ends = [self._walk_body(case.body, state.copy(), depth) for case in stmt.cases]
            return _meet([state, *ends])
        # try: the body may stop anywhere, a handler may run instead
        body_end = self._walk_body(stmt.body, state.copy(), depth)
        body_end = self._walk_body(stmt.orelse, body_end, depth)
        handlers = [self._walk_body(h.body, state.copy(), depth) for h in stmt.handlers if not _ends(h.body)]
        after = _meet([body_end, *handlers])
        return self._walk_body(stmt.finalbody, after, depth)

    def _effects(self, nodes: list[ast.AST], state: _State, depth: int) -> None:
        """Record the state at each call in `nodes`, then apply what those calls establish."""
        calls = [n for node in nodes for n in self.src.walk(node) if isinstance(n, ast.Call)]
        for call in calls:
            self._facts_at[call] = state.facts
            if self.src.names.call(call) == "ddp":
                self._places_at[call] = dict(state.places)
        facts = set(state.facts)
        for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
            key = self.src.names.call(call)
            if key == "set_device":
                facts.add("set_device")
            elif key in ("manual_seed", "seed_helper"):
                facts -= {"seed", "seed_rank"}
                facts.add("seed_rank" if any(mentions_rank(self.src, a) for a in call.args) else "seed")
            else:
                target = self.src.resolve_call(call)
                if target is not None:
                    facts |= self._summary(target[0], depth + 1)
        state.facts = frozenset(facts)

    def _place(self, stmt: ast.stmt, state: _State) -> None:
        """Track `m.cuda()`, `m.to(...)`, `m = X.cuda()`; any other assignment forgets m's placement."""
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            if isinstance(call.func, ast.Attribute) and call.func.attr in ("cuda", "to"):
                key = text(call.func.value)
                if key is not None:
                    state.places[key] = (self._kind(call), call.lineno)
            return
        targets = (
            stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        )
        value = getattr(stmt, "value", None)
        for target in targets:
            key = text(target)
            if key is None:
                continue
            moved = (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr in ("cuda", "to")
            )
            if moved:
                assert isinstance(value, ast.Call)
                state.places[key] = (self._kind(value), value.lineno)
            else:
                state.places.pop(key, None)

    def _kind(self, call: ast.Call) -> str:
        assert isinstance(call.func, ast.Attribute)
        arg = call.args[0] if call.args else keyword(call, "device")
        if call.func.attr == "cuda":
            return DEFAULT if arg is None else INDEXED
        if arg is None:
            return OTHER
        return self._device_kind(arg, call, 0)

    def _device_kind(self, arg: ast.AST, at: ast.AST, depth: int) -> str:
        value = constant(arg)
        if isinstance(value, str):
            return DEFAULT if value == "cuda" else (INDEXED if value.startswith("cuda:") else OTHER)
        if isinstance(arg, ast.Call) and self.src.names.call(arg) == "device":
            if len(arg.args) >= 2 or keyword(arg, "index") is not None:
                return INDEXED
            return self._device_kind(arg.args[0], at, depth) if arg.args else OTHER
        if isinstance(arg, ast.Name) and depth < 3:
            values = self.src.values(arg.id, self.src.scope.get(at))
            kinds = {self._device_kind(v, at, depth + 1) if v is not None else OTHER for v in values}
            if len(kinds) == 1:
                return kinds.pop()
        return OTHER
