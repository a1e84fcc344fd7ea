"""GD2 (visibility and launch config): which physical GPUs will the run see, in which order?"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.errors import shown
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge.units import gpu_list
from gpudoctor.knowledge.visible_gpus import PCI_BUS_ID, Visibility, mig_gpus, parse, resolve
from gpudoctor.snapshot import Gpu, Snapshot

VISIBLE = Code(
    "GD201",
    "visible-gpus",
    "The run sees GPUs, and which ones",
    what="Resolves CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER the way CUDA does and lists the "
    "physical GPUs the run will use as cuda:0, cuda:1, ... with their nvidia-smi index and UUID. A GPU "
    "the driver lost (GD827) is not among them: CUDA does not enumerate it and numbers the others "
    "0..n-1, so every check counts the GPUs the run really gets; this finding says once that it was "
    "left out.",
    why="A launch that sees no GPU fails at the first `.cuda()` or silently trains on CPU; knowing "
    "which physical GPU is cuda:0 is the first step of every multi-GPU diagnosis.",
    fix="Unset CUDA_VISIBLE_DEVICES to use every GPU, or set it to a comma-separated list of "
    "indices or full GPU UUIDs (`nvidia-smi -L`), with no spaces, e.g. `CUDA_VISIBLE_DEVICES=0,1,2,3`.",
)
EXPECTED = Code(
    "GD202",
    "fewer-gpus-than-expected",
    "At least --expect-gpus GPUs are visible",
    what="Compares the number of visible GPUs with `gpudoctor check --expect-gpus N`.",
    why="A node that lost a GPU (fallen off the bus, hidden by the container runtime, reserved by "
    "the scheduler) still starts a job, which then runs with fewer ranks or fails at launch.",
    fix="Compare `nvidia-smi -L` with the expected count. A missing GPU that nvidia-smi does not list "
    "needs a reboot or a hardware check (look for XID 79 in `dmesg`); one that nvidia-smi lists but "
    "the run does not see is hidden by CUDA_VISIBLE_DEVICES or the container's device list "
    "(`--gpus all`, the Kubernetes `nvidia.com/gpu` limit).",
)
GEOMETRY = Code(
    "GD203",
    "launch-geometry-mismatch",
    "Enough GPUs for the ranks the launcher starts on this node",
    what="Reads the launch geometry from the environment (torchrun's LOCAL_WORLD_SIZE, WORLD_SIZE on "
    "a single node, Slurm's SLURM_NTASKS_PER_NODE / SLURM_GPUS_ON_NODE) and compares it with the "
    "number of visible GPUs.",
    why="More ranks than GPUs on a node makes two ranks share a GPU (out of memory, or NCCL's "
    "'Duplicate GPU detected' error) or fails with 'invalid device ordinal' when LOCAL_RANK "
    "exceeds the device count.",
    fix="Make `--nproc_per_node` (or `--ntasks-per-node`) equal to the number of GPUs the job may "
    "use, or give the job more GPUs (`--gpus-per-node`, CUDA_VISIBLE_DEVICES).",
)
DROPPED = Code(
    "GD204",
    "visible-devices-dropped",
    "CUDA_VISIBLE_DEVICES means what it seems to",
    what="Looks for entries of CUDA_VISIBLE_DEVICES that CUDA ignores or that end the list early: "
    "indices past the device count, unreadable entries, spaces before UUIDs, trailing junk ('0 1' "
    "is just 0), unknown or ambiguous UUID prefixes, repeated devices (which hide all GPUs) and an "
    "empty value; and integer entries that pick other GPUs than they used to because a lost GPU "
    "(GD827) left CUDA's numbering.",
    why="CUDA does not report these: it quietly uses fewer GPUs (or none), so a job runs on half the "
    "machine or on CPU without an error.",
    fix="Write CUDA_VISIBLE_DEVICES as comma-separated indices or full UUIDs with no spaces and no "
    "repeats, e.g. `CUDA_VISIBLE_DEVICES=0,1,2,3`; list the GPUs with `nvidia-smi -L`.",
)
ORDER = Code(
    "GD205",
    "device-order-mismatch",
    "cuda:N is nvidia-smi's GPU N",
    what="On a machine with different GPU models, checks that CUDA_DEVICE_ORDER=PCI_BUS_ID is set. "
    "When CUDA_VISIBLE_DEVICES lists indices, it names the GPUs they select under CUDA's default "
    "FASTEST_FIRST order (this run's cuda:0, cuda:1...) beside the GPUs the same indices mean in "
    "nvidia-smi's numbering; otherwise it names the cuda: indices that differ from nvidia-smi's. "
    "FASTEST_FIRST is a heuristic inside the driver; gpudoctor models it as higher "
    "compute capability first, then more memory, then PCI bus order (identical GPUs keep PCI order). "
    "An unreadable compute capability or memory size never reorders: a GPU takes the readings of "
    "another GPU of the same name, and where no GPU of a model could be read the order is unknown: "
    "gpudoctor assumes PCI order and says the cuda: numbering cannot be predicted.",
    why="CUDA numbers GPUs fastest first by default, nvidia-smi and NVML by PCI bus. On mixed "
    "machines `CUDA_VISIBLE_DEVICES=1` or `cuda:1` then picks a different card than the one "
    "nvidia-smi calls GPU 1: jobs land on busy or slower GPUs and monitoring blames the wrong card.",
    fix="export CUDA_DEVICE_ORDER=PCI_BUS_ID (in the job script or the shell profile) so CUDA and nvidia-smi agree.",
)
MIG_ONE = Code(
    "GD206",
    "mig-one-instance",
    "A CUDA process uses one MIG instance",
    what="Checks whether CUDA_VISIBLE_DEVICES lists several MIG instances, or the run would otherwise "
    "reach more than one MIG-mode GPU.",
    why="A CUDA process can enumerate only a single MIG instance (NVIDIA MIG user guide): the other "
    "listed instances are ignored, so a multi-GPU run over MIG slices gets one device.",
    fix="Run one process per MIG instance, each with its own CUDA_VISIBLE_DEVICES=MIG-<uuid> "
    "(`nvidia-smi -L` lists them), or disable MIG for multi-GPU training (`nvidia-smi -mig 0`).",
)
CODES = [VISIBLE, EXPECTED, GEOMETRY, DROPPED, ORDER, MIG_ONE]


def device_list(vis: Visibility) -> str:
    n = vis.count
    if n > 1 and vis.nvml_indices == tuple(range(n)) and not any(d.mig for d in vis.devices):
        return f"cuda:0-{n - 1} = nvidia-smi GPU 0-{n - 1}"
    return ", ".join(f"cuda:{d.cuda_index}={describe_device(d)}" for d in vis.devices)


def describe_device(d: Any) -> str:
    """'GPU 3', or 'MIG 0 of GPU 0 (19968 MiB)': a MIG instance is the device, not the GPU."""
    if d.mig is None:
        return f"GPU {d.nvml_index}"
    mem = f" ({d.mig.memory_total_mib} MiB)" if isinstance(d.mig.memory_total_mib, int) else ""
    return f"MIG {d.mig.index} of GPU {d.nvml_index}{mem}"


def mig_view(vis: Visibility) -> str:
    """What a run sees on MIG GPUs, in the words GD201 and GD820 share: 'this run sees 1 device
    (cuda:0 = MIG 0 of GPU 0 (19968 MiB))'. Empty when no selected GPU is in MIG mode."""
    if not mig_gpus(vis):
        return ""
    return f"this run sees {vis.count} {_noun(vis)} ({device_list(vis) or 'none'})"


