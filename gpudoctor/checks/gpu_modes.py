"""GD8 (GPU health): modes that stop a multi-GPU run (MIG, compute mode) and memory already taken."""

from __future__ import annotations

from typing import Any

from gpudoctor.checks.targets import target_gpus
from gpudoctor.checks.unread import unread, unreadable_finding
from gpudoctor.checks.visibility import mig_view
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status, gpu_subject
from gpudoctor.knowledge.units import gpu_list, listed
from gpudoctor.knowledge.visible_gpus import mig_gpus
from gpudoctor.snapshot import Gpu, known

MIG_ENABLED = Code(
    "GD820",
    "mig-enabled",
    "MIG is off on the GPUs a multi-GPU run uses",
    what="Reads MIG mode (current and pending) on each GPU the run uses. MIG on fails unless "
    "`--allow-mig` is given; a pending change that needs a GPU reset warns; a MIG mode NVML could "
    "not read (an error) warns as unknown rather than passing as off (refused to this user: a skip that needs root).",
    why="A CUDA process can use only one MIG instance, and MIG instances cannot do peer-to-peer: "
    "torch.cuda.device_count() is 1, DDP across GPUs or slices fails or falls back to slow paths.",
    fix="Turn MIG off for training: `sudo nvidia-smi -i <gpu> -mig 0`, then reset the GPU "
    "(`sudo nvidia-smi -r -i <gpu>`) or reboot. If you mean to run one process per MIG slice, pass "
    "--allow-mig.",
)
COMPUTE_MODE = Code(
    "GD821",
    "compute-mode-restricted",
    "Compute mode lets every rank use its GPU",
    what="Reads each GPU's compute mode. 'Prohibited' fails; 'exclusive process' warns, and fails when a "
    "process already holds the GPU (no other context can be made); a compute mode NVML could not give "
    "warns as unknown rather than passing as default.",
    why="In 'prohibited' mode no CUDA context can be created. In 'exclusive process' mode only one "
    "process may hold a context: a DDP rank that touches cuda:0 before torch.cuda.set_device(rank) "
    "takes GPU 0 and the others fail with 'all CUDA-capable devices are busy or unavailable'.",
    fix="Set the default mode: `sudo nvidia-smi -i <gpu> -c DEFAULT`. If the cluster requires "
    "exclusive mode, call torch.cuda.set_device(local_rank) before any other CUDA call in every rank.",
)
PROCESSES = Code(
    "GD825",
    "gpu-memory-in-use",
    "No other processes hold memory on the GPUs the run uses",
    what="Lists the compute processes NVML reports on each GPU the run uses, with PID (the host PID "
    "and, in a container, the local one), user, command and memory.",
    why="Memory already taken leaves less for the model (OOM at the first step), and a busy GPU makes "
    "its rank the straggler every other rank waits for. Leftover ranks of a killed run are the usual "
    "culprits.",
    fix="Stop the processes (`kill <pid>`; find them with `fuser -v /dev/nvidia*`), or choose other GPUs "
    "with CUDA_VISIBLE_DEVICES.",
)
GHOST_MEMORY = Code(
    "GD826",
    "gpu-memory-unaccounted",
    "GPU memory in use is accounted for by processes",
    what="Compares each GPU's used memory with the sum of the memory of the processes NVML lists on it; "
    "more than max(1 GiB, 5% of the GPU) unaccounted for warns.",
    why="Memory no listed process owns belongs to a process in another container or PID namespace, or "
    "to a zombie whose context was never torn down; it is as unavailable to your run as any other.",
    fix="On the host run `nvidia-smi` and `sudo fuser -v /dev/nvidia*` to find the owner; kill it. If "
    "no process owns it, reset the GPU (`sudo nvidia-smi -r -i <gpu>`) or reboot.",
)
MODE_CODES = [MIG_ENABLED, COMPUTE_MODE]
PROCESS_CODES = [PROCESSES, GHOST_MEMORY]

GHOST_MIN_MIB = 1024
GHOST_FRACTION = 0.05


