"""The processes of a job `watch` follows: who started whom, when, and the few variables of their
environment that say which rank each is (read from /proc through psutil, our own user's processes).

A process's environment is someone's secrets as much as its rank: only the names in ENV_KEEP are kept,
the rest is dropped as it is read. Nothing here is written anywhere; the tracker keeps the numbers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import psutil

# The variables that say what a process is in a distributed job (torchrun and torch.distributed set or
# read them), and torch's flight recorder switches (ProcessGroupNCCL).
ENV_KEEP = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "TORCHELASTIC_RUN_ID",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
    }
)


@dataclass(frozen=True)
class ProcFacts:
    pid: int
    ppid: int
    started: float  # epoch s
    argv: tuple[str, ...]  # to tell torchrun's agent (kept in memory only, never recorded)
    env: dict[str, str] = field(default_factory=dict)  # ENV_KEEP only

    def number(self, name: str) -> int | None:
        value = self.env.get(name, "")
        return int(value) if value.isdigit() else None


def facts(pid: int) -> ProcFacts | None:
    """What the job's process `pid` is, or None once it has gone (or is not ours to read)."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            ppid, started = p.ppid(), p.create_time()
            argv: tuple[str, ...] = ()
            env: dict[str, str] = {}
            with contextlib.suppress(psutil.AccessDenied, psutil.ZombieProcess):
                argv = tuple(p.cmdline())
            with contextlib.suppress(psutil.AccessDenied, psutil.ZombieProcess, OSError):
                env = {k: v for k, v in p.environ().items() if k in ENV_KEEP}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return ProcFacts(pid, ppid, started, argv, env)


def alive(pid: int, started: float) -> bool:
    """Whether the process that started at `started` still runs as `pid` (not a reused number)."""
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - started) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
