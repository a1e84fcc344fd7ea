"""DataLoaders and their samplers, as the data rules read them (GD754, GD755, GD763).

`DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)`: the sampler is the
`sampler=` keyword or the fourth positional argument, the batch sampler the fifth. A sampler
expression is followed through the variables it was assigned: a DistributedSampler in one branch
and None in the other (imagenet's `train_sampler`) counts as distributed.
"""

from __future__ import annotations

import ast
import re

from gpudoctor.lint.names import argument, constant, has_splat, keyword, last_name, text
from gpudoctor.lint.source import Source

YES, NO, NONE, UNKNOWN = "yes", "no", "none", "unknown"
_PLAIN_SAMPLERS = {"RandomSampler", "SequentialSampler", "WeightedRandomSampler", "SubsetRandomSampler"}
_DISTRIBUTED_CLASS = re.compile(r"Distributed|Shard", re.I)


def sampler_args(call: ast.Call) -> list[ast.expr]:
    """The sampler and batch sampler a DataLoader call gives (those given)."""
    out = []
    for index, name in ((3, "sampler"), (4, "batch_sampler")):
        value = argument(call, index, name)
        if value is not None:
            out.append(value)
    return out


def sampler_kind(src: Source, expr: ast.AST | None, depth: int = 0) -> str:
    """YES: shards by rank; NO: a sampler that does not; NONE: None; UNKNOWN: not visible."""
    if expr is None or depth > 6:
        return UNKNOWN
    if isinstance(expr, ast.Constant) and expr.value is None:
        return NONE
    if isinstance(expr, ast.Call):
        if src.names.call(expr) == "dist_sampler":
            return YES
        name = last_name(expr.func)
        if name is None:
            return UNKNOWN
        if name == "BatchSampler" and expr.args:
            return sampler_kind(src, expr.args[0], depth + 1)
        if _DISTRIBUTED_CLASS.search(name) or _subclasses_distributed(src, name, expr):
            return YES
        return NO if name in _PLAIN_SAMPLERS else UNKNOWN
    if isinstance(expr, ast.IfExp):
        kinds = {sampler_kind(src, expr.body, depth + 1), sampler_kind(src, expr.orelse, depth + 1)}
        return _combine(kinds)
    key = text(expr)
    if key is None:
        return UNKNOWN
    scope = src.scope.get(expr)
    return src.remember("sampler", key, scope, lambda: _variable_kind(src, key, scope, depth), UNKNOWN)


def _variable_kind(src: Source, key: str, scope: ast.AST | None, depth: int) -> str:
    values = src.values(key, scope)
    if not values or any(v is None for v in values):
        return UNKNOWN
    return _combine({sampler_kind(src, v, depth + 1) for v in values})


def _combine(kinds: set[str]) -> str:
    if YES in kinds:
        return YES
    if UNKNOWN in kinds or not kinds:
        return UNKNOWN
    return NO if NO in kinds else NONE


def _subclasses_distributed(src: Source, name: str, at: ast.AST) -> bool:
    cls = src.lookup_def(name, src.scope.get(at))
    if not isinstance(cls, ast.ClassDef):
        return False
    return any(_DISTRIBUTED_CLASS.search(last_name(b) or "") for b in cls.bases)


def loader_sampler(src: Source, call: ast.Call) -> str:
    """How a DataLoader call is sharded: the kind of its sampler (NONE when it gives none)."""
    given = sampler_args(call)
    if not given:
        return UNKNOWN if has_splat(call) else NONE
    return _combine({sampler_kind(src, g) for g in given})


def training_batch_sizes(src: Source) -> tuple[int, ...]:
    """The literal batch sizes of the DataLoaders fed by a DistributedSampler (per GPU under DDP)."""
    sizes = []
    for call in src.by_api.get("dataloader", []):
        if loader_sampler(src, call) != YES:
            continue
        size = _int_value(src, argument(call, 1, "batch_size"), 0)
        if size is not None:
            sizes.append(size)
    return tuple(sizes)


def _int_value(src: Source, expr: ast.AST | None, depth: int) -> int | None:
    value = constant(expr)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if expr is None or depth > 3:
        return None
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return _argparse_default(src, expr.attr)
    key = text(expr)
    if key is None:
        return None
    scope = src.scope.get(expr)

    def one_value() -> int | None:
        values = {_int_value(src, v, depth + 1) for v in src.values(key, scope)}
        return values.pop() if len(values) == 1 else None

    return src.remember("int", key, scope, one_value, None)


def _argparse_default(src: Source, dest: str) -> int | None:
    """The int default of the argparse option whose destination is `dest` (`--batch-size` -> batch_size)."""
    for call in src.calls:
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
            continue
        flags = [constant(a) for a in call.args]
        named = constant(keyword(call, "dest"))
        dests = (
            {named}
            if isinstance(named, str)
            else {f.lstrip("-").replace("-", "_") for f in flags if isinstance(f, str)}
        )
        if dest in dests:
            default = constant(keyword(call, "default"))
            return default if isinstance(default, int) and not isinstance(default, bool) else None
    return None