def _mig(ctx: CheckContext, gpus: list[Gpu]) -> list[Finding]:
    out = []
    # The MIG GPUs the run selected, also those the one-instance rule left out of `gpus`.
    on = [g.index for g in mig_gpus(ctx.visible)]
    if on:
        view = mig_view(ctx.visible)
        evidence: dict[str, Any] = {
            "mig_enabled": on,
            "devices_seen": ctx.visible.count,
            "allow_mig": ctx.options.allow_mig,
            "expected": "disabled",
        }
        if ctx.options.allow_mig:
            out.append(
                Finding(
                    MIG_ENABLED.code,
                    Status.PASS,
                    "host",
                    f"MIG is on for GPU {gpu_list(on)} (allowed by --allow-mig): {view}",
                    "",
                    evidence,
                )
            )
        else:
            out.append(
                Finding(
                    MIG_ENABLED.code,
                    Status.FAIL,
                    "host",
                    f"MIG is on for GPU {gpu_list(on)}: a CUDA process uses one MIG instance, so {view} "
                    "and DDP across GPUs cannot work",
                    f"sudo nvidia-smi -i {on[0]} -mig 0 (each MIG GPU) and reset the GPU; or pass --allow-mig if "
                    "one process per MIG instance is intended.",
                    evidence,
                )
            )
    for g in gpus:
        if known(g.mig_mode_pending) and known(g.mig_mode_current) and g.mig_mode_pending != g.mig_mode_current:
            state = "on" if g.mig_mode_pending else "off"
            out.append(
                Finding(
                    MIG_ENABLED.code,
                    Status.WARN,
                    gpu_subject(g.index),
                    f"MIG is set to turn {state} at the next GPU reset",
                    f"Reset the GPU (sudo nvidia-smi -r -i {g.index}) or reboot to apply it, or undo it.",
                    {"mig_mode_current": g.mig_mode_current, "mig_mode_pending": g.mig_mode_pending},
                )
            )
    # Unknown, not off: in MIG mode CUDA would see one slice of the GPU, not the whole of it.
    readings = {g.index: g.mig_mode_current for g in gpus}
    return _settle(MIG_ENABLED, out, readings, "MIG mode", "MIG is off", "whether the run gets it whole is unknown")


def _settle(
    code: Code, out: list[Finding], readings: dict[int, Any], label: str, ok: str, why: str, always_there: bool = False
) -> list[Finding]:
    """The findings of one mode: a pass (`ok`) when nothing was found on the GPUs that could be read,
    naming them when some could not, and first a warning for those NVML could not read."""
    unknown = {i: m for i, value in readings.items() if (m := unread(value, always_there=always_there)) is not None}
    read = [i for i, value in readings.items() if known(value)]
    if not out and read:
        text = ok + (f" on GPU {gpu_list(read)}" if unknown else "")
        out = [Finding(code.code, Status.PASS, "host", text, "", {})]
    return [unreadable_finding(code.code, label, unknown, why), *out] if unknown else out


def _compute_mode(gpus: list[Gpu]) -> list[Finding]:
    out = []
    for g in gpus:
        mode = g.compute_mode
        if not known(mode) or mode == "default":
            continue
        evidence = {"compute_mode": mode, "expected": "default"}
        if mode == "prohibited":
            out.append(
                Finding(
                    COMPUTE_MODE.code,
                    Status.FAIL,
                    gpu_subject(g.index),
                    "compute mode is 'prohibited': no process can use this GPU",
                    f"sudo nvidia-smi -i {g.index} -c DEFAULT",
                    evidence,
                )
            )
        elif isinstance(g.processes, list) and g.processes and mode.startswith("exclusive"):
            # One context per GPU, and a process already holds it: every other process fails at its first
            # CUDA call (NVIDIA/DIGITS#2005: Exclusive_Process K40m holding the DIGITS server, error 46
            # "all CUDA-capable devices are busy or unavailable").
            holders = ", ".join(f"PID {p.pid}" + (f" ({p.command})" if p.command else "") for p in g.processes[:3])
            out.append(
                Finding(
                    COMPUTE_MODE.code,
                    Status.FAIL,
                    gpu_subject(g.index),
                    f"compute mode is '{mode}' and {holders} already holds the GPU: any other process's CUDA "
                    "context fails ('all CUDA-capable devices are busy or unavailable')",
                    f"Stop the process holding GPU {g.index}, or `sudo nvidia-smi -i {g.index} -c DEFAULT` to let "
                    "several processes share it.",
                    {**evidence, "processes": [p.pid for p in g.processes]},
                )
            )
        else:
            out.append(
                Finding(
                    COMPUTE_MODE.code,
                    Status.WARN,
                    gpu_subject(g.index),
                    f"compute mode is '{mode}': one process per GPU; a rank that touches cuda:0 "
                    "before set_device makes the others fail",
                    f"sudo nvidia-smi -i {g.index} -c DEFAULT, or call torch.cuda.set_device(local_rank) "
                    "first in every rank.",
                    evidence,
                )
            )
    readings = {g.index: g.compute_mode for g in gpus}
    why = "whether every rank may use it is unknown"
    return _settle(COMPUTE_MODE, out, readings, "compute mode", "compute mode is default", why, always_there=True)


