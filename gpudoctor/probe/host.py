"""Host facts: CPUs (and their maker), memory, cgroup limits, /dev/shm, container, IOMMU, limits, network.

Every reader takes the filesystem root (tests point it at a fake tree) and turns what
it cannot read into a Missing with the reason.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import resource
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from gpudoctor.probe import cgroup
from gpudoctor.probe.files import missing_from_oserror, parse_cpulist, read_text
from gpudoctor.probe.kernel_log import xid_events
from gpudoctor.probe.ports import TORCHRUN_DEFAULT_PORT, check_port
from gpudoctor.safety.redact import text as redact_text
from gpudoctor.snapshot import Host, Missing, PortStatus, Virtualization

T = TypeVar("T")

# The inode of the initial PID namespace (PROC_PID_INIT_INO in the kernel): a process
# whose /proc/self/ns/pid points elsewhere runs in a nested namespace (a container).
PROC_PID_INIT_INO = 0xEFFFFFFC
_NS_INODE = re.compile(r"pid:\[(\d+)\]")

IOMMU_KEYS = ("iommu", "intel_iommu", "amd_iommu", "pci")

# Markers of a container in cgroup paths, most specific first.
_CGROUP_MARKERS = (
    ("kubepods", "kubernetes"),
    ("libpod", "podman"),
    ("docker", "docker"),
    ("containerd", "containerd"),
    ("lxc", "lxc"),
)


def guarded(fn: Callable[..., T], *args: Any) -> T | Missing:
    """Run one reader; whatever it raises becomes an `error` Missing, never an escape."""
    try:
        return fn(*args)
    except OSError as exc:
        return missing_from_oserror(exc, getattr(exc, "filename", None) or fn.__name__)
    except Exception as exc:  # noqa: BLE001  (an odd file must not stop the probe)
        return Missing("error", f"{fn.__name__}: {type(exc).__name__}: {exc}")


def cpu_affinity() -> list[int] | Missing:
    if not hasattr(os, "sched_getaffinity"):
        return Missing("unsupported", "no sched_getaffinity on this OS")
    return sorted(os.sched_getaffinity(0))


def numa_cpus(root: Path) -> dict[str, list[int]] | Missing:
    base = root / "sys/devices/system/node"
    if not base.is_dir():
        return Missing("unsupported", "/sys/devices/system/node is not present")
    nodes: dict[str, list[int]] = {}
    for entry in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        nodes[entry.name[4:]] = parse_cpulist((entry / "cpulist").read_text())
    return nodes


def meminfo(root: Path) -> dict[str, int] | Missing:
    content = read_text(root, "/proc/meminfo")
    if isinstance(content, Missing):
        return content
    values = {}
    for line in content.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return values


def _meminfo_field(info: dict[str, int] | Missing, key: str) -> int | Missing:
    if isinstance(info, Missing):
        return info
    return info[key] if key in info else Missing("unsupported", f"/proc/meminfo has no {key}")


def shm_total(root: Path) -> int:
    st = os.statvfs(root / "dev/shm")
    return st.f_blocks * st.f_frsize


def container(root: Path, environ: Mapping[str, str]) -> str | None:
    if "KUBERNETES_SERVICE_HOST" in environ:  # only its presence; the value is not kept
        return "kubernetes"
    if (root / ".dockerenv").exists():
        return "docker"
    if (root / "run/.containerenv").exists():
        return "podman"
    for relative in ("/proc/1/cgroup", "/proc/self/cgroup"):
        content = read_text(root, relative)
        if isinstance(content, str):
            for marker, name in _CGROUP_MARKERS:
                if marker in content:
                    return name
    return None


def pid_namespace_isolated(root: Path) -> bool | Missing:
    try:
        link = os.readlink(root / "proc/self/ns/pid")
    except OSError:
        link = ""
    match = _NS_INODE.search(link)
    if match:
        return int(match.group(1)) != PROC_PID_INIT_INO
    status = read_text(root, "/proc/self/status")
    if isinstance(status, Missing):
        return status
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) > 2  # one PID per namespace level
    return Missing("unsupported", "neither /proc/self/ns/pid nor NSpid is readable")


def cpu_arch() -> str | Missing:
    return platform.machine() or Missing("unsupported", "platform.machine() cannot tell")


# The /proc/cpuinfo keys that name the CPU's maker: x86 prints CPUID's vendor string (which is
# what NCCL reads, src/graph/xml.cc), ARM the implementer code (0x41 Arm, 0x4e NVIDIA, ...).
_VENDOR_KEYS = ("vendor_id", "CPU implementer")


def cpu_vendor(root: Path) -> str | Missing:
    content = read_text(root, "/proc/cpuinfo")
    if isinstance(content, Missing):
        return content
    for line in content.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in _VENDOR_KEYS and value.strip():
            return value.strip()  # Zhaoxin's "  Shanghai  " is kept as "Shanghai"
    return Missing("unsupported", "/proc/cpuinfo names no CPU vendor")


def iommu_cmdline(root: Path) -> list[str] | Missing:
    content = read_text(root, "/proc/cmdline")
    if isinstance(content, Missing):
        return content
    tokens = []
    for token in content.split():
        if token == "--":  # what follows goes to init, not the kernel
            break
        key = token.split("=", 1)[0]
        if key in IOMMU_KEYS or key.startswith("iommu."):
            tokens.append(token)
    return tokens


def iommu_groups(root: Path) -> int | Missing:
    groups = root / "sys/kernel/iommu_groups"
    if groups.is_dir():
        return sum(1 for _ in groups.iterdir())
    if (root / "sys/kernel").is_dir():
        return 0  # the kernel has no IOMMU groups: no IOMMU in use
    return Missing("unsupported", "/sys/kernel is not visible")


def _dmi(root: Path, name: str) -> str | Missing:
    text = read_text(root, f"/sys/class/dmi/id/{name}")
    if isinstance(text, Missing):
        return text
    text = text.strip()
    return text[:64] if text.isprintable() else Missing("error", f"/sys/class/dmi/id/{name} is not text")


def virtualization(root: Path) -> Virtualization:
    """Whether this is a virtual machine: x86 CPUs in a guest set CPUID's hypervisor bit, which Linux
    lists as the "hypervisor" flag in /proc/cpuinfo; DMI names the platform (sys_vendor "QEMU",
    "Microsoft Corporation", "Amazon EC2", ...). Only these two DMI fields are read (no serials)."""
    content = read_text(root, "/proc/cpuinfo")
    flag: bool | Missing
    if isinstance(content, Missing):
        flag = content
    else:
        lines = [line for line in content.splitlines() if line.split(":", 1)[0].strip() == "flags"]
        flag = "hypervisor" in lines[0].split(":", 1)[1].split() if lines else Missing("unsupported", "no x86 flags")
    return Virtualization(hypervisor=flag, sys_vendor=_dmi(root, "sys_vendor"), product_name=_dmi(root, "product_name"))


def booted(root: Path) -> str | Missing:
    """When the kernel booted, ISO 8601: /proc/stat's btime (seconds since the epoch)."""
    content = read_text(root, "/proc/stat")
    if isinstance(content, Missing):
        return content
    for line in content.splitlines():
        key, _, value = line.partition(" ")
        if key == "btime" and value.strip().isdigit():
            return dt.datetime.fromtimestamp(int(value), dt.timezone.utc).isoformat(timespec="seconds")
    return Missing("unsupported", "/proc/stat has no btime line")