def _mig_note(vis: Visibility) -> str:
    gpus = mig_gpus(vis)
    if not gpus:
        return ""
    used = {d.nvml_index for d in vis.devices}
    others = [g.index for g in gpus if g.index not in used]
    also = f": GPU {gpu_list(others)} in MIG mode too, unused" if others else ""
    return f"MIG: a CUDA process uses one MIG instance{also}"


def _leading_int(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text)
    return int(m.group(1)) if m else None


def expected_local_ranks(env: Mapping[str, str]) -> tuple[int, str] | None:
    """How many ranks the launcher starts on this node, and which variable says so."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE"):
        if name in env:
            n = _leading_int(env[name])  # Slurm writes "8(x2)" for 8 tasks on each of 2 nodes
            if n:
                return n, name
    if "WORLD_SIZE" in env:
        nodes = [env[k] for k in ("NNODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "GROUP_WORLD_SIZE") if k in env]
        n = _leading_int(env["WORLD_SIZE"])
        if n and all(_leading_int(v) in (None, 1) for v in nodes):
            return n, "WORLD_SIZE"
    return None


@check("visibility", "Visible GPUs and launch geometry", codes=CODES, needs="gpus")
def visibility(ctx: CheckContext) -> list[Finding]:
    vis = ctx.visible
    env = ctx.snapshot.env
    evidence_base = {"CUDA_VISIBLE_DEVICES": vis.raw, "CUDA_DEVICE_ORDER": vis.order_raw}
    out: list[Finding] = []
    out.extend(_dropped(vis))
    n = vis.count
    devices = [
        {
            "cuda": d.cuda_index,
            "nvml_index": d.nvml_index,
            "name": d.gpu.name,
            "uuid": d.uuid,
            "pci_bus_id": d.gpu.pci_bus_id,
        }
        for d in vis.devices
    ]
    installed = len(ctx.snapshot.gpus)
    lost = [g.index for g in vis.lost]
    if lost:
        evidence_base["lost"] = lost
    if n == 0:
        out.append(
            Finding(
                VISIBLE.code,
                Status.FAIL,
                "host",
                f"no GPU is visible to CUDA ({installed} installed): {_why_none(vis)}",
                VISIBLE.fix,
                {**evidence_base, "visible": 0, "installed": installed},
            )
        )
    else:
        out.append(
            Finding(
                VISIBLE.code,
                Status.PASS,
                "host",
                f"{n} {_noun(vis)} visible: {device_list(vis)}{_notes(vis, installed)}",
                evidence={**evidence_base, "visible": n, "installed": installed, "devices": devices},
            )
        )
    expect = ctx.options.expect_gpus
    if expect is not None:
        status = Status.FAIL if n < expect else Status.PASS
        msg = f"{n} GPU(s) visible, --expect-gpus {expect}" + (": too few" if n < expect else "")
        evidence: dict[str, Any] = {"visible": n, "expected": expect}
        if lost:
            evidence["lost"] = lost  # GD201 says they are left out, GD827 why
        out.append(Finding(EXPECTED.code, status, "host", msg, EXPECTED.fix if status is Status.FAIL else "", evidence))
    out.extend(_geometry(env, n))
    out.extend(_order(vis, ctx.snapshot))
    out.extend(_mig(vis))
    return out


def _noun(vis: Visibility) -> str:
    """A MIG instance is a device, not a GPU: say so when the run sees one."""
    return "device(s)" if any(d.mig for d in vis.devices) else "GPU(s)"


def _why_none(vis: Visibility) -> str:
    """Why the run sees nothing, without repeating GD204's sentence about the same entry."""
    kinds = {p.kind for p in vis.problems}
    if vis.lost and not vis.enumeration:
        return f"{_left_out(vis)} (GD827)"
    if kinds & {"empty", "duplicate", "invalid", "out_of_range", "unknown_uuid", "ambiguous_uuid", "lost_uuid"}:
        return f"CUDA_VISIBLE_DEVICES={shown(vis.raw, 120)} selects none of them (GD204 says why)"
    if "mig_no_instance" in kinds:
        return (
            "the selected GPUs are in MIG mode with no MIG instance (create one: sudo nvidia-smi mig -cgi <profile> -C)"
        )
    return "CUDA_VISIBLE_DEVICES hides every GPU"


