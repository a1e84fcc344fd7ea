"""GD5 (host resources): /dev/shm, ulimits, CPU cores and NUMA placement per GPU, containers."""

from __future__ import annotations

from typing import Any

from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.nccl_rules import nccl_int
from gpudoctor.knowledge.units import MIB, gpu_list, listed, size
from gpudoctor.knowledge.versions import version_tuple
from gpudoctor.snapshot import Gpu, Snapshot, known

SHM_SMALL = Code(
    "GD510",
    "shm-too-small",
    "/dev/shm is large enough for NCCL and DataLoader workers",
    what="Reads the size of /dev/shm and compares it with what multi-GPU jobs are known to need: 1 GiB "
    "at least (NVIDIA's NCCL troubleshooting guide runs containers with `--shm-size=1g`) and 512 MiB per "
    "GPU the run uses (PyTorch's own CI gives its 4-GPU runners 2 GiB: pytorch/ci-infra#490, "
    "pytorch/tutorials#2475); 512 MiB for a single-GPU run (DataLoader workers; DeepSpeed's ds_report "
    "line). Below 256 MiB with several GPUs fails (Docker's default is 64 MiB, which NCCL outgrows at 4 "
    "GPUs: NVIDIA/nccl#1518). With NCCL 2.24 or newer, a driver for CUDA 12.6+ and outside a container, "
    "NCCL keeps its buffers in cuMem host memory instead, so a small /dev/shm only warns (DataLoader "
    "workers still use it); NCCL_CUMEM_ENABLE=0 or NCCL_CUMEM_HOST_ENABLE=0 send NCCL back to /dev/shm.",
    why="NCCL's shared-memory transport and torch DataLoader workers put their buffers in /dev/shm. "
    "When it fills, NCCL fails with 'Call to posix_fallocate failed: No space left on device' / "
    "'unhandled system error' and workers die with a bus error, usually minutes into the run.",
    fix="Docker: `docker run --shm-size=1g --ulimit memlock=-1 ...` or `--ipc=host`. Kubernetes: mount an "
    "`emptyDir: {medium: Memory, sizeLimit: 1Gi}` at /dev/shm. Bare metal: "
    "`sudo mount -o remount,size=8G /dev/shm`.",
)
MEMLOCK = Code(
    "GD511",
    "memlock-limited",
    "The locked-memory limit allows RDMA (memlock unlimited)",
    what="Reads the memlock ulimit (RLIMIT_MEMLOCK) on hosts with RDMA devices (InfiniBand/RoCE/EFA). A "
    "limit below the machine's memory fails while NCCL will use the devices (NCCL_IB_DISABLE not 1), and "
    "warns when NCCL_IB_DISABLE=1 keeps it off them.",
    why="NCCL's InfiniBand and GPUDirect RDMA transports register (pin) large buffers; a small memlock "
    "limit makes registration fail: 'Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory' "
    "with `ulimit -l` at 8192 (NVIDIA/nccl-tests#206), and the run stops.",
    fix="Set it unlimited: `ulimit -l unlimited` in the launching shell, `LimitMEMLOCK=infinity` in the "
    "systemd unit, `* - memlock unlimited` in /etc/security/limits.conf, or `docker run --ulimit "
    "memlock=-1`.",
)
NOFILE = Code(
    "GD512",
    "nofile-low",
    "The open-files limit is high enough for multi-GPU data loading",
    what="Reads the open-files ulimit (RLIMIT_NOFILE soft limit) when the run uses a GPU; below 4096 warns.",
    why="torch shares tensors between DataLoader workers and ranks through file descriptors by default; "
    "with several workers per GPU, one GPU included, a 1024 limit ends in 'Too many open files' or "
    "'received 0 items of ancdata' (DonsetPG/graph-physics#22).",
    fix="Raise it: `ulimit -n 65536` (hard limit permitting), `LimitNOFILE=` in systemd, or `docker run "
    "--ulimit nofile=65536:65536`. Or call torch.multiprocessing.set_sharing_strategy('file_system').",
)
CPU_PER_GPU = Code(
    "GD515",
    "cpu-cores-per-gpu",
    "Enough usable CPU cores per GPU for data loading",
    what="Counts the CPUs this process may use (its affinity, capped by a cgroup CPU quota) per GPU the "
    "run uses: fewer than 4 per GPU warns, fewer than 1 fails.",
    why="Each rank needs a core for its Python loop plus DataLoader workers; too few cores starve the "
    "GPUs (low utilisation, slow steps) no matter how fast they are.",
    fix="Give the job more CPUs (Slurm `--cpus-per-task`, Kubernetes `resources.limits.cpu`, `docker run "
    "--cpus`), or lower DataLoader num_workers so ranks do not fight over cores.",
)
NUMA_AFFINITY = Code(
    "GD516",
    "gpu-numa-no-cpus",
    "Every GPU has CPUs of its own NUMA node available",
    what="For each GPU the run uses, intersects the CPUs of the GPU's NUMA node (or NVML's CPU affinity "
    "of the GPU) with the CPUs this process may run on.",
    why="A rank whose CPUs sit on the other socket copies every batch across the socket interconnect: "
    "host-to-device bandwidth drops and step time grows, and only on those GPUs.",
    fix="Let the job use CPUs on every NUMA node that has GPUs (Slurm `--cpu-bind`, cgroup cpusets, "
    "`docker run --cpuset-cpus`), and bind each rank near its GPU (`numactl --cpunodebind=<node>`, or "
    "torchrun `--numa-binding` where available).",
)
CONTAINER = Code(
    "GD520",
    "container",
    "Running inside a container: what that changes",
    what="Detects a container (Docker, Podman, Kubernetes, ...) and reports what it changes for GPU "
    "jobs: process IDs that NVML reports are host PIDs, and limits (memory, CPU, /dev/shm) come from "
    "the container's cgroup rather than the host.",
    why="Inside a container NVML lists processes by host PID, so tools show 'No such process' or empty "
    "process lists; memory, CPU and /dev/shm are smaller than the machine; systemd services "
    "(fabric manager, persistence daemon) are not visible.",
    fix="Nothing to fix by itself. To see GPU processes by name, run with `--pid=host`; give NCCL room with "
    "`--shm-size=1g` or `--ipc=host` and `--ulimit memlock=-1`; check host-side services on the host.",
)
CODES = [SHM_SMALL, MEMLOCK, NOFILE, CPU_PER_GPU, NUMA_AFFINITY, CONTAINER]