def rlimit(which: int) -> int | None:
    soft, _hard = resource.getrlimit(which)
    return None if soft == resource.RLIM_INFINITY else soft


def network_interfaces(root: Path) -> list[str]:
    net = root / "sys/class/net"
    if net.is_dir():
        return sorted(p.name for p in net.iterdir())
    if root == Path("/"):
        return sorted(name for _, name in socket.if_nameindex())
    raise FileNotFoundError(2, "not present", "/sys/class/net")


def master_port(environ: Mapping[str, str]) -> PortStatus | Missing:
    host = environ.get("MASTER_ADDR") or "127.0.0.1"
    raw = environ.get("MASTER_PORT") or str(TORCHRUN_DEFAULT_PORT)
    try:
        port = int(raw)
    except ValueError:
        return Missing("error", f"MASTER_PORT is not a port number: {redact_text(raw)!r}")
    if not 0 < port < 65536:
        return Missing("error", f"MASTER_PORT is out of range: {port}")
    return check_port(host, port)


def read_host(root: Path, environ: Mapping[str, str], isolated: bool | Missing) -> Host:
    info = guarded(meminfo, root)
    return Host(
        hostname=socket.gethostname(),
        kernel=platform.release(),
        cpu_count=os.cpu_count() or Missing("unsupported", "os.cpu_count() cannot tell"),
        cpu_affinity=guarded(cpu_affinity),
        cpu_quota=guarded(cgroup.cpu_quota, root),
        numa_cpus=guarded(numa_cpus, root),
        ram_total_bytes=_meminfo_field(info, "MemTotal"),
        ram_available_bytes=_meminfo_field(info, "MemAvailable"),
        cgroup_memory_limit_bytes=guarded(cgroup.memory_limit, root),
        shm_total_bytes=guarded(shm_total, root),
        container=guarded(container, root, environ),
        pid_namespace_isolated=isolated,
        iommu_cmdline=guarded(iommu_cmdline, root),
        iommu_groups=guarded(iommu_groups, root),
        memlock_limit_bytes=guarded(rlimit, resource.RLIMIT_MEMLOCK),
        nofile_limit=guarded(rlimit, resource.RLIMIT_NOFILE),
        network_interfaces=guarded(network_interfaces, root),
        xid_events=guarded(xid_events, root),
        master_port=guarded(master_port, environ),
        cpu_arch=guarded(cpu_arch),
        cpu_vendor=guarded(cpu_vendor, root),
        booted=guarded(booted, root),
        virtualization=guarded(virtualization, root),
    )