def _left_out(vis: Visibility) -> str:
    """The one sentence that says a lost GPU is not among the devices (GD827 reports it)."""
    lost = [g.index for g in vis.lost]
    verb, it = ("does", "it") if len(lost) == 1 else ("do", "them")
    return f"GPU {gpu_list(lost)} {verb} not answer NVML and CUDA does not enumerate {it}"


def _notes(vis: Visibility, installed: int) -> str:
    used = {d.nvml_index for d in vis.devices}
    mig = _mig_note(vis)
    hidden_by_mig = {g.index for g in mig_gpus(vis)} - used
    hidden = len(vis.enumeration) - len(used) - len(hidden_by_mig)
    notes = [mig] if mig else []
    if hidden > 0:
        notes.append(f"{hidden} of {installed} GPUs hidden by CUDA_VISIBLE_DEVICES")
    if vis.lost:
        notes.append(f"{_left_out(vis)}: left out (GD827)")
    if vis.order_unknown and used:
        notes.append(f"cuda: order assumed PCI ({_order_guess(vis)})")
    return "".join(f"; {n}" for n in notes)


def _order_guess(vis: Visibility) -> str:
    """Why FASTEST_FIRST cannot be predicted: the GPUs whose compute capability or memory is unreadable."""
    return f"compute capability or memory unreadable on GPU {gpu_list(list(vis.order_unknown))}"