SHM_SINGLE_GPU = 512 * MIB  # DeepSpeed ds_report's line for DataLoader workers (heuristic)
SHM_FLOOR = 1024 * MIB  # NVIDIA's NCCL troubleshooting guide: docker --shm-size=1g
SHM_PER_GPU = 512 * MIB  # PyTorch CI: 2 GiB for its 4-GPU runners (pytorch/ci-infra#490)
SHM_FAIL = 256 * MIB  # heuristic: 64 MiB (Docker) fails NCCL at 4 GPUs (nccl#1518), 16 MiB at 8 (torchtitan#853)
NOFILE_MIN = 4096
CORES_WARN = 4.0
CORES_FAIL = 1.0
_RDMA_PREFIXES = ("ib", "rdma", "roce", "efa", "mlx")


def shm_wanted(gpus: int) -> int:
    return SHM_SINGLE_GPU if gpus < 2 else max(SHM_FLOOR, SHM_PER_GPU * gpus)


def _nccl_avoids_shm(snapshot: Snapshot) -> bool:
    """NCCL >= 2.24 keeps intra-node buffers in cuMem host memory (driver CUDA >= 12.6, runtime >= 12.2);
    in a container that needs NUMA support (SYS_NICE), which Docker withholds, so NCCL falls back. It
    uses them only with cuMem and cuMem host allocations both on (NCCL src/transport/shm.cc)."""
    if any(nccl_int(snapshot.env.get(name)) == 0 for name in ("NCCL_CUMEM_ENABLE", "NCCL_CUMEM_HOST_ENABLE")):
        return False
    sw, drv = snapshot.software, snapshot.driver
    if not (known(sw.torch_nccl) and known(sw.torch_cuda) and sw.torch_cuda and known(drv.cuda_driver_version)):
        return False
    nccl, runtime, driver = (version_tuple(str(v)) for v in (sw.torch_nccl, sw.torch_cuda, drv.cuda_driver_version))
    if nccl is None or runtime is None or driver is None:
        return False
    in_container = bool(value if known(value := snapshot.host.container) else False)
    return nccl >= (2, 24) and runtime >= (12, 2) and driver >= (12, 6) and not in_container


