"""GD5 (host resources): is there enough host RAM for the visible GPUs?

Usable RAM is the machine's RAM, or the cgroup (container) memory limit where that is lower:
a container killed by the OOM killer at its limit never sees the host's free memory.
Sizes are binary and written as GiB (gpudoctor/knowledge/units.py), as `docker --memory 32g` and
nvidia-smi's MiB count; the evidence keys keep their `_gb` names and hold GiB.
"""

from __future__ import annotations

from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.units import GIB
from gpudoctor.knowledge.units import size_gib as gib
from gpudoctor.snapshot import Host

PER_GPU = Code(
    "GD501",
    "host-ram-per-gpu",
    "Enough host RAM per visible GPU",
    what="Divides usable host RAM (the cgroup memory limit where it is lower than the machine's RAM) by "
    "the number of visible GPUs and compares it with --ram-per-gpu (default 16 GiB).",
    why="Every rank runs its own Python process with the model, optimizer state on the CPU side, "
    "pinned buffers and DataLoader workers; below ~16 GiB per GPU, host OOM kills end runs (often "
    "silently: one rank disappears and the others hang in NCCL).",
    fix="Give the job more memory (`docker run --memory`, the Kubernetes memory limit, Slurm "
    "`--mem`/`--mem-per-gpu`), or use fewer DataLoader workers and GPUs per node.",
)
VS_GPU_MEMORY = Code(
    "GD502",
    "host-ram-below-gpu-memory",
    "Host RAM at least the total memory of the visible GPUs",
    what="Compares usable host RAM with the summed memory of the visible GPUs.",
    why="Loading or saving a checkpoint passes through host memory; a node with less RAM than its GPUs "
    "hold cannot stage a full checkpoint (ml-engineering: at least as much CPU memory as GPU memory, "
    "e.g. >= 640 GiB for 8x 80 GiB).",
    fix="Raise the memory limit or use a node with more RAM; load checkpoints shard by shard "
    "(`torch.load(..., mmap=True)`, torch.distributed.checkpoint) so no rank holds all of it at once.",
)
CODES = [PER_GPU, VS_GPU_MEMORY]


def usable_ram(host: Host) -> tuple[int, str] | None:
    """Usable bytes and where the number came from ('cgroup limit' or 'RAM'), if known."""
    total = host.ram_total_bytes if isinstance(host.ram_total_bytes, int) else None
    limit = host.cgroup_memory_limit_bytes if isinstance(host.cgroup_memory_limit_bytes, int) else None
    if limit is not None and (total is None or limit < total):
        return limit, "cgroup limit"
    if total is not None:
        return total, "RAM"
    return None


@check("memory", "Host RAM for the GPUs", codes=CODES, needs="visible")
def memory(ctx: CheckContext) -> list[Finding]:
    host = ctx.snapshot.host
    usable = usable_ram(host)
    if usable is None:
        return [Finding(PER_GPU.code, Status.SKIP, "host", "host RAM was not recorded", "", {})]
    ram, source = usable
    gpus = ctx.visible.gpus
    n = len(gpus)
    ram_gb = ram / GIB
    per_gpu = ram_gb / n
    want = ctx.options.ram_per_gpu_gb
    base = {"usable_ram_gb": round(ram_gb, 1), "source": source, "gpus": n}
    if isinstance(host.ram_total_bytes, int):
        base["machine_ram_gb"] = round(host.ram_total_bytes / GIB, 1)
    where = (
        f" (container limit; the machine has {gib(host.ram_total_bytes / GIB)})"
        if source == "cgroup limit" and isinstance(host.ram_total_bytes, int)
        else ""
    )
    out = []
    evidence = {**base, "per_gpu_gb": round(per_gpu, 1), "expected_per_gpu_gb": want}
    if per_gpu < want:
        msg = f"{gib(ram_gb)} usable RAM{where} for {n} GPU(s) is {gib(per_gpu)} per GPU, below {gib(want)}"
        out.append(Finding(PER_GPU.code, Status.FAIL, "host", msg, PER_GPU.fix, evidence))
    else:
        msg = f"{gib(ram_gb)} usable RAM{where} for {n} GPU(s): {gib(per_gpu)} per GPU (want {gib(want)})"
        out.append(Finding(PER_GPU.code, Status.PASS, "host", msg, "", evidence))

    sizes = [g.memory_total_mib for g in gpus]
    if all(isinstance(s, int) for s in sizes):
        gpu_gb = sum(sizes) / 1024  # type: ignore[arg-type]  # MiB -> GiB
        evidence = {**base, "gpu_memory_gb": round(gpu_gb, 1), "expected_min_ram_gb": round(gpu_gb, 1)}
        if ram_gb < gpu_gb:
            msg = (
                f"{gib(ram_gb)} usable RAM{where} is less than the {gib(gpu_gb)} the {n} GPU(s) hold: "
                "a full checkpoint cannot be staged in host memory"
            )
            out.append(Finding(VS_GPU_MEMORY.code, Status.WARN, "host", msg, VS_GPU_MEMORY.fix, evidence))
        else:
            msg = f"{gib(ram_gb)} usable RAM covers the {gib(gpu_gb)} of GPU memory"
            out.append(Finding(VS_GPU_MEMORY.code, Status.PASS, "host", msg, "", evidence))
    return out
