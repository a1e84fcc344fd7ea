"""Which code runs on every rank and which only on rank 0.

A statement is guarded when it sits in the body of an `if` whose test holds only on rank 0
(`rank == 0`, `dist.get_rank() == 0`, `args.rank % ngpus == 0`, `is_main_process`, `and`-ed with
anything, `or`-ed only with flags that name no rank), in the `else` of the opposite test, after an
early `if rank != 0: return`, in a function decorated `@rank_zero_only`, or in a function whose
every in-file caller is guarded. A function nobody in the file calls is UNKNOWN: its caller (in
another file, or a framework) may guard it. pytorch/examples' imagenet guards its checkpoint with
`not args.multiprocessing_distributed or (... and args.rank % ngpus_per_node == 0)`: accepted as a
guard (the other mode, one process per node, is undocumented there).
"""

from __future__ import annotations

import ast

from gpudoctor.lint.names import RANK_NAME, last_name, text
from gpudoctor.lint.source import FUNCTION_TYPES, Source

GUARDED, UNGUARDED, UNKNOWN = "guarded", "unguarded", "unknown"
MAX_CALL_DEPTH = 40  # callers of callers followed; deeper is left UNKNOWN (bounded recursion)

_MAIN_PROCESS = {
    "is_main_process",
    "is_local_main_process",
    "is_master",
    "is_main",
    "is_rank_zero",
    "is_global_zero",
    "main_process",
    "is_rank_0",
    "master_process",
    "is_master_process",
}
_RANK_ZERO_DECORATORS = {"rank_zero_only", "main_process_only", "on_main_process", "on_local_main_process"}
_RANK_ENV = {"RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}
_EXITS = {"exit", "_exit", "quit"}


def is_rank_value(src: Source, expr: ast.AST) -> bool:
    """A rank by its name (`rank`, `self.gpu_id`), `dist.get_rank()`, or a RANK environment read."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "int" and expr.args:
        expr = expr.args[0]
    name = last_name(expr)
    if name is not None and RANK_NAME.match(name):
        return True
    if isinstance(expr, ast.Call):
        if src.names.call(expr) == "get_rank" or last_name(expr.func) in ("get_rank", "get_node_local_rank"):
            return True
        if any(isinstance(a, ast.Constant) and a.value in _RANK_ENV for a in expr.args):
            return True  # os.environ.get("RANK"), os.getenv("LOCAL_RANK")
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
        return expr.slice.value in _RANK_ENV
    return False


def mentions_rank(src: Source, expr: ast.AST) -> bool:
    return any(is_rank_value(src, node) for node in ast.walk(expr))


def _zero(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and expr.value == 0 and not isinstance(expr.value, bool)


def _rank_side(src: Source, expr: ast.AST) -> bool:
    """A rank, or `rank % n` (rank 0 of each node: imagenet's `args.rank % ngpus_per_node`)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
        return is_rank_value(src, expr.left)
    return is_rank_value(src, expr)


def rank_test(src: Source, test: ast.AST) -> int:
    """+1: true only on rank 0; -1: true only off rank 0; 0: not a rank test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = rank_test(src, test.operand)
        if inner:
            return -inner
        return 1 if _rank_side(src, test.operand) else 0  # `not rank`: rank 0
    if isinstance(test, ast.BoolOp):
        parts = [rank_test(src, v) for v in test.values]
        if isinstance(test.op, ast.And):
            return 1 if 1 in parts else (-1 if -1 in parts else 0)
        # or: rank 0 only when some part is a rank-0 test and the others are flags naming no rank
        if 1 in parts and all(
            p == 1 or (p == 0 and not mentions_rank(src, v)) for p, v in zip(parts, test.values, strict=True)
        ):
            return 1
        return 0
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if _zero(left) and _rank_side(src, right):
            left, right = right, left
            op = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}.get(type(op), op)
        if not _rank_side(src, left):
            return 0
        if isinstance(right, (ast.Tuple, ast.List, ast.Set)) and isinstance(op, (ast.In, ast.NotIn)):
            values = {e.value for e in right.elts if isinstance(e, ast.Constant)}
            if values and values <= {-1, 0}:
                return 1 if isinstance(op, ast.In) else -1
            return 0
        if not isinstance(right, ast.Constant) or isinstance(right.value, bool) or right.value not in (0, 1):
            return 0
        one = right.value == 1
        if isinstance(op, (ast.Eq, ast.Is)) and not one:
            return 1
        if isinstance(op, ast.Lt) and one:
            return 1
        if isinstance(op, ast.LtE) and not one:
            return 1
        if isinstance(op, (ast.NotEq, ast.IsNot)) and not one:
            return -1
        if isinstance(op, ast.Gt) and not one:
            return -1
        if isinstance(op, ast.GtE) and one:
            return -1
        return 0
    name = last_name(test.func) if isinstance(test, ast.Call) else last_name(test)
    if name in _MAIN_PROCESS or (isinstance(test, (ast.Name, ast.Attribute)) and _rank_zero_flag(src, test)):
        return 1
    return -1 if _rank_side(src, test) else 0  # `if rank:` holds off rank 0


def _rank_zero_flag(src: Source, expr: ast.Name | ast.Attribute) -> bool:
    """A variable that holds a rank-0 test (nanoGPT's `master_process = ddp_rank == 0`, True when
    not distributed)."""
    key = text(expr)
    if key is None:
        return False
    scope = src.scope.get(expr)

    def decide() -> bool:
        tests = [v for v in src.values(key, scope) if not (isinstance(v, ast.Constant) and v.value is True)]
        return bool(tests) and all(v is not None and rank_test(src, v) == 1 for v in tests)

    return src.remember("rank0", key, scope, decide, False)


def _exits(body: list[ast.stmt]) -> bool:
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    return isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and last_name(last.value.func) in _EXITS


class Guards:
    """Guard status of any node, with each function's status computed once."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self._functions: dict[ast.AST, str] = {}
        self._exits: dict[int, int] = {}  # id(block) -> its first early exit (the tree outlives this)

    def local(self, node: ast.AST) -> bool:
        """Guarded inside its own function (or module) body."""
        src = self.src
        child: ast.AST = node
        cur = src.parent.get(node)
        while cur is not None:
            if isinstance(cur, ast.If) and child is not cur.test:
                test = rank_test(src, cur.test)
                in_body = any(child is s for s in cur.body)
                if (test == 1 and in_body) or (test == -1 and not in_body):
                    return True
            held = src.block_of(child)
            if held is not None and held[1] > self._first_exit(held[0]):
                return True  # after an earlier `if rank != 0: return` in the same block
            if isinstance(cur, (*FUNCTION_TYPES, ast.Lambda)):
                break
            child, cur = cur, src.parent.get(cur)
        return False

    def _first_exit(self, block: list[ast.stmt]) -> int:
        """The index of the block's first `if <not rank 0>: return` (len(block) when none), once per block."""
        key = id(block)
        if key not in self._exits:
            self._exits[key] = next(
                (
                    i
                    for i, stmt in enumerate(block)
                    if isinstance(stmt, ast.If) and rank_test(self.src, stmt.test) == -1 and _exits(stmt.body)
                ),
                len(block),
            )
        return self._exits[key]

    def status(self, node: ast.AST, depth: int = 0) -> str:
        """GUARDED, UNGUARDED (runs on every rank) or UNKNOWN (in a function no one in the file calls)."""
        if self.local(node):
            return GUARDED
        func = self.src.function_of(node)
        return UNGUARDED if func is None else self.function(func, depth)

    def function(self, func: ast.AST, depth: int = 0) -> str:
        if func in self._functions:
            return self._functions[func]
        if depth > MAX_CALL_DEPTH:  # a chain of callers this long: not followed further (and not cached)
            return UNKNOWN
        self._functions[func] = UNKNOWN  # while in progress: a recursive call proves nothing
        result = self._compute(func, depth)
        self._functions[func] = result
        return result

    def _compute(self, func: ast.AST, depth: int) -> str:
        assert isinstance(func, FUNCTION_TYPES)
        for dec in func.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if last_name(target) in _RANK_ZERO_DECORATORS:
                return GUARDED
        sites = self.src.sites.get(func, [])
        if not sites:
            return UNKNOWN
        statuses = {self.status(site.node, depth + 1) for site in sites}
        if UNGUARDED in statuses:
            return UNGUARDED
        return GUARDED if statuses == {GUARDED} else UNKNOWN