def shm(ctx: CheckContext, gpus: list[Gpu]) -> list[Finding]:
    total = ctx.snapshot.host.shm_total_bytes
    if not known(total) or not gpus:
        return []
    n = len(gpus)
    want = ctx.options.min_shm_bytes or shm_wanted(n)  # a policy's min-shm wins
    relieved = _nccl_avoids_shm(ctx.snapshot)
    evidence: dict[str, Any] = {
        "shm_bytes": total,
        "gpus": n,
        "expected_bytes": want,
        "nccl": ctx.snapshot.software.torch_nccl,
        "nccl_uses_cumem_host": relieved,
    }
    if total >= want:
        return [Finding(SHM_SMALL.code, Status.PASS, "host", f"/dev/shm is {size(total)}", "", evidence)]
    status = Status.FAIL if n >= 2 and total < SHM_FAIL and not relieved else Status.WARN
    who = "NCCL and DataLoader workers"
    if relieved:
        who = "DataLoader workers (NCCL >= 2.24 keeps its buffers elsewhere here)"
    return [
        Finding(
            SHM_SMALL.code,
            status,
            "host",
            f"/dev/shm is only {size(total)} for {n} GPU(s) (want {size(want)}): {who} run out of shared memory",
            shm_hint(want),
            evidence,
        )
    ]