def _dropped(vis: Visibility) -> list[Finding]:
    out = []
    for p in vis.problems:
        if p.kind in ("unknown_order", "mig_one_instance", "mig_no_instance"):
            continue
        out.append(
            Finding(
                DROPPED.code,
                Status.WARN,
                "host",
                p.message,
                DROPPED.fix,
                {"CUDA_VISIBLE_DEVICES": vis.raw, "entry": p.entry, "problem": p.kind, "ignored": list(p.dropped)},
            )
        )
    return out


def _geometry(env: Mapping[str, str], n: int) -> list[Finding]:
    geometry = expected_local_ranks(env)
    if geometry is None:
        return []
    ranks, source = geometry
    evidence = {"visible": n, "expected": ranks, "source": source, source: env[source]}
    if n >= ranks:
        return [
            Finding(
                GEOMETRY.code,
                Status.PASS,
                "host",
                f"{source}={env[source]}: {n} GPU(s) for {ranks} rank(s)",
                "",
                evidence,
            )
        ]
    if n == 1 and "LOCAL_RANK" in env:
        # Slurm/torchrun per-rank binding: each rank is given exactly its own GPU.
        msg = f"one GPU visible to local rank {env['LOCAL_RANK']} of {ranks}: per-rank GPU binding"
        return [Finding(GEOMETRY.code, Status.PASS, "host", msg, "", evidence)]
    return [
        Finding(
            GEOMETRY.code,
            Status.FAIL,
            "host",
            f"{source}={env[source]} starts {ranks} ranks on this node but only {n} GPU(s) are visible",
            GEOMETRY.fix,
            evidence,
        )
    ]


def _gpus_words(gpus: tuple[Gpu, ...] | list[Gpu]) -> str:
    """'GPU 0 (RTX 4090) and GPU 1 (RTX 4080)': nvidia-smi's numbers, in CUDA order, with the models."""
    named = [f"GPU {g.index} ({g.name.removeprefix('NVIDIA ')})" for g in gpus]
    return ", ".join(named[:-1]) + f" and {named[-1]}" if len(named) > 1 else (named[0] if named else "no GPU")


