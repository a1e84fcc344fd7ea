"""The rules of what a run saves and loads: writes every rank makes (GD757) and checkpoints loaded
onto the saving GPU (GD758). Detection logic and traps: tests/reference/lint/rules.md, rules 8-9."""

from __future__ import annotations

import ast

from gpudoctor.lint.context import Context, Hit
from gpudoctor.lint.guards import UNGUARDED, Guards, mentions_rank
from gpudoctor.lint.names import argument, constant, has_splat, keyword
from gpudoctor.lint.source import Source

_WRITE_MODES = set("wax+")
# (api key) -> (what it is, where its destination is: (position, keyword) or None)
_SINKS: dict[str, tuple[str, tuple[int, str] | None]] = {
    "torch_save": ("torch.save", (1, "f")),
    "np_save": ("numpy's save", (0, "file")),
    "copyfile": ("a file copy", (1, "dst")),
    "summary_writer": ("a TensorBoard SummaryWriter", (0, "log_dir")),
    "wandb_init": ("wandb.init", None),
    "mlflow_run": ("mlflow.start_run", None),
}
_METHOD_SINKS = {"write_text", "write_bytes", "to_csv", "to_json", "to_parquet"}


def unguarded_rank_write(ctx: Context) -> list[Hit]:
    """GD757: a write to a file (or a run of a tracker) that every rank makes."""
    src = ctx.src
    if not ctx.program.distributed:
        return []
    hits = []
    for call in src.calls:
        sink = _sink(src, call)
        if sink is None:
            continue
        what, dest = sink
        if ctx.guards.status(call) != UNGUARDED:
            continue
        if dest is not None and (_in_memory(src, dest) or _per_rank(src, dest)):
            continue
        site = _unguarded_site(ctx.guards, src, call)
        via = f", reached from line {site}" if site else ""
        tracker = src.names.call(call) in ("summary_writer", "wandb_init", "mlflow_run")
        harm = (
            "every rank starts its own run: N copies of the same curves"
            if tracker
            else "N processes write the same file at once: a truncated or corrupt file, or a reader racing the writer"
        )
        hint = "create it under `if dist.get_rank() == 0:` (one run, one writer)" if tracker else None
        hits.append(
            Hit(
                "unguarded-rank-write",
                call.lineno,
                f"{what} runs on every rank (no rank-0 guard{via}): {harm}",
                hint=hint,
                evidence={"reached_from": site} if site else {},
            )
        )
    return hits


def _sink(src: Source, call: ast.Call) -> tuple[str, ast.AST | None] | None:
    key = src.names.call(call)
    if key in _SINKS:
        what, where = _SINKS[key]
        return what, (argument(call, *where) if where else None)
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open" and "open" not in src.names.bound:
        mode = constant(argument(call, 1, "mode"))
        if isinstance(mode, str) and _WRITE_MODES & set(mode):
            return f"open(..., {mode!r})", argument(call, 0, "file")
        return None
    if isinstance(func, ast.Attribute) and func.attr in _METHOD_SINKS:
        if func.attr.startswith("write_"):
            return f".{func.attr}()", func.value
        if call.args or keyword(call, "path_or_buf") is not None or keyword(call, "path") is not None:
            return f".{func.attr}()", argument(call, 0, "path_or_buf")
    return None


def _in_memory(src: Source, dest: ast.AST, depth: int = 0) -> bool:
    if isinstance(dest, ast.Call) and src.names.call(dest) == "bytes_io":
        return True
    return depth <= 3 and src.every_value("memory", dest, lambda v: _in_memory(src, v, depth + 1))


def _per_rank(src: Source, dest: ast.AST, depth: int = 0) -> bool:
    """A destination that embeds the rank (`f"ckpt_rank{rank}.pt"`): one file per rank by design."""
    if mentions_rank(src, dest):
        return True
    return depth <= 3 and src.any_value("per_rank", dest, lambda v: _per_rank(src, v, depth + 1))


def _unguarded_site(guards: Guards, src: Source, call: ast.Call) -> int | None:
    """The line of the first call site that runs the write's function on every rank."""
    func = src.function_of(call)
    if func is None:
        return None
    site = next((s for s in src.sites.get(func, []) if guards.status(s.node) == UNGUARDED), None)
    return getattr(site.node, "lineno", None) if site is not None else None


def load_no_map_location(ctx: Context) -> list[Hit]:
    """GD758: torch.load on every rank without map_location."""
    src = ctx.src
    if not ctx.program.raw:
        return []
    hits = []
    for call in src.by_api.get("torch_load", []):
        if _maps(src, call) or has_splat(call) or ctx.guards.status(call) != UNGUARDED or _other_branch_maps(src, call):
            continue
        weights = constant(keyword(call, "weights_only")) is True
        note = " (weights_only=True does not choose the device)" if weights else ""
        hits.append(
            Hit(
                "torch-load-no-map-location",
                call.lineno,
                f"torch.load without map_location runs on every rank{note}: tensors go back to the GPU they were "
                "saved from, usually cuda:0, so every rank of the node allocates the checkpoint on GPU 0",
            )
        )
    return hits


def _maps(src: Source, call: ast.Call) -> bool:
    if keyword(call, "map_location") is not None:
        return True
    dotted = src.names.dotted(call.func) or ""
    return len(call.args) >= (3 if dotted.endswith("load_state_dict_from_url") else 2)


def _other_branch_maps(src: Source, call: ast.Call) -> bool:
    """imagenet's `if args.gpu is None: torch.load(path) else: torch.load(path, map_location=loc)`:
    the author chose per case."""
    child: ast.AST = call
    cur = src.parent.get(call)
    while cur is not None:
        if isinstance(cur, ast.If) and child is not cur.test:
            other = cur.orelse if any(child is s for s in cur.body) else cur.body
            for stmt in other:
                for node in ast.walk(stmt):
                    if isinstance(node, ast.Call) and src.names.call(node) == "torch_load" and _maps(src, node):
                        return True
        child, cur = cur, src.parent.get(cur)
    return False
