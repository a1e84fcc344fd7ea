"""What `watch` knows of each process of a followed job: the model of the job's life (arrival, joining,
where a rank is in its steps, how it ended), as one sample records it.

Two sources meet here. The step API's event records (`gpudoctor.training_step.EVENT`, decoded into
`Heard`): a process says that it joined its process group, and, when a state held for a beat, whether it
is inside step N+1 or outside after step N, and where it was when it exited. And the process tree
(gpudoctor/watch/tracker.py): which processes are alive, which one is torchrun's agent, the rank each was
given in its environment. A `JobProc` is one process in one sample, written to a recording (`job` in
docs/watch.md) and read back strictly like the rest of a sample (gpudoctor/watch/model.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields, replace
from typing import Any

from gpudoctor.knowledge import torch_stacks
from gpudoctor.safety.safe_text import needs_cleaning, printable
from gpudoctor.training_step import (
    CHILD,
    ENTRY_KNOWN,
    EVENT,
    EVENT_MAGIC,
    EXITING,
    FAILED,
    INSIDE,
    JOINED,
)

# Roles of a process in the job.
LAUNCHER = "launcher"  # torchrun's elastic agent: starts the ranks after its rendezvous
RANK = "rank"  # a rank: RANK in its environment (the top process of it), or a process that joined a group
CHILD_RANK = "child"  # a process under a rank that joined a process group of its own (mp.spawn under torchrun)
ROLES = (LAUNCHER, RANK, CHILD_RANK)

WHERE = torch_stacks.KINDS  # what a stack shows a process doing

EXITS = ("", "normal", "exception")  # how a process said it ended ("": it did not say)
MAX_FRAMES = 12  # innermost frames kept from a stack: where it is, not the whole story
MAX_STEP = 2**63  # the record's step is an unsigned 64-bit number; more is a damaged record
MAX_ENDED = 256  # ended processes remembered, how they ended (the latest; a heuristic bound): tracker and step channel


@dataclass(frozen=True)
class Heard:
    """One event record, as the watcher received it (the PID is the kernel's, never the record's)."""

    pid: int
    rank: int | None  # as the process knows it (RANK, SLURM_PROCID, LOCAL_RANK)
    dist_rank: int | None  # torch.distributed's, once joined
    dist_world: int | None
    joined: bool
    inside: bool | None  # None: plain step() calls, which do not say when a step starts
    step: int  # the last step it finished
    since: float  # when this state began (epoch s)
    child: bool  # a multiprocessing child
    exiting: bool = False  # sent as it exited
    failed: bool = False  # ...with an uncaught exception
    at: float = 0.0  # when it arrived (epoch s, the watcher's clock)


def heard(pid: int, data: bytes) -> Heard | None:
    """An event record decoded, or None if it is damaged (wrong magic, impossible numbers)."""
    if len(data) != EVENT.size:
        return None
    magic, _, rank, dist_rank, dist_world, flags, step, since = EVENT.unpack(data)
    if magic != EVENT_MAGIC or not math.isfinite(since) or since < 0 or step >= MAX_STEP:
        return None
    if dist_world == 0 or dist_rank >= max(dist_world, 0) or dist_rank < -1 or dist_world < -1:
        return None
    joined = bool(flags & JOINED) and dist_rank >= 0
    return Heard(
        pid=pid,
        rank=rank if rank >= 0 else None,
        dist_rank=dist_rank if joined else None,
        dist_world=dist_world if joined else None,
        joined=joined,
        inside=bool(flags & INSIDE) if flags & ENTRY_KNOWN else None,
        step=step,
        since=since,
        child=bool(flags & CHILD),
        exiting=bool(flags & EXITING),
        failed=bool(flags & FAILED),
        at=time.time(),
    )


@dataclass(frozen=True)
class JobProc:
    """One process of the followed job in one sample: torchrun's agent, a rank, or a process under a rank
    that runs a rank of its own. None is "not known" throughout."""

    pid: int
    role: str  # LAUNCHER, RANK or CHILD_RANK
    started: float  # its start time (epoch s)
    rank: int | None = None  # the rank it was given (RANK), or torch.distributed's once joined
    local_rank: int | None = None
    world: int | None = None  # WORLD_SIZE it was given; a launcher: the ranks it will start when fixed
    parent: int | None = None  # a CHILD_RANK: the rank process it runs under
    nodes: str = ""  # a launcher: --nnodes as given ("2", "1:4")
    joined: bool | None = None  # joined its process group; None: it never said (no gpudoctor in it yet)
    dist_rank: int | None = None  # torch.distributed's rank and world size once joined
    dist_world: int | None = None
    step: int | None = None  # the last step it finished
    inside: bool | None = None  # inside step `step`+1 (True) or outside after `step` (False); None: unknown
    since: float | None = None  # when that state began (epoch s)
    ended: float | None = None  # when it was first seen gone
    exit: str = ""  # how it ended, as it said at exit: "normal" or "exception"; "" when it did not say
    where: str = ""  # what its stack shows (WHERE), "" without a stack
    stack: tuple[str, ...] = ()  # its main thread's innermost frames, "function (file:line)"
    at: str = ""  # the innermost frame of the user's own code in it (the line that waits or works)
    stack_note: str = ""  # why there is no stack (py-spy missing, not allowed to trace it)
    trace_buffer: int | None = None  # TORCH_NCCL_TRACE_BUFFER_SIZE it was given (torch's flight recorder)

    def __post_init__(self) -> None:
        for name in ("nodes", "stack_note", "at"):
            value = getattr(self, name)
            if needs_cleaning(value):
                object.__setattr__(self, name, printable(value))
        if any(needs_cleaning(f) for f in self.stack):
            object.__setattr__(self, "stack", tuple(printable(f) for f in self.stack))

    @property
    def label(self) -> str:
        if self.role == LAUNCHER:
            return f"torchrun (PID {self.pid})"
        if self.role == CHILD_RANK:
            return f"PID {self.pid} under PID {self.parent}"
        return f"rank {self.rank}" if self.rank is not None else f"PID {self.pid}"

    @property
    def alive(self) -> bool:
        return self.ended is None

    @property
    def reached(self) -> int:
        """The furthest step it got to: the step it is inside, else the last it finished (0: none)."""
        return (self.step or 0) + (1 if self.inside else 0)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == "" or value == ():
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def parse(cls, data: Any, dropped: list[str]) -> JobProc:
        """A recorded process: a wrong shape raises ValueError (the sample is damaged)."""
        if not isinstance(data, dict):
            raise ValueError(f"a job process is not an object: {str(data)[:40]}")
        known = {f.name: f for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        pid = kwargs.get("pid")
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**32:
            raise ValueError(f"a job process's PID is not a PID: {str(pid)[:40]}")
        if kwargs.get("role") not in ROLES:
            raise ValueError(f"PID {pid}: unknown role {str(kwargs.get('role'))[:40]!r}")
        for name in ("started", "since", "ended"):
            value = kwargs.get(name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
            ):
                raise ValueError(f"PID {pid}: {name} is not a time")
        if "started" not in kwargs:
            raise ValueError(f"PID {pid}: no start time")
        for name in ("rank", "local_rank", "world", "parent", "dist_rank", "dist_world", "step", "trace_buffer"):
            value = kwargs.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                dropped.append(f"PID {pid} {name} {str(value)[:20]}")
                kwargs[name] = None
        for name in ("joined", "inside"):
            if kwargs.get(name) is not None and not isinstance(kwargs[name], bool):
                raise ValueError(f"PID {pid}: {name} is not true or false")
        for name in ("nodes", "exit", "where", "stack_note", "at"):
            if not isinstance(kwargs.get(name, ""), str):
                raise ValueError(f"PID {pid}: {name} is not text")
        if kwargs.get("exit", "") not in EXITS:
            dropped.append(f"PID {pid} exit {kwargs['exit'][:20]!r}")
            kwargs["exit"] = ""
        if kwargs.get("where", "") not in ("", *WHERE):
            dropped.append(f"PID {pid} where {kwargs['where'][:20]!r}")
            kwargs["where"] = ""
        stack = kwargs.get("stack", [])
        if not isinstance(stack, list) or not all(isinstance(f, str) for f in stack):
            raise ValueError(f"PID {pid}: stack is not a list of frames")
        kwargs["stack"] = tuple(stack[:MAX_FRAMES])
        return cls(**kwargs)


def merged(proc: JobProc, said: Heard | None, before: JobProc | None = None, placed: bool = True) -> JobProc:
    """`proc` with what the process itself said, and what it said before (`before`, its last listing):
    joined stays joined (an exit after destroy_process_group does not undo it), and not joined stays known
    (a rank stopped while it waited to join has not become silent). `placed`: what it said of its place in
    its steps still holds (not when its steps have moved on since)."""
    if before is not None and before.joined:
        proc = replace(proc, joined=True, dist_rank=before.dist_rank, dist_world=before.dist_world)
    elif before is not None and before.joined is False and proc.joined is None:
        proc = replace(proc, joined=False)
    if said is None:
        return proc
    joined = True if said.joined or proc.joined else (proc.joined if said.exiting else False)
    exit_ = ("exception" if said.failed else "normal") if said.exiting else proc.exit
    rank = proc.rank if proc.rank is not None else (said.dist_rank if said.joined else said.rank)
    return replace(
        proc,
        rank=rank,
        joined=joined,
        dist_rank=said.dist_rank if said.joined else proc.dist_rank,
        dist_world=said.dist_world if said.joined else proc.dist_world,
        step=max(proc.step or 0, said.step) or None,
        inside=said.inside if placed else None,
        since=said.since if placed else None,
        exit=exit_,
    )
