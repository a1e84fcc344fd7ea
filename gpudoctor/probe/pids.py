"""Which local process an NVML PID is, across PID namespaces (tests/reference/nvml_pids.md).

NVIDIA said for years that its driver reports host PIDs, also to a container (nvidia-docker #179,
#1483). That changed in the open kernel modules' resource manager: since 535.113.01 the process list
is converted into the caller's PID namespace (`pid_vnr`), and processes the caller cannot see are
dropped; since 565.57.01 the per-PID memory lookup matches the same way; since 570.86.15 the process
utilization samples too (open-gpu-kernel-modules, gpu_rmapi.c `_gpuConvertPid`, kern_perf_ctrl.c).
Older drivers, and a sandbox whose GPU proxy asks the host driver for it (gVisor), still hand out
PIDs from another namespace, where the same number may name an unrelated local process.

So, in this order:
- in the initial PID namespace, NVML's PIDs are ours;
- in a nested one, a PID is ours when the driver converts (an open kernel module of 535.113.01 or
  later, from /proc/driver/nvidia/version) or when the local process of that number holds a
  /dev/nvidia* device open (a check that needs no driver knowledge, readable for our own user);
- else, with a procfs of the host visible (`docker run -v /proc:/host/proc`), the host PID's NSpid
  line names its PID in each namespace below the host's (proc(5)); its last entry is ours when the
  local process of that number started at the same time;
- else it is left unresolved: never pinned on whatever local process has the same number.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.probe.driver import kernel_module_version
from gpudoctor.probe.files import read_text
from gpudoctor.snapshot import Missing

CONVERTING_DRIVER = (535, 113, 1)  # open-gpu-kernel-modules f59818b75: os_find_ns_pid
# Where containers mount the host's procfs (all-smi's container_utils.rs looks in the same places).
HOST_PROCFS = ("host/proc", "hostproc", "proc_host")
_OPEN_MODULE = "Open Kernel Module"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def driver_converts_pids(root: Path) -> bool:
    """An open kernel module that converts PIDs into the caller's namespace (535.113.01+)."""
    banner = read_text(root, "/proc/driver/nvidia/version")
    version = kernel_module_version(root)
    if isinstance(banner, Missing) or isinstance(version, Missing) or _OPEN_MODULE not in banner:
        return False
    return _version(version) >= CONVERTING_DRIVER


def _start_ticks(proc: Path) -> int | None:
    """Field 22 of /proc/PID/stat, the start time in clock ticks since boot (proc(5)); the command
    name (field 2) may hold spaces and parentheses, so count from its closing one."""
    try:
        stat = (proc / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def holds_gpu(proc: Path) -> bool:
    """The process has a /dev/nvidia* device open (only readable for our own processes, or as root)."""
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd).startswith("/dev/nvidia"):
                return True
        except OSError:
            continue
    return False


@dataclass(frozen=True)
class PidView:
    """How NVML's PIDs relate to our namespace, decided once per probe or sampler."""

    isolated: bool | Missing  # in a nested PID namespace (probe.host.pid_namespace_isolated)
    converts: bool  # the driver gives PIDs of our namespace (open module 535.113.01+)
    host_proc: Path | None  # a procfs of the host, when one is mounted here

    def local(self, pid: int, root: Path) -> int | None:
        """Our PID of the process NVML calls `pid`, or None when it cannot be told."""
        proc = root / "proc"
        if self.isolated is not True:
            return pid
        if (proc / str(pid)).is_dir() and (self.converts or holds_gpu(proc / str(pid))):
            return pid
        if self.host_proc is not None:
            return self._through_host(pid, proc)
        return None

    def _through_host(self, pid: int, proc: Path) -> int | None:
        assert self.host_proc is not None
        status = read_text(self.host_proc, f"{pid}/status")
        if isinstance(status, Missing):
            return None
        line = next((ln for ln in status.splitlines() if ln.startswith("NSpid:")), "")
        chain = line.split()[1:]
        if len(chain) < 2 or not chain[-1].isdigit():
            return None  # the process is in the host's namespace: no PID of ours
        inner = int(chain[-1])
        started = _start_ticks(self.host_proc / str(pid))
        if started is None or started != _start_ticks(proc / str(inner)):
            return None  # same number, another process (another container's)
        return inner

    @property
    def note(self) -> str:
        """What an unresolved PID means here, for a user."""
        return (
            "PID from another PID namespace (drivers before 535.113.01 report host PIDs): "
            "run the container with --pid=host, or mount the host's /proc at /host/proc"
        )


# PIDs already of our namespace (a job's process tree read from our /proc), taken as they are.
OWN_PIDS = PidView(isolated=False, converts=True, host_proc=None)


def pid_view(root: Path, isolated: bool | Missing) -> PidView:
    host = next((root / p for p in HOST_PROCFS if (root / p / "1" / "status").is_file()), None)
    return PidView(isolated, isolated is True and driver_converts_pids(root), host)
