"""The rules of the data each rank reads: the sampler (GD754), its epoch (GD755) and the split
(GD756). Detection logic and traps: tests/reference/lint/rules.md, rules 5-7."""

from __future__ import annotations

import ast
import re

from gpudoctor.lint.context import Context, Hit
from gpudoctor.lint.guards import GUARDED
from gpudoctor.lint.loaders import NO, NONE, loader_sampler, sampler_args
from gpudoctor.lint.names import SHARD_NAME, argument, constant, keyword, last_name, text
from gpudoctor.lint.source import FUNCTION_TYPES, Source

# A loader for evaluation, by its name or its dataset's: every rank evaluating the whole set is
# redundant, not wrong (a heuristic; the training loader is the one that must be sharded).
_EVAL_NAME = re.compile(r"(^|_)(val|valid|validation|test|eval|evaluation|dev)(_|$|\d)", re.I)


def no_distributed_sampler(ctx: Context) -> list[Hit]:
    """GD754: a DataLoader every rank runs, with no sampler that shards by rank."""
    src, program = ctx.src, ctx.program
    built = src.by_api.get("dist_sampler", [])
    if program.accelerate or not (program.process_group or built):
        return []
    orphans = _orphan_samplers(src)
    hits = []
    for call in src.by_api.get("dataloader", []):
        kind = loader_sampler(src, call)
        if kind not in (NO, NONE) or ctx.guards.status(call) == GUARDED:
            continue
        dataset = argument(call, 0, "dataset")
        if _is_eval(src, call, dataset) or _sharded(src, dataset, 0):
            continue
        orphan = orphans.get(src.function_of(call)) or next(iter(orphans.values()), None)
        if orphan is not None:
            what = f"a DistributedSampler is built on line {orphan[0].lineno} ({orphan[1]}) but never passed to it"
        elif kind == NO:
            sampler = sampler_args(call)[0]
            name = last_name(sampler.func) if isinstance(sampler, ast.Call) else text(sampler)
            what = f"its sampler ({name or 'a plain sampler'}) does not shard by rank"
        else:
            what = "it has no DistributedSampler"
        hits.append(
            Hit(
                "no-distributed-sampler",
                call.lineno,
                f"this DataLoader runs on every rank and {what}: each rank reads the whole dataset, so an epoch "
                "trains on N copies of the data and the effective batch is N times the one intended",
                evidence={"sampler": kind, **({"sampler_line": orphan[0].lineno} if orphan else {})},
            )
        )
    return hits


def _orphan_samplers(src: Source) -> dict[ast.AST | None, tuple[ast.Call, str]]:
    """DistributedSamplers assigned to a variable nothing reads (but for `.set_epoch`), by the
    function that builds them (the first of each)."""
    read = set()
    for node in src.nodes:
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            parent = src.parent.get(node)
            if not (isinstance(parent, ast.Attribute) and parent.attr == "set_epoch"):
                read.add(text(node))
    out: dict[ast.AST | None, tuple[ast.Call, str]] = {}
    for call in src.by_api.get("dist_sampler", []):
        stmt = src.parent.get(call)
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            continue
        key = text(stmt.targets[0])
        if key is not None and key not in read:
            out.setdefault(src.function_of(call), (call, key))
    return out


def _is_eval(src: Source, call: ast.Call, dataset: ast.AST | None) -> bool:
    stmt = src.parent.get(call)
    names = [last_name(t) for t in stmt.targets] if isinstance(stmt, ast.Assign) else []
    names.append(last_name(dataset) if dataset is not None else None)
    return any(n is not None and _EVAL_NAME.search(n) for n in names)


def _sharded(src: Source, dataset: ast.AST | None, depth: int) -> bool:
    """A dataset built from the rank or the world size (`Subset(ds, range(rank, n, world))`,
    `ds.shard(...)`, `split_dataset_by_node`), or an in-file IterableDataset (it shards itself)."""
    if dataset is None or depth > 3:
        return False
    for node in ast.walk(dataset):
        name = last_name(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if name is not None and (SHARD_NAME.search(name) or name == "split_dataset_by_node"):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            cls = src.lookup_def(node.func.id, src.scope.get(node))
            if isinstance(cls, ast.ClassDef) and any("Iterable" in (last_name(b) or "") for b in cls.bases):
                return True
    return src.any_value("sharded", dataset, lambda v: _sharded(src, v, depth + 1))


def set_epoch_missing(ctx: Context) -> list[Hit]:
    """GD755: a shuffling DistributedSampler that feeds a DataLoader, and no set_epoch anywhere."""
    src, program = ctx.src, ctx.program
    if program.set_epoch or program.accelerate:
        return []
    fed = _fed_samplers(src)
    hits = []
    for call in src.by_api.get("dist_sampler", []):
        if constant(keyword(call, "shuffle")) is False or call not in fed:
            continue
        hits.append(
            Hit(
                "sampler-set-epoch-missing",
                call.lineno,
                "this DistributedSampler shuffles, but nothing calls set_epoch: its permutation is seeded with "
                "seed + epoch, so every epoch repeats epoch 0's order on every rank",
            )
        )
    return hits


def _fed_samplers(src: Source) -> set[ast.Call]:
    """The DistributedSampler calls that reach a DataLoader, inline or through a variable."""
    fed: set[ast.Call] = set()
    passed: set[str] = set()
    for loader in src.by_api.get("dataloader", []):
        for arg in sampler_args(loader):
            inner = (
                arg.args[0] if isinstance(arg, ast.Call) and last_name(arg.func) == "BatchSampler" and arg.args else arg
            )
            if isinstance(inner, ast.Call):
                fed.add(inner)
            elif text(inner) is not None:
                passed.add(text(inner))  # type: ignore[arg-type]
    for call in src.by_api.get("dist_sampler", []):
        stmt = src.parent.get(call)
        if isinstance(stmt, ast.Assign) and any(text(t) in passed for t in stmt.targets):
            fed.add(call)
    return fed


def random_split_no_generator(ctx: Context) -> list[Hit]:
    """GD756: random_split without a generator, on every rank, with no rank-free seed before it."""
    src = ctx.src
    if not (ctx.program.distributed or ctx.program.lightning):
        return []
    hits = []
    for call in src.by_api.get("random_split", []):
        if keyword(call, "generator") is not None or len(call.args) >= 3 or ctx.guards.status(call) == GUARDED:
            continue
        if _spawns_beside(src, call):
            continue  # split once in the parent, the subsets handed to the workers
        facts = ctx.flow.facts(call)
        if "seed" in facts:
            continue
        seeded = "seed_rank" in facts
        why = (
            "the seed set before it depends on the rank, so every rank draws a different split"
            if seeded
            else "each process's default generator has its own seed, so every rank draws a different split"
        )
        hits.append(
            Hit(
                "random-split-no-generator",
                call.lineno,
                f"random_split without a generator runs on every rank: {why}; rank A's validation samples are in "
                "rank B's training set, so the model trains on validation data and the metric is inflated",
                evidence={"seed_depends_on_rank": seeded},
            )
        )
    return hits


def _spawns_beside(src: Source, call: ast.Call) -> bool:
    func = src.function_of(call)
    body: ast.AST = func if isinstance(func, FUNCTION_TYPES) else src.tree
    return any(isinstance(n, ast.Call) and src.names.call(n) == "spawn" for n in src.walk(body))