def shm_hint(want: int) -> str:
    """The commands that give /dev/shm the size wanted (whole GiB, as --shm-size takes it)."""
    gib = -(-want // (1024 * MIB))
    return (
        f"docker run --shm-size={gib}g (or --ipc=host); Kubernetes: a memory emptyDir of sizeLimit {gib}Gi at "
        f"/dev/shm; bare metal: sudo mount -o remount,size={gib}G /dev/shm"
    )


def _rdma_present(snapshot: Snapshot) -> list[str]:
    """RDMA devices (/sys/class/infiniband, host.network) or, without that reading, interfaces whose
    names say InfiniBand/RoCE/EFA."""
    host = snapshot.host
    net = host.network
    if known(net) and known(net.rdma) and net.rdma:
        return [d.name for d in net.rdma]
    ifaces = host.network_interfaces if known(host.network_interfaces) else []
    return [i for i in ifaces if i.lower().startswith(_RDMA_PREFIXES)]


def memlock(ctx: CheckContext) -> list[Finding]:
    """GD511. NCCL's IB transport pins (ibv_reg_mr) its buffers against RLIMIT_MEMLOCK: with a limited
    memlock registration fails, "Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory" at
    `ulimit -l` 8192 (NVIDIA/nccl-tests#206), and the run stops. A failure wherever NCCL will use the
    RDMA devices (present, NCCL_IB_DISABLE not set); a limit at least the machine's memory pins as much
    as an unlimited one."""
    snapshot = ctx.snapshot
    limit = snapshot.host.memlock_limit_bytes
    rdma = _rdma_present(snapshot)
    if not known(limit) or not rdma:
        return []
    ram = snapshot.host.ram_total_bytes
    evidence: dict[str, Any] = {
        "memlock_bytes": "unlimited" if limit is None else limit,
        "rdma_devices": rdma,
        "expected": "unlimited",
    }
    if limit is None or (known(ram) and limit >= ram):
        said = "unlimited" if limit is None else f"{size(limit)}, at least the machine's memory"
        return [Finding(MEMLOCK.code, Status.PASS, "host", f"memlock is {said}", "", evidence)]
    ib_off = nccl_int(snapshot.env.get("NCCL_IB_DISABLE")) == 1
    where = f"RDMA devices ({listed(rdma, 3)})"
    if ib_off:
        evidence["NCCL_IB_DISABLE"] = snapshot.env["NCCL_IB_DISABLE"]
        msg = (
            f"memlock is limited to {size(limit)} on a host with {where}; NCCL_IB_DISABLE=1 keeps NCCL off them "
            "now, but enabling IB will fail to register its buffers"
        )
        return [Finding(MEMLOCK.code, Status.WARN, "host", msg, MEMLOCK.fix, evidence)]
    msg = (
        f"memlock is limited to {size(limit)} on a host with {where} that NCCL will use: registering its "
        "buffers fails ('ibv_reg_mr ... Cannot allocate memory') and inter-node runs stop"
    )
    hint = (
        "ulimit -l unlimited for the launching shell and every rank (check `ulimit -l` inside mpirun/srun/the "
        "container): `* - memlock unlimited` in /etc/security/limits.conf, LimitMEMLOCK=infinity for systemd "
        "units, `docker run --ulimit memlock=-1`"
    )
    return [Finding(MEMLOCK.code, Status.FAIL, "host", msg, hint, evidence)]


def nofile(ctx: CheckContext, gpus: list[Gpu]) -> list[Finding]:
    limit = ctx.snapshot.host.nofile_limit
    if not known(limit) or not gpus:
        return []  # DataLoader workers share tensors by descriptor with one GPU too (graph-physics#22)
    evidence = {"nofile": "unlimited" if limit is None else limit, "expected": f">= {NOFILE_MIN}"}
    if limit is None or limit >= NOFILE_MIN:
        return [Finding(NOFILE.code, Status.PASS, "host", f"open-files limit is {evidence['nofile']}", "", evidence)]
    return [
        Finding(
            NOFILE.code,
            Status.WARN,
            "host",
            f"open-files limit is {limit}: DataLoader workers sharing tensors run out of file descriptors",
            "ulimit -n 65536 (or torch.multiprocessing.set_sharing_strategy('file_system'))",
            evidence,
        )
    ]


def _usable_cpus(snapshot: Snapshot) -> tuple[float | None, dict[str, Any]]:
    host = snapshot.host
    evidence: dict[str, Any] = {}
    count: float | None = None
    if known(host.cpu_affinity) and host.cpu_affinity:
        count = float(len(host.cpu_affinity))
        evidence["cpu_affinity"] = len(host.cpu_affinity)
    elif known(host.cpu_count):
        count = float(host.cpu_count)
        evidence["cpu_count"] = host.cpu_count
    if known(host.cpu_quota) and host.cpu_quota:
        evidence["cgroup_cpu_quota"] = host.cpu_quota
        count = host.cpu_quota if count is None else min(count, host.cpu_quota)
    return count, evidence


def cpu_per_gpu(ctx: CheckContext, gpus: list[Gpu]) -> list[Finding]:
    cpus, evidence = _usable_cpus(ctx.snapshot)
    if cpus is None or not gpus:
        return []
    per = cpus / len(gpus)
    evidence.update(
        {
            "usable_cpus": cpus,
            "gpus": len(gpus),
            "cpus_per_gpu": round(per, 2),
            "expected": f">= {CORES_WARN:g} per GPU",
        }
    )
    if per >= CORES_WARN:
        return [Finding(CPU_PER_GPU.code, Status.PASS, "host", f"{per:.1f} usable CPU cores per GPU", "", evidence)]
    status = Status.FAIL if per < CORES_FAIL else Status.WARN
    return [
        Finding(
            CPU_PER_GPU.code,
            status,
            "host",
            f"only {cpus:g} usable CPU core(s) for {len(gpus)} GPU(s) ({per:.1f} per GPU): data loading "
            "will starve the GPUs",
            "Request more CPUs (Slurm --cpus-per-task, k8s limits.cpu, docker --cpus) or lower num_workers.",
            evidence,
        )
    ]


def numa(ctx: CheckContext, gpus: list[Gpu]) -> list[Finding]:
    host = ctx.snapshot.host
    if not known(host.cpu_affinity) or not host.cpu_affinity:
        return []
    mine = set(host.cpu_affinity)
    numa_cpus = host.numa_cpus if known(host.numa_cpus) else {}
    stranded: list[int] = []
    checked: list[int] = []
    nodes: dict[int, Any] = {}
    for g in gpus:
        near: list[int] | None = None
        if known(g.numa_node) and str(g.numa_node) in numa_cpus:
            near = numa_cpus[str(g.numa_node)]
            nodes[g.index] = g.numa_node
        elif known(g.cpu_affinity) and g.cpu_affinity:
            near = g.cpu_affinity
        if near is None:
            continue
        checked.append(g.index)
        if not mine.intersection(near):
            stranded.append(g.index)
    if not checked:
        return []
    evidence = {"gpus_without_local_cpus": stranded, "gpu_numa_nodes": nodes, "process_cpus": len(mine)}
    if not stranded:
        return [
            Finding(
                NUMA_AFFINITY.code,
                Status.PASS,
                "host",
                f"every GPU ({gpu_list(checked)}) has CPUs of its NUMA node available",
                "",
                evidence,
            )
        ]
    return [
        Finding(
            NUMA_AFFINITY.code,
            Status.WARN,
            "host",
            f"GPU {gpu_list(stranded)}: none of their NUMA node's CPUs are in this process's affinity; "
            "their ranks will feed them across the socket interconnect",
            "Allow CPUs on every GPU's NUMA node (cpuset, --cpuset-cpus, Slurm --cpu-bind) and bind each "
            "rank near its GPU.",
            evidence,
        )
    ]


def container(ctx: CheckContext) -> list[Finding]:
    host = ctx.snapshot.host
    kind = host.container
    if not known(kind) or not kind:
        return []
    # Open kernel modules since 535.113.01 give a container its own PIDs (tests/reference/nvml_pids.md).
    changes = ["NVML reports host PIDs on drivers before 535.113.01 (this container's on open kernel modules since)"]
    if host.pid_namespace_isolated is True:
        changes.append("processes outside the container are not visible by name (run with --pid=host to see them)")
    if known(host.cgroup_memory_limit_bytes) and host.cgroup_memory_limit_bytes:
        changes.append(f"memory is limited to {size(host.cgroup_memory_limit_bytes)} by the cgroup")
    if known(host.cpu_quota) and host.cpu_quota:
        changes.append(f"CPU is limited to {host.cpu_quota:g} cores by the cgroup")
    changes.append("host services (fabric manager, persistence daemon) are not visible")
    evidence = {
        "container": kind,
        "pid_namespace_isolated": host.pid_namespace_isolated,
        "cgroup_memory_limit_bytes": host.cgroup_memory_limit_bytes if known(host.cgroup_memory_limit_bytes) else None,
        "cpu_quota": host.cpu_quota if known(host.cpu_quota) else None,
    }
    return [
        Finding(
            CONTAINER.code, Status.PASS, "host", f"running in a {kind} container: " + "; ".join(changes), "", evidence
        )
    ]


@check("host_resources", "Host resources (/dev/shm, limits, CPUs per GPU, NUMA)", codes=CODES)
def host_resources(ctx: CheckContext) -> list[Finding]:
    gpus = target_gpus(ctx)
    return [
        *shm(ctx, gpus),
        *memlock(ctx),
        *nofile(ctx, gpus),
        *cpu_per_gpu(ctx, gpus),
        *numa(ctx, gpus),
        *container(ctx),
    ]
