"""cgroup v1 and v2 limits on this process: CPU quota (in cores) and memory limit (bytes).

A limit set on any ancestor cgroup applies too, so the tightest one along the path wins.
In a container with its own cgroup namespace the path is "/" and the mount is the
container's own; without one, the host path may not exist under the mount, and the
mount's root is read instead.
"""

from __future__ import annotations

from pathlib import Path

from gpudoctor.probe.files import missing_from_oserror, read_text
from gpudoctor.snapshot import Missing

CGROUP_MOUNT = "sys/fs/cgroup"
# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit number.
V1_UNLIMITED_THRESHOLD = 1 << 62

NO_CPU_QUOTA = Missing("unsupported", "no cgroup CPU quota is set")


def membership(root: Path) -> dict[str, str] | Missing:
    """controller -> cgroup path, from /proc/self/cgroup; v2's unified entry is under ''."""
    content = read_text(root, "/proc/self/cgroup")
    if isinstance(content, Missing):
        return content
    paths: dict[str, str] = {}
    for line in content.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths[""] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def _chain(mount: Path, path: str) -> list[Path]:
    """The cgroup directory of `path` under `mount` and its ancestors up to the mount."""
    leaf = mount / path.strip("/") if path.strip("/") else mount
    if not leaf.is_dir():
        return [mount]
    chain = [leaf]
    while chain[-1] != mount and mount in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def _read_values(dirs: list[Path], filename: str) -> list[str] | Missing:
    """The file's content in each directory that has it. An absent file sets no limit at
    that level (the root cgroup has none); a file we may not read makes the answer unknown."""
    values = []
    for d in dirs:
        try:
            values.append((d / filename).read_text(encoding="utf-8").strip())
        except FileNotFoundError:
            continue
        except OSError as exc:
            return missing_from_oserror(exc, d / filename)
    return values


def _v1_mount(root: Path, controller: str) -> Path | None:
    base = root / CGROUP_MOUNT
    for name in (controller, f"{controller},cpuacct", f"cpuacct,{controller}"):
        if (base / name).is_dir():
            return base / name
    return None


def cpu_quota(root: Path) -> float | Missing:
    """The CPU quota in cores (e.g. 4.0), or NO_CPU_QUOTA when none is set."""
    paths = membership(root)
    if isinstance(paths, Missing):
        return paths
    quotas: list[float] = []
    if "cpu" in paths and (mount := _v1_mount(root, "cpu")) is not None:
        for d in _chain(mount, paths["cpu"]):
            pair = _read_values([d], "cpu.cfs_quota_us"), _read_values([d], "cpu.cfs_period_us")
            for values in pair:
                if isinstance(values, Missing):
                    return values
            quota, period = pair
            if quota and period and int(quota[0]) > 0 and int(period[0]) > 0:
                quotas.append(int(quota[0]) / int(period[0]))
    elif "" in paths:
        values = _read_values(_chain(root / CGROUP_MOUNT, paths[""]), "cpu.max")
        if isinstance(values, Missing):
            return values
        for value in values:
            quota, _, period = value.partition(" ")
            if quota != "max" and period and int(period) > 0:
                quotas.append(int(quota) / int(period))
    else:
        return Missing("unsupported", "no cpu controller in /proc/self/cgroup")
    return min(quotas) if quotas else NO_CPU_QUOTA


def memory_limit(root: Path) -> int | None | Missing:
    """The cgroup memory limit in bytes; None when no limit is set."""
    paths = membership(root)
    if isinstance(paths, Missing):
        return paths
    limits: list[int] = []
    if "memory" in paths and (root / CGROUP_MOUNT / "memory").is_dir():
        values = _read_values(_chain(root / CGROUP_MOUNT / "memory", paths["memory"]), "memory.limit_in_bytes")
        if isinstance(values, Missing):
            return values
        limits = [int(v) for v in values if int(v) < V1_UNLIMITED_THRESHOLD]
    elif "" in paths:
        values = _read_values(_chain(root / CGROUP_MOUNT, paths[""]), "memory.max")
        if isinstance(values, Missing):
            return values
        limits = [int(v) for v in values if v != "max"]
    else:
        return Missing("unsupported", "no memory controller in /proc/self/cgroup")
    return min(limits) if limits else None
