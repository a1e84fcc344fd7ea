"""What a name in a script means: its imports resolved to dotted names, and the torch APIs the
rules look for, by one canonical key each.

`import torch.distributed as dist` makes `dist.init_process_group` mean
`torch.distributed.init_process_group`; `from torch.nn.parallel import DistributedDataParallel as
DDP` makes `DDP(...)` a DDP construction. Code copied from tutorials often omits its imports: a
name bound nowhere in the file falls back to the usual aliases (`torch`, `nn`, `dist`, `mp`, `F`,
`os`) and, for a few distinctive names (`DistributedSampler`, `DDP`, ...), to its last component.
A name the file binds to something else (a user class called `DDP`) is never taken for the API.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

# Canonical key -> the dotted names that mean it (torch has moved some over the years).
API: dict[str, tuple[str, ...]] = {
    "ddp": (
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    ),
    "fsdp": (
        "torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard",
    ),
    "data_parallel": (
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
    ),
    "dist_sampler": ("torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"),
    "dataloader": ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"),
    "spawn": (
        "torch.multiprocessing.spawn",
        "torch.multiprocessing.start_processes",
        "torch.multiprocessing.spawn.spawn",
        "torch.multiprocessing.spawn.start_processes",
    ),
    "init_process_group": (
        "torch.distributed.init_process_group",
        "torch.distributed.distributed_c10d.init_process_group",
    ),
    "init_device_mesh": ("torch.distributed.device_mesh.init_device_mesh", "torch.distributed.init_device_mesh"),
    "tcp_store": ("torch.distributed.TCPStore",),
    "set_device": (
        "torch.cuda.set_device",
        "torch.accelerator.set_device_index",
        "torch.accelerator.set_device_idx",
        "torch.xpu.set_device",
    ),
    "device_count": ("torch.cuda.device_count", "torch.accelerator.device_count"),
    "get_rank": ("torch.distributed.get_rank",),
    "random_split": ("torch.utils.data.random_split", "torch.utils.data.dataset.random_split"),
    "torch_load": (
        "torch.load",
        "torch.serialization.load",
        "torch.jit.load",
        "torch.hub.load_state_dict_from_url",
    ),
    "torch_save": ("torch.save", "torch.serialization.save"),
    "clip": (
        "torch.nn.utils.clip_grad_norm_",
        "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grads_with_norm_",
        "torch.nn.utils.clip_grad.clip_grad_norm_",
        "torch.nn.utils.clip_grad.clip_grad_value_",
    ),
    "grad_scaler": ("torch.amp.GradScaler", "torch.cuda.amp.GradScaler", "torch.GradScaler"),
    "sync_bn": ("torch.nn.SyncBatchNorm", "torch.nn.SyncBatchNorm.convert_sync_batchnorm"),
    "batch_norm": ("torch.nn.BatchNorm1d", "torch.nn.BatchNorm2d", "torch.nn.BatchNorm3d"),
    "device": ("torch.device",),
    "accelerator": ("accelerate.Accelerator",),
    "lightning_trainer": ("lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer"),
    "manual_seed": ("torch.manual_seed", "torch.random.manual_seed", "torch.cuda.manual_seed_all"),
    "summary_writer": ("torch.utils.tensorboard.SummaryWriter", "tensorboardX.SummaryWriter"),
    "np_save": ("numpy.save", "numpy.savez", "numpy.savez_compressed", "numpy.savetxt"),
    "copyfile": ("shutil.copyfile", "shutil.copy", "shutil.copy2"),
    "bytes_io": ("io.BytesIO", "io.StringIO"),
    "wandb_init": ("wandb.init",),
    "mlflow_run": ("mlflow.start_run",),
}
_BY_DOTTED = {dotted: key for key, names in API.items() for dotted in names}

# Last components that are distinctive enough to trust when the file never binds the name.
_FALLBACK = {
    "DistributedDataParallel": "ddp",
    "DDP": "ddp",
    "FullyShardedDataParallel": "fsdp",
    "FSDP": "fsdp",
    "fully_shard": "fsdp",
    "DistributedSampler": "dist_sampler",
    "DataParallel": "data_parallel",
    "DataLoader": "dataloader",
    "init_process_group": "init_process_group",
    "random_split": "random_split",
    "clip_grad_norm_": "clip",
    "clip_grad_value_": "clip",
    "GradScaler": "grad_scaler",
    "SyncBatchNorm": "sync_bn",
    "convert_sync_batchnorm": "sync_bn",
    "set_seed": "seed_helper",
    "seed_everything": "seed_helper",
}
# Seeding helpers of the usual libraries (and a project's own `set_seed`, by name).
_SEED_LAST = {"set_seed", "seed_everything", "manual_seed"}

# The aliases tutorials use without importing them.
_USUAL = {
    "torch": "torch",
    "nn": "torch.nn",
    "dist": "torch.distributed",
    "mp": "torch.multiprocessing",
    "F": "torch.nn.functional",
    "os": "os",
    "np": "numpy",
    "optim": "torch.optim",
}

# A rank by its name: `rank`, `local_rank`, `self.global_rank`, `ddp_rank`, `gpu_id`, `_rank`, `process_index`.
RANK_NAME = re.compile(r"^_?((\w+_)?rank|gpu(_id)?|device_id|(local_)?process_index)$", re.IGNORECASE)
# Names that carry the rank or the world size (datasets built from them shard themselves).
SHARD_NAME = re.compile(r"rank|world_size|num_replicas|num_shards|shard|process_index|num_processes", re.I)


class Names:
    """The file's imports and bindings, and what a name or call resolves to."""

    def __init__(self, nodes: Iterable[ast.AST]) -> None:
        self.aliases: dict[str, str] = {}
        self.bound: set[str] = set()
        self._keys: dict[ast.AST, str | None] = {}
        for node in nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.ImportFrom):  # a relative import: the project's own names
                for a in node.names:
                    self.bound.add(a.asname or a.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.bound.add(node.id)
            elif isinstance(node, ast.arg):
                self.bound.add(node.arg)

    def dotted(self, expr: ast.AST) -> str | None:
        """`dist.init_process_group` -> "torch.distributed.init_process_group"; None for what is
        not a plain name or attribute chain (a call's result, a subscript)."""
        chain = text(expr)
        if chain is None:
            return None
        root, dot, rest = chain.partition(".")
        if root in self.aliases:
            root = self.aliases[root]
        elif root not in self.bound and root in _USUAL:
            root = _USUAL[root]
        return root + dot + rest

    def unbound_root(self, expr: ast.AST) -> bool:
        while isinstance(expr, ast.Attribute):
            expr = expr.value
        return isinstance(expr, ast.Name) and expr.id not in self.aliases and expr.id not in self.bound

    def api(self, func: ast.AST) -> str | None:
        """The canonical key of what `func` names (API's keys, or "seed_helper"), or None."""
        dotted = self.dotted(func)
        if dotted is None:
            return None
        key = _BY_DOTTED.get(dotted)
        if key is not None:
            return key
        last = dotted.rsplit(".", 1)[-1]
        if self.unbound_root(func):  # a fragment that never imports it
            return _FALLBACK.get(last)
        if last in _SEED_LAST and isinstance(func, (ast.Name, ast.Attribute)):
            root = dotted.split(".")[0]
            if root in ("transformers", "accelerate", "lightning", "pytorch_lightning") or (
                isinstance(func, ast.Name) and func.id in self.aliases  # `from utils import set_seed`
            ):
                return "seed_helper"
        return None

    def call(self, node: ast.AST) -> str | None:
        """The canonical key of the API a call calls (remembered: the rules ask often)."""
        if not isinstance(node, ast.Call):
            return None
        if node not in self._keys:
            self._keys[node] = self.api(node.func)
        return self._keys[node]


def last_name(expr: ast.AST) -> str | None:
    """The last component of a name or attribute chain: `self.local_rank` -> "local_rank"."""
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    return None


def text(expr: ast.AST) -> str | None:
    """`self.model` -> "self.model"; None for anything but a name or attribute chain."""
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    return ".".join([expr.id, *reversed(parts)])


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def has_splat(call: ast.Call) -> bool:
    """`f(**kwargs)` or `f(*args)`: what the call passes is not visible."""
    return any(kw.arg is None for kw in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args)


def argument(call: ast.Call, index: int, name: str) -> ast.expr | None:
    """The argument given by keyword `name` or at position `index` (None: not given)."""
    value = keyword(call, name)
    if value is not None:
        return value
    if index < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
        return call.args[index]
    return None


def constant(expr: ast.AST | None) -> object:
    """A literal's value (str(12355) and an f-string without placeholders count); `...` for none."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in expr.values):
        return "".join(str(v.value) for v in expr.values if isinstance(v, ast.Constant))
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id in ("str", "int")
        and len(expr.args) == 1
        and not expr.keywords
    ):
        return constant(expr.args[0])
    return ...
