"""What the rules read about a script: its facts (is it distributed, how is it launched, does it
call set_epoch, ...), merged over the files of one program, and the analyses of the file.

Files linted together form programs: an entry script (a file no other linted file imports) and
every linted file it imports, directly or not. A fact that one file of a program shows holds for
each of them: `set_epoch` called in trainer.py satisfies the DistributedSampler built in data.py.
Two scripts that only share a helper module are not one program (single_gpu.py and multigpu.py
of the DDP tutorial series both import datautils.py).

Launchers (--launcher): "torchrun" and "spawn" say how the script is run; "auto" infers it. A
torchrun signal is a read of LOCAL_RANK, RANK, WORLD_SIZE, LOCAL_WORLD_SIZE or TORCHELASTIC_*, an
argparse `--local-rank`, or `init_process_group` with neither rank nor world_size in a file that
spawns nothing (torchrun's env:// rendezvous).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gpudoctor.lint.flow import Flow
from gpudoctor.lint.guards import Guards
from gpudoctor.lint.loaders import training_batch_sizes
from gpudoctor.lint.names import constant, keyword
from gpudoctor.lint.ranks import Ranks, env_key
from gpudoctor.lint.source import Source

TORCHRUN, SPAWN, AUTO = "torchrun", "spawn", "auto"
LAUNCHERS = (TORCHRUN, SPAWN, AUTO)
_TORCHRUN_ENV = {"LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}
_DISTRIBUTED_APIS = ("init_process_group", "ddp", "dist_sampler", "init_device_mesh", "fsdp", "accelerator")


@dataclass(frozen=True)
class Hit:
    """One finding of a rule, before it is a Finding: the rule's name, the line, what is wrong."""

    rule: str
    line: int
    message: str
    severity: str | None = None  # None: the rule's usual severity
    hint: str | None = None  # None: the rule's hint
    related: tuple[int, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Facts:
    """Facts of one file, or of a program (merged with `|`)."""

    distributed: bool = False
    process_group: bool = False  # init_process_group, DDP or FSDP: the ranks train one model together
    accelerate: bool = False
    lightning: bool = False  # a Lightning Trainer that may run several processes (devices not 1, not CPU)
    torchrun: str = ""  # what shows torchrun runs it ("reads LOCAL_RANK (line 14)"), "" for nothing
    spawns: bool = False
    ddp: bool = False
    set_epoch: bool = False
    sync_bn: bool = False
    batch_sizes: tuple[int, ...] = ()  # per-GPU batch sizes of training loaders, where literal

    def __or__(self, other: Facts) -> Facts:
        return Facts(
            self.distributed or other.distributed,
            self.process_group or other.process_group,
            self.accelerate or other.accelerate,
            self.lightning or other.lightning,
            self.torchrun or other.torchrun,
            self.spawns or other.spawns,
            self.ddp or other.ddp,
            self.set_epoch or other.set_epoch,
            self.sync_bn or other.sync_bn,
            self.batch_sizes + other.batch_sizes,
        )

    @property
    def raw(self) -> bool:
        """Distributed by hand (not through accelerate, which shards, places and saves for it)."""
        return self.distributed and not self.accelerate


def file_facts(src: Source) -> Facts:
    facts = Facts()
    facts.accelerate = bool(src.by_api.get("accelerator"))
    facts.lightning = any(_several_devices(call) for call in src.by_api.get("lightning_trainer", []))
    facts.spawns = bool(src.by_api.get("spawn"))
    facts.ddp = bool(src.by_api.get("ddp"))
    facts.distributed = any(src.by_api.get(k) for k in _DISTRIBUTED_APIS)
    facts.process_group = any(src.by_api.get(k) for k in ("init_process_group", "ddp", "fsdp"))
    facts.sync_bn = bool(src.by_api.get("sync_bn"))
    reads: list[tuple[int, str]] = []
    for node in src.nodes:
        if isinstance(node, ast.Attribute) and node.attr in ("set_epoch", "convert_sync_batchnorm", "SyncBatchNorm"):
            facts.set_epoch |= node.attr == "set_epoch"
            facts.sync_bn |= node.attr != "set_epoch"
        elif isinstance(node, ast.Constant) and node.value == "set_epoch":
            facts.set_epoch = True  # getattr(sampler, "set_epoch"), hasattr(...)
        elif isinstance(node, (ast.Subscript, ast.Call)):
            key = env_key(node)
            if key in _TORCHRUN_ENV or (key or "").startswith("TORCHELASTIC_"):
                reads.append((node.lineno, key or ""))
    if reads:
        facts.distributed = True
        line, key = min(reads)
        facts.torchrun = f"reads {key} (line {line})"
    if not facts.torchrun:
        facts.torchrun = _torchrun_argparse(src) or _env_init(src, facts.spawns)
    facts.batch_sizes = training_batch_sizes(src)
    return facts


def _several_devices(trainer: ast.Call) -> bool:
    """A Lightning Trainer not pinned to one device or the CPU: its default ("auto") runs DDP on
    every GPU of the machine, and calls a DataModule's setup() on every rank."""
    if constant(keyword(trainer, "accelerator")) == "cpu":
        return False
    return not any(constant(keyword(trainer, name)) in (1, "1") for name in ("devices", "gpus"))


def _torchrun_argparse(src: Source) -> str:
    for call in src.calls:
        if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
            if any(constant(a) in ("--local-rank", "--local_rank") for a in call.args):
                return f"takes --local-rank (line {call.lineno})"
    return ""


def _env_init(src: Source, spawns: bool) -> str:
    if spawns:
        return ""
    for call in src.by_api.get("init_process_group", []):
        named = {kw.arg for kw in call.keywords}
        if not ({"rank", "world_size", "store", None} & named) and len(call.args) <= 2:
            method = constant(keyword(call, "init_method") or (call.args[1] if len(call.args) > 1 else None))
            if method in (..., "env://"):
                return f"init_process_group without rank or world_size (line {call.lineno})"
    return ""


@dataclass
class Context:
    """One file with its analyses, the facts of its program and the launcher asked for."""

    src: Source
    own: Facts
    program: Facts
    launcher: str = AUTO

    @cached_property
    def guards(self) -> Guards:
        return Guards(self.src)

    @cached_property
    def flow(self) -> Flow:
        return Flow(self.src)

    @cached_property
    def ranks(self) -> Ranks:
        return Ranks(self.src)

    @property
    def torchrun(self) -> str:
        """Why the script counts as run by torchrun ("" when it does not)."""
        if self.launcher == TORCHRUN:
            return "--launcher torchrun"
        return "" if self.launcher == SPAWN else self.program.torchrun
