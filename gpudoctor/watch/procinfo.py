"""Who is behind a GPU process: user, CPU%, RSS and command line, via psutil.

NVML reports host PIDs. Inside a container with its own PID namespace those PIDs do not
exist (or are other processes), so a PID we cannot see is explained, not dropped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil

from gpudoctor.probe.sampler import GpuProcess
from gpudoctor.watch.model import ProcReading

MIB = 1024 * 1024


def in_container() -> bool:
    return os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv") or "container" in os.environ


class ProcessResolver:
    """Keeps psutil.Process objects between calls, so CPU% is measured over the interval."""

    def __init__(self) -> None:
        self._cache: dict[int, psutil.Process] = {}
        self._container = in_container()

    def _not_visible(self) -> str:
        if self._container:
            return "PID not visible here: NVML reports host PIDs; run the container with --pid=host"
        return "process exited"

    def resolve(self, procs: Iterable[GpuProcess]) -> tuple[ProcReading, ...]:
        out = []
        alive = set()
        for p in procs:
            proc = self._cache.get(p.pid)
            try:
                if proc is None:
                    proc = psutil.Process(p.pid)
                    proc.cpu_percent(None)  # first call only starts the measurement
                    self._cache[p.pid] = proc
                    cpu = None
                else:
                    cpu = round(proc.cpu_percent(None), 1)
                alive.add(p.pid)
                with proc.oneshot():
                    user = _safe(proc.username)
                    rss = proc.memory_info().rss // MIB
                    cmd = " ".join(_safe(proc.cmdline, [])) or _safe(proc.name)
                out.append(ProcReading(p.pid, p.gpu, p.gpu_mem, user, cpu, rss, cmd))
            except psutil.NoSuchProcess:
                out.append(ProcReading(p.pid, p.gpu, p.gpu_mem, note=self._not_visible()))
            except psutil.AccessDenied:
                out.append(ProcReading(p.pid, p.gpu, p.gpu_mem, note="no permission to read this process"))
        for pid in list(self._cache):
            if pid not in alive:
                del self._cache[pid]
        return tuple(out)


def _safe(fn, default=""):  # type: ignore[no-untyped-def]
    try:
        return fn()
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return default
