"""The rules of the model and its step: DDP's device (GD759), accumulation without no_sync
(GD760), clipping scaled gradients (GD761), DataParallel (GD762) and BatchNorm at small per-GPU
batches (GD763). Detection logic and traps: tests/reference/lint/rules.md, rules 10-14."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from gpudoctor.lint.codes import BATCHNORM_SYNC
from gpudoctor.lint.context import Context, Hit
from gpudoctor.lint.flow import DEFAULT
from gpudoctor.lint.names import argument, constant, keyword, last_name, text
from gpudoctor.lint.source import FUNCTION_TYPES, Source

SMALL_BATCH = 16  # per-GPU batch at or under which BatchNorm statistics are called noisy (heuristic)
_ACCUMULATION = re.compile(r"accum|update_freq|grad_acc", re.I)
_STEPPER = re.compile(r"optim|opt$|scaler", re.I)
_SYNC_CONTROLS = {"no_sync", "require_backward_grad_sync", "accumulate"}
_CLIPS = {"clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_"}
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def ddp_no_device_ids(ctx: Context) -> list[Hit]:
    """GD759: DDP without device_ids on a model moved to the default GPU, no set_device before it."""
    src = ctx.src
    hits = []
    for call in src.by_api.get("ddp", []):
        if keyword(call, "device_ids") is not None or keyword(call, "device_mesh") is not None or len(call.args) > 1:
            continue
        model = argument(call, 0, "module")
        if model is None:
            continue
        if isinstance(model, ast.Call) and isinstance(model.func, ast.Attribute) and model.func.attr == "cuda":
            placed = (DEFAULT, model.lineno) if not model.args and not model.keywords else None
        else:
            key = text(model)
            placed = ctx.flow.placement(call, key) if key is not None else None
        if placed is None or placed[0] != DEFAULT or "set_device" in ctx.flow.facts(call):
            continue
        hits.append(
            Hit(
                "ddp-no-device-ids",
                call.lineno,
                f"DistributedDataParallel without device_ids wraps a model moved with .cuda()/.to('cuda') on line "
                f"{placed[1]}, with no set_device before it: that is the current device, GPU 0 in every process, so "
                "all ranks of a node put their replica on GPU 0 (OOM, or NCCL's 'Duplicate GPU detected')",
                evidence={"moved_on": placed[1]},
            )
        )
    return hits


def accumulation_without_no_sync(ctx: Context) -> list[Hit]:
    """GD760: a backward every iteration, an optimizer step every k-th, no no_sync (info)."""
    src, program = ctx.src, ctx.program
    if not (program.ddp or program.accelerate):
        return []
    hits = []
    for loop in src.nodes:
        if not isinstance(loop, _LOOPS):
            continue
        backward = next((c for c in _every_iteration_calls(loop.body) if _is_backward(c)), None)
        if backward is None or not any(_accumulation_step(stmt) for stmt in loop.body):
            continue
        func = src.function_of(loop)
        scope: ast.AST = func if isinstance(func, FUNCTION_TYPES) else src.tree
        if _controls_sync(src, scope) or "engine" in (text(backward.func) or ""):
            continue  # no_sync, accelerator.accumulate, or a DeepSpeed engine (it accumulates itself)
        hits.append(
            Hit(
                "grad-accum-no-sync",
                backward.lineno,
                "backward runs every iteration but the optimizer steps only every k-th, with no no_sync(): DDP "
                "all-reduces the gradients of every micro-batch, k times per step instead of once",
            )
        )
    return hits


def _every_iteration_calls(body: list[ast.stmt]) -> list[ast.Call]:
    """Calls of the loop body's own statements (and `with` blocks), not those under an `if`."""
    out = []
    for stmt in body:
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            out += _every_iteration_calls(stmt.body)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            out.append(stmt.value)
    return out