@check("gpu_modes", "MIG and compute mode", codes=MODE_CODES, needs="visible")
def gpu_modes(ctx: CheckContext) -> list[Finding]:
    gpus = target_gpus(ctx)
    return [*_mig(ctx, gpus), *_compute_mode(gpus)]


def _describe(p: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"pid": p.pid}
    if p.local_pid is not None and p.local_pid != p.pid:
        row["local_pid"] = p.local_pid
    row["user"] = p.user
    row["command"] = p.command
    row["used_memory_mib"] = p.used_memory_mib
    return row


def _process_text(p: Any) -> str:
    who = p.command.split()[0].rsplit("/", 1)[-1] if p.command else "?"
    mem = f" {p.used_memory_mib} MiB" if p.used_memory_mib is not None else ""
    user = f" ({p.user})" if p.user else ""
    return f"pid {p.pid} {who}{user}{mem}"


def _processes(gpu: Gpu, isolated: bool) -> list[Finding]:
    out: list[Finding] = []
    procs = gpu.processes
    if not known(procs):
        return out
    subject = gpu_subject(gpu.index)
    if procs:
        shown = listed([_process_text(p) for p in procs], sep="; ")
        pids = " ".join(str(p.local_pid or p.pid) for p in procs)
        out.append(
            Finding(
                PROCESSES.code,
                Status.WARN,
                subject,
                f"{len(procs)} process(es) already on this GPU: {shown}",
                f"Stop them if they are leftovers (kill {pids}), or pick other GPUs with CUDA_VISIBLE_DEVICES.",
                {"processes": [_describe(p) for p in procs], "expected": "none"},
            )
        )
    used, total = gpu.memory_used_mib, gpu.memory_total_mib
    if known(used) and known(total) and all(p.used_memory_mib is not None for p in procs):
        owned = sum(p.used_memory_mib or 0 for p in procs)
        ghost = used - owned
        limit = max(GHOST_MIN_MIB, int(total * GHOST_FRACTION))
        if ghost > limit:
            where = (
                "processes in another PID namespace (this is a container) or a zombie context"
                if isolated
                else "a process NVML does not list (another container) or a zombie context"
            )
            out.append(
                Finding(
                    GHOST_MEMORY.code,
                    Status.WARN,
                    subject,
                    f"{ghost} MiB of GPU memory in use that no listed process owns: {where}",
                    "On the host: nvidia-smi and sudo fuser -v /dev/nvidia*; kill the owner, or reset "
                    f"the GPU (sudo nvidia-smi -r -i {gpu.index}).",
                    {
                        "memory_used_mib": used,
                        "owned_by_processes_mib": owned,
                        "unaccounted_mib": ghost,
                        "threshold_mib": limit,
                    },
                )
            )
    return out


@check("gpu_processes", "GPU memory already in use", codes=PROCESS_CODES, needs="visible")
def gpu_processes(ctx: CheckContext) -> list[Finding]:
    gpus = target_gpus(ctx)
    isolated = ctx.snapshot.host.pid_namespace_isolated is True
    findings = [f for g in gpus for f in _processes(g, isolated)]
    if findings:
        return findings
    readable = [g.index for g in gpus if known(g.processes)]
    if not readable:
        return []
    return [
        Finding(
            PROCESSES.code, Status.PASS, "host", f"no processes on GPU {gpu_list(readable)}", "", {"gpus": readable}
        )
    ]
