"""Where the global rank flows (GD753): a small dataflow inside one file.

A value is the GLOBAL rank when it comes from `os.environ["RANK"]` (or any `x["RANK"]`: a dict
built from the environment), `dist.get_rank()`, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK or
`accelerator.process_index`, through `int()`/`str()`, assignments (a variable is the global rank
when every assignment of it is), `self.x` across a class, and the parameters of in-file functions
whose every call site passes it. A name is never evidence: minGPT binds
`rank = int(os.environ["LOCAL_RANK"])`. Arithmetic ends the flow: `rank % torch.cuda.device_count()`
(the tutorial's elastic_ddp.py) is a local index on homogeneous nodes, `args.rank * ngpus + gpu`
a computed rank. A function handed to mp.spawn gets the process index, never the global rank.

Each value carries its origin (the line of the read) and its reach: the line, in the function
where the origin is, from which the flow leaves for the sink (the sink itself, or the call that
carries it on), so one finding is anchored at the first device choice the run reaches.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from gpudoctor.lint.guards import MAX_CALL_DEPTH
from gpudoctor.lint.names import last_name, text
from gpudoctor.lint.source import Function, Site, Source

GLOBAL_ENV = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}


@dataclass(frozen=True)
class Origin:
    line: int  # where the global rank was read
    what: str  # "RANK", "dist.get_rank()"
    reach: int  # the line in the origin's function from which it reaches the sink


class Ranks:
    def __init__(self, src: Source) -> None:
        self.src = src
        self._params: dict[tuple[Function, int], Origin | None] = {}
        self._solve_params()

    def origin(self, expr: ast.AST | None, depth: int = 0) -> Origin | None:
        """The global-rank origin of `expr`, or None (a local rank, a spawn index, unknown)."""
        if expr is None or depth > 8:
            return None
        src = self.src
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("int", "str"):
            return self.origin(expr.args[0], depth + 1) if len(expr.args) == 1 else None
        line = getattr(expr, "lineno", 0)
        env = env_key(expr)
        if env is not None:
            return Origin(line, env, line) if env in GLOBAL_ENV else None
        if isinstance(expr, ast.Call) and src.names.call(expr) == "get_rank" and not expr.args and not expr.keywords:
            return Origin(line, "dist.get_rank()", line)
        if isinstance(expr, ast.Attribute) and expr.attr == "process_index":
            return Origin(line, "process_index", line)
        key = text(expr)
        if key is None:
            return None
        scope = src.scope.get(expr)
        param = src.param_index(key, scope) if isinstance(expr, ast.Name) else None
        if param is not None:
            return self._params.get(param)
        first = src.remember("rank", key, scope, lambda: self._variable(key, scope, depth), None)
        return Origin(first.line, first.what, line) if first is not None else None  # reaches from here

    def _variable(self, key: str, scope: ast.AST | None, depth: int) -> Origin | None:
        """The origin of a variable every assignment of which is the global rank (the earliest)."""
        values = self.src.values(key, scope)
        if not values or any(v is None for v in values):
            return None
        origins = []
        for v in values:
            origin = self.origin(v, depth + 1)
            if origin is None:
                return None
            origins.append(origin)
        return min(origins, key=lambda o: o.line)

    def _solve_params(self) -> None:
        """Parameters whose every in-file call passes the global rank, to a fixpoint (bounded)."""
        src = self.src
        for _ in range(min(len(src.functions), MAX_CALL_DEPTH) + 1):
            changed = False
            for func in src.functions:
                sites = src.sites.get(func, [])
                if not sites or any(s.call is None for s in sites):
                    continue  # a spawn target or a callback: its arguments are not visible
                for index in range(len(func.args.posonlyargs) + len(func.args.args)):
                    if (func, index) in self._params:
                        continue
                    origins = [self._site_origin(s, func, index) for s in sites]
                    if origins and all(o is not None for o in origins):
                        self._params[(func, index)] = min(origins, key=lambda o: o.reach)  # type: ignore[union-attr]
                        changed = True
            if not changed:
                return

    def _site_origin(self, site: Site, func: Function, index: int) -> Origin | None:
        arg = self.src.site_argument(site, func, index)
        return self.origin(arg) if arg is not None else None


def env_key(expr: ast.AST) -> str | None:
    """The variable an environment read names: `os.environ["RANK"]`, `env["RANK"]`,
    `os.environ.get("RANK")`, `os.getenv("RANK")`; None for anything else."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, str):
        return expr.slice.value
    if isinstance(expr, ast.Call) and expr.args and isinstance(expr.args[0], ast.Constant):
        name = last_name(expr.func)
        owner = text(expr.func.value) if isinstance(expr.func, ast.Attribute) else None
        if (name == "get" and owner is not None and owner.endswith("environ")) or name == "getenv":
            value = expr.args[0].value
            return value if isinstance(value, str) else None
    return None