def _selection(vis: Visibility, snapshot: Snapshot) -> str:
    """What the user's integer CUDA_VISIBLE_DEVICES selects under FASTEST_FIRST against PCI order,
    or '' when it selects the same GPUs in the same order either way (or lists UUIDs, which no order moves)."""
    if vis.raw is None or parse(vis.raw).kind != "int":
        return ""
    pci = resolve(replace(snapshot, env={**snapshot.env, "CUDA_DEVICE_ORDER": PCI_BUS_ID}))
    if pci.nvml_indices == vis.nvml_indices:
        return ""
    n = vis.count
    cuda = f"cuda:0-{n - 1}" if n > 1 else "cuda:0"
    return (
        f"CUDA_VISIBLE_DEVICES={shown(vis.raw, 120)} selects nvidia-smi's {_gpus_words(vis.gpus)} as {cuda}, "
        "because CUDA "
        f"numbers GPUs fastest first by default; as nvidia-smi numbers them it means {_gpus_words(pci.gpus)}"
    )


def _order(vis: Visibility, snapshot: Snapshot) -> list[Finding]:
    names = {g.name for g in vis.enumeration}  # lost GPUs are not enumerated: not a model of their own
    if len(names) < 2 or vis.order == PCI_BUS_ID:
        return []
    # Against PCI order of the GPUs CUDA enumerates: what CUDA_DEVICE_ORDER=PCI_BUS_ID would give.
    by_pci = sorted(vis.enumeration, key=lambda g: g.index)
    moved = [(i, g) for i, g in enumerate(vis.enumeration) if g.index != by_pci[i].index]
    evidence: dict[str, Any] = {
        "CUDA_DEVICE_ORDER": vis.order_raw,
        "expected": PCI_BUS_ID,
        "cuda_order": [g.index for g in vis.enumeration],
        "models": sorted(names),
    }
    head = "mixed GPUs and CUDA_DEVICE_ORDER is not PCI_BUS_ID"
    selection = "" if vis.order_unknown else _selection(vis, snapshot)
    if vis.order_unknown:
        evidence["order_unknown"] = list(vis.order_unknown)
        msg = f"{head}: which card is cuda:N cannot be predicted ({_order_guess(vis)}; gpudoctor assumes PCI order)"
    elif selection:
        pci = resolve(replace(snapshot, env={**snapshot.env, "CUDA_DEVICE_ORDER": PCI_BUS_ID}))
        evidence |= {"selected": list(vis.nvml_indices), "selected_with_pci_bus_id": list(pci.nvml_indices)}
        msg = f"{selection}: set CUDA_DEVICE_ORDER=PCI_BUS_ID"
    elif vis.raw is not None and parse(vis.raw).kind != "all":
        # The variable picks the same GPUs either way (UUIDs, or indices FASTEST_FIRST leaves in place).
        swaps = ", ".join(f"CUDA's index {i} is nvidia-smi's GPU {g.index}" for i, g in moved)
        how = (
            "by UUID, which no order changes"
            if parse(vis.raw).kind != "int"
            else f"{shown(vis.raw, 120)}: the same GPUs either way"
        )
        msg = (
            f"{head}: this run selects its GPUs {how}, but other indices do not "
            f"({swaps or 'CUDA numbers them by its speed heuristic'})"
        )
    elif moved:
        swaps = ", ".join(f"cuda:{i} is nvidia-smi's GPU {g.index} ({g.name})" for i, g in moved)
        msg = f"{head}: {swaps}"
    else:
        msg = f"{head}: CUDA numbers them by its speed heuristic"
    return [Finding(ORDER.code, Status.WARN, "host", msg, ORDER.fix, evidence)]


def _mig(vis: Visibility) -> list[Finding]:
    for p in vis.problems:
        if p.kind == "mig_one_instance" or (p.kind == "mig_no_instance" and vis.raw is not None):
            evidence = {"CUDA_VISIBLE_DEVICES": vis.raw, "ignored": list(p.dropped) or [p.entry]}
            return [Finding(MIG_ONE.code, Status.WARN, "host", p.message, MIG_ONE.fix, evidence)]
    return []