def _is_backward(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "backward"


def _accumulation_step(stmt: ast.stmt) -> bool:
    """`if (i + 1) % k == 0: optimizer.step()` (or a test naming an accumulation count)."""
    if not isinstance(stmt, ast.If):
        return False
    test_nodes = list(ast.walk(stmt.test))
    every_k = any(
        isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and constant(n.right) != 1 for n in test_nodes
    ) or any(_ACCUMULATION.search(last_name(n) or "") for n in test_nodes if isinstance(n, (ast.Name, ast.Attribute)))
    if not every_k:
        return False
    for node in (n for s in stmt.body for n in ast.walk(s)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step":
            owner = last_name(node.func.value) or ""
            if _STEPPER.search(owner) and "sched" not in owner.lower():
                return True
    return False


def _controls_sync(src: Source, scope: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr in _SYNC_CONTROLS
        for n in (src.walk(scope) if scope is not src.tree else src.nodes)
    )


def clip_before_unscale(ctx: Context) -> list[Hit]:
    """GD761: scaler.scale(loss).backward(), a clip, scaler.step(), with no unscale_ before the clip."""
    src = ctx.src
    hits = []
    for call in src.calls:
        if not (_is_backward(call) and isinstance(call.func, ast.Attribute)):
            continue
        scaled = call.func.value
        if not (
            isinstance(scaled, ast.Call) and isinstance(scaled.func, ast.Attribute) and scaled.func.attr == "scale"
        ):
            continue
        scaler = text(scaled.func.value)
        if scaler is None or _disabled(src, scaler, scaled):
            continue
        unscaled, clip = False, None
        for later in _calls_after(src, call):
            attr = later.func.attr if isinstance(later.func, ast.Attribute) else None
            if attr == "unscale_":
                unscaled = True
            elif clip is None and not unscaled and _is_clip(src, later):
                clip = later
            elif attr == "step" and text(later.func.value) == scaler:  # type: ignore[union-attr]
                if clip is None:
                    break  # stepped with no clip before it: this backward is done
                hits.append(
                    Hit(
                        "clip-before-unscale",
                        clip.lineno,
                        f"gradients are clipped while still multiplied by the loss scale ({scaler}.scale(loss)"
                        f".backward() on line {call.lineno}, no {scaler}.unscale_ before the clip): their norm is "
                        "about scale (65536 at the start) times too large, so the clip fires on every step and "
                        "shrinks the update by that factor",
                        evidence={"backward_line": call.lineno, "step_line": later.lineno},
                    )
                )
                break
    return hits


def _disabled(src: Source, scaler: str, at: ast.AST) -> bool:
    """`GradScaler(enabled=False)`: a scaler that does not scale."""
    values = src.values(scaler, src.scope.get(at))
    return bool(values) and all(
        isinstance(v, ast.Call) and constant(keyword(v, "enabled")) is False for v in values if v is not None
    )


def _is_clip(src: Source, call: ast.Call) -> bool:
    if src.names.call(call) == "clip":
        return True
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr in _CLIPS and "accelerator" not in (text(func.value) or "")


def _calls_after(src: Source, call: ast.Call) -> Iterator[ast.Call]:
    """The calls after `call`'s statement on its straight-line path, in order: the rest of its
    block, then of each enclosing block (never the other branch of an `if`), up to its loop or
    function. Lazily: the caller stops at the scaler's step."""
    child: ast.AST | None = src.statement(call)
    while child is not None:
        held = src.block_of(child)
        parent = src.parent.get(child)
        if held is not None:
            block, index = held
            for stmt in block[index + 1 :]:
                yield from sorted(
                    (n for n in src.walk(stmt) if isinstance(n, ast.Call)), key=lambda c: (c.lineno, c.col_offset)
                )
        if parent is None or isinstance(parent, (*FUNCTION_TYPES, ast.Lambda, ast.Module, *_LOOPS)):
            return
        child = parent


def data_parallel(ctx: Context) -> list[Hit]:
    """GD762: nn.DataParallel as the multi-GPU strategy (info)."""
    if ctx.program.ddp:
        return []  # the file builds DDP too: DataParallel is a fallback its flags choose
    hits = []
    for call in ctx.src.by_api.get("data_parallel", []):
        ids = keyword(call, "device_ids")
        if isinstance(ids, (ast.List, ast.Tuple)) and len(ids.elts) == 1:
            continue  # one GPU: no multi-GPU training to speed up
        hits.append(
            Hit(
                "data-parallel",
                call.lineno,
                "nn.DataParallel trains on several GPUs from one process: it replicates the model every iteration, "
                "gathers outputs on GPU 0 and is bound by the GIL; DistributedDataParallel is faster even on one node",
            )
        )
    return hits


def batchnorm_without_sync(ctx: Context) -> list[Hit]:
    """GD763: BatchNorm in the model classes of a DDP program with a small per-GPU batch (info)."""
    program = ctx.program
    if not program.ddp or program.sync_bn or not program.batch_sizes or max(program.batch_sizes) > SMALL_BATCH:
        return []
    layers = [c for c in ctx.src.by_api.get("batch_norm", []) if ctx.src.parent_of_type(c, ast.ClassDef)]
    if not layers:
        return []
    batch = max(program.batch_sizes)
    others = tuple(sorted({c.lineno for c in layers[1:]} - {layers[0].lineno}))
    return [
        Hit(
            BATCHNORM_SYNC.name,
            layers[0].lineno,
            f"BatchNorm under DDP normalises each GPU's batch of {batch} on its own (no SyncBatchNorm): with so few "
            "samples per GPU its statistics are noisy and training drifts from the single-GPU recipe",
            related=others,
            evidence={"per_gpu_batch": batch, "threshold": SMALL_BATCH},
        )
    ]
