"""The rules of the launch: the rendezvous port (GD750), the world size (GD751), the launcher
(GD752) and the device each rank takes (GD753). Detection logic and the traps each must not fall
into: tests/reference/lint/rules.md, rules 1-4."""

from __future__ import annotations

import ast

from gpudoctor.errors import shown
from gpudoctor.lint.codes import ERROR, WARNING
from gpudoctor.lint.context import SPAWN, TORCHRUN, Context, Hit
from gpudoctor.lint.names import argument, constant, keyword, text
from gpudoctor.lint.ranks import Origin, env_key
from gpudoctor.lint.source import FUNCTION_TYPES, Source, is_main_guard

_TORCHRUN_ENV = {"LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}


def master_port(ctx: Context) -> list[Hit]:
    """GD750: a literal MASTER_PORT (or tcp:// port) written by the script."""
    src = ctx.src
    found: list[tuple[ast.AST, object]] = []
    for node in src.nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if _environ_key(target) == "MASTER_PORT":
                    found.append((node, constant(node.value)))
        elif isinstance(node, ast.Call):
            found.extend((node, value) for value in _port_in_call(src, node))
    hits = []
    for node, value in sorted(found, key=lambda f: f[0].lineno):  # type: ignore[attr-defined]
        if value is ... or value is None or isinstance(value, bool) or _under_port_test(src, node):
            continue
        line = node.lineno  # type: ignore[attr-defined]
        port = shown(str(value))
        why = ctx.torchrun
        if why:
            message = (
                f"MASTER_PORT is set to {port} in a script run by torchrun ({why}): torchrun already hosts the "
                "rendezvous on its own port, so every rank waits on a port nobody listens on and the job hangs "
                "in init_process_group until the timeout"
            )
            hint = "delete the line: torchrun sets MASTER_PORT (choose it with --master-port, or --standalone)"
            hits.append(Hit("master-port-hardcoded", line, message, ERROR, hint, evidence={"port": str(value)}))
        else:
            message = (
                f"MASTER_PORT is hard-coded to {port}: a second job on this host, or a leftover process of the "
                "last one, holding that port makes init_process_group fail with EADDRINUSE"
            )
            hits.append(Hit("master-port-hardcoded", line, message, WARNING, evidence={"port": str(value)}))
    return hits


def _environ_key(target: ast.AST) -> str | None:
    if isinstance(target, ast.Subscript):
        owner = text(target.value)
        if owner is not None and owner.split(".")[-1] == "environ":
            key = constant(target.slice)
            return key if isinstance(key, str) else None
    return None


def _port_in_call(src: Source, call: ast.Call) -> list[object]:
    func = call.func
    owner = text(func.value) if isinstance(func, ast.Attribute) else None
    if isinstance(func, ast.Attribute) and func.attr == "update" and owner and owner.split(".")[-1] == "environ":
        out = [constant(kw.value) for kw in call.keywords if kw.arg == "MASTER_PORT"]
        for arg in call.args:
            if isinstance(arg, ast.Dict):
                out += [constant(v) for k, v in zip(arg.keys, arg.values, strict=True) if constant(k) == "MASTER_PORT"]
        return out
    if isinstance(func, ast.Attribute) and func.attr == "putenv" and len(call.args) == 2:
        return [constant(call.args[1])] if constant(call.args[0]) == "MASTER_PORT" else []
    key = src.names.call(call)
    if key == "init_process_group":
        method = constant(argument(call, 1, "init_method"))
        if isinstance(method, str) and method.startswith("tcp://") and method.rsplit(":", 1)[-1].isdigit():
            return [method.rsplit(":", 1)[-1]]
    if key == "tcp_store":
        port = constant(argument(call, 1, "port"))
        return [port] if isinstance(port, int) else []
    return []


def _under_port_test(src: Source, node: ast.AST) -> bool:
    """Inside `if "MASTER_PORT" not in os.environ:` or `if not os.environ.get("MASTER_PORT"):`."""
    cur = src.parent.get(node)
    while cur is not None:
        if isinstance(cur, (ast.If, ast.IfExp)) and any(
            isinstance(n, ast.Constant) and n.value == "MASTER_PORT" for n in ast.walk(cur.test)
        ):
            return True
        cur = src.parent.get(cur)
    return False


def world_size(ctx: Context) -> list[Hit]:
    """GD751: device_count() taken for the world size."""
    src = ctx.src
    hits = []
    for call in src.by_api.get("spawn", []):
        nprocs = argument(call, 2, "nprocs")
        if nprocs is not None and _product_with_count(src, nprocs, 0):
            hits.append(
                Hit(
                    "world-size-from-device-count",
                    call.lineno,
                    "mp.spawn starts device_count() x nodes processes on this machine: every machine would run the "
                    "whole world's ranks, numbered from 0 on each, on more processes than it has GPUs",
                    hint="nprocs = torch.cuda.device_count() (per node); world_size = nprocs * nnodes; "
                    "rank = node_rank * nprocs + local_index",
                )
            )
    spawned = spawn_targets(src)
    for call in src.calls_to("init_process_group", "dist_sampler"):
        is_init = src.names.call(call) == "init_process_group"
        value = keyword(call, "world_size" if is_init else "num_replicas")
        if value is None or not _is_count(src, value, 0):
            continue
        func = src.function_of(call)
        if not ctx.torchrun and func in spawned:
            continue  # the single-node spawn pattern: one process per local GPU is the world
        where = f"torchrun ({ctx.torchrun})" if ctx.torchrun else "a process that mp.spawn did not start"
        what = "init_process_group(world_size=...)" if is_init else "DistributedSampler(num_replicas=...)"
        hits.append(
            Hit(
                "world-size-from-device-count",
                call.lineno,
                f"{what} is this node's GPU count, in {where}: with more than one node the store waits for ranks "
                "that never come, or the data is split for the wrong number of ranks",
                hint="under torchrun: init_process_group(backend) and int(os.environ['WORLD_SIZE'])",
            )
        )
    return hits


def _is_count(src: Source, expr: ast.AST | None, depth: int) -> bool:
    """`expr` is the value of device_count() itself (through int() and variables, not arithmetic)."""
    if expr is None or depth > 4:
        return False
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "int" and expr.args:
        return _is_count(src, expr.args[0], depth + 1)
    if isinstance(expr, ast.Call):
        return src.names.call(expr) == "device_count"
    return src.every_value("count", expr, lambda v: _is_count(src, v, depth + 1))


def _product_with_count(src: Source, expr: ast.AST | None, depth: int) -> bool:
    if expr is None or depth > 4:
        return False
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        for a, b in ((expr.left, expr.right), (expr.right, expr.left)):
            if _is_count(src, a, depth + 1) and constant(b) != 1:
                return True
        return False
    return src.every_value("product", expr, lambda v: _product_with_count(src, v, depth + 1))


def spawn_targets(src: Source) -> set[ast.AST]:
    """The functions mp.spawn starts, and every in-file function they call."""
    todo = []
    for call in src.by_api.get("spawn", []):
        fn = argument(call, 0, "fn")
        if isinstance(fn, ast.Name):
            target = src.lookup_def(fn.id, src.scope.get(call))
            if isinstance(target, FUNCTION_TYPES):
                todo.append(target)
            else:  # handed through a parameter (the tutorial's run_demo(demo_fn, ...)): its callers' arguments
                param = src.param_index(fn.id, src.scope.get(call))
                if param is not None:
                    for site in src.sites.get(param[0], []):
                        arg = src.site_argument(site, param[0], param[1])
                        found = src.lookup_def(arg.id, src.scope.get(arg)) if isinstance(arg, ast.Name) else None
                        if isinstance(found, FUNCTION_TYPES):
                            todo.append(found)
    seen: set[ast.AST] = set()
    while todo:
        func = todo.pop()
        if func in seen:
            continue
        seen.add(func)
        for node in src.walk(func):
            if isinstance(node, ast.Call):
                target = src.resolve_call(node)
                if target is not None:
                    todo.append(target[0])
    return seen


def spawn_under_torchrun(ctx: Context) -> list[Hit]:
    """GD752: mp.spawn in a script that torchrun runs."""
    src = ctx.src
    if ctx.launcher == SPAWN:
        return []
    hits = []
    spawned = spawn_targets(src)
    for call in src.by_api.get("spawn", []):
        if not _unconditional(src, call):
            continue  # a mode chosen by a flag (imagenet's --multiprocessing-distributed)
        if ctx.launcher == TORCHRUN:
            why = "--launcher torchrun"
        else:
            read = _torchrun_read(src, call, spawned)
            if read is None:
                continue
            why = read
        hits.append(
            Hit(
                "spawn-under-torchrun",
                call.lineno,
                f"mp.spawn starts workers in a script run by torchrun ({why}): torchrun already starts one process "
                "per GPU and each would spawn its own group, N x N processes on N GPUs numbering their ranks "
                "against one store; the job hangs or dies before step 1",
            )
        )
    return hits


def _unconditional(src: Source, node: ast.AST) -> bool:
    """No `if` above `node` in its function, but the `if __name__ == "__main__":` guard."""
    cur = src.parent.get(node)
    while cur is not None and not isinstance(cur, (*FUNCTION_TYPES, ast.Lambda)):
        if isinstance(cur, (ast.If, ast.IfExp, ast.While)) and not is_main_guard(cur):
            return False
        cur = src.parent.get(cur)
    return True


def _torchrun_read(src: Source, spawn: ast.Call, spawned: set[ast.AST]) -> str | None:
    """A read of torchrun's variables in the spawned functions, or unconditional beside the spawn."""
    home = src.function_of(spawn)
    for node in src.nodes:
        if not isinstance(node, (ast.Subscript, ast.Call)):
            continue
        key = env_key(node)
        if key not in _TORCHRUN_ENV:
            continue
        func = src.function_of(node)
        if func in spawned:
            return f"the spawned function reads {key} on line {node.lineno}, which only torchrun sets"
        if func is home and _unconditional(src, node):
            return f"reads {key} on line {node.lineno}"
    return None


def global_rank_device(ctx: Context) -> list[Hit]:
    """GD753: the global rank used as a CUDA device index; one finding per source."""
    src = ctx.src
    by_origin: dict[tuple[int, str], list[tuple[Origin, int]]] = {}
    for call in src.calls:
        for expr in _device_choices(src, call):
            origin = ctx.ranks.origin(expr)
            if origin is not None:
                by_origin.setdefault((origin.line, origin.what), []).append((origin, call.lineno))
    hits = []
    for (line, what), sinks in sorted(by_origin.items()):
        first = min(sinks, key=lambda s: (s[0].reach, s[1]))[1]
        others = sorted({s[1] for s in sinks} - {first})
        also = f" (and on line{'s' if len(others) > 1 else ''} {', '.join(map(str, others))})" if others else ""
        hits.append(
            Hit(
                "global-rank-as-device",
                first,
                f"the global rank ({what}, line {line}) chooses the CUDA device here{also}: on every node after the "
                "first it is at least the GPU count ('CUDA error: invalid device ordinal'); on one node it only "
                "works because the two ranks coincide",
                related=tuple(others),
                evidence={"source_line": line, "source": what},
            )
        )
    return hits


def _device_choices(src: Source, call: ast.Call) -> list[ast.expr]:
    """The expressions that pick a CUDA device in `call`."""
    key = src.names.call(call)
    out: list[ast.expr] = []
    if key == "set_device":
        out.append(argument(call, 0, "device"))  # type: ignore[arg-type]
    elif key == "device":
        first = argument(call, 0, "type")
        if constant(first) == "cuda":
            out.append(argument(call, 1, "index"))  # type: ignore[arg-type]
        out += _formatted(first)
    elif key == "ddp":
        ids = keyword(call, "device_ids")
        out += ids.elts if isinstance(ids, (ast.List, ast.Tuple)) else []
        out.append(keyword(call, "output_device"))  # type: ignore[arg-type]
    elif key == "fsdp":
        out.append(keyword(call, "device_id"))  # type: ignore[arg-type]
    elif key == "torch_load":
        out += _formatted(keyword(call, "map_location"))
    elif isinstance(call.func, ast.Attribute) and call.func.attr in ("to", "cuda") and key is None:
        arg = argument(call, 0, "device")
        out += _formatted(arg) if isinstance(arg, ast.JoinedStr) else [arg]  # type: ignore[list-item]
    return [e for e in out if e is not None and not isinstance(e, ast.Constant)]


def _formatted(expr: ast.AST | None) -> list[ast.expr]:
    """The placeholders of an f-string device name (`f"cuda:{rank}"`)."""
    if not isinstance(expr, ast.JoinedStr):
        return []
    return [v.value for v in expr.values if isinstance(v, ast.FormattedValue)]
