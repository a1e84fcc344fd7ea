"""What the active checks share: where the ranks run, and one launch for all of them.

The all-reduce sweep and the DDP sanity run go into the SAME ranks and process group (one
spawn, one torch import per rank): the run the check runner starts once (checks/active/run.py)
and hands to every active check that reads `ctx.run("active")` (and to the report's node rows).
Not a check module: it is not in gpudoctor.checks.MODULES.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudoctor.engine.codes import Code
from gpudoctor.engine.context import CheckContext
from gpudoctor.engine.runner import missing_gpus
from gpudoctor.findings import Finding, Status
from gpudoctor.snapshot import Missing

if TYPE_CHECKING:  # launch (and its dataclasses) loads when a run starts: check --quick never pays for it
    from gpudoctor.launch import LaunchResult, RankOutcome, Task

# Sweeps: nccl-tests-like sizes on GPUs, small on CPU. NVLink machines keep rising past 1 GiB
# (sjeaugey, nccl-tests#149: "At 512M the bandwidth is still increasing, so you should replace
# `1G` by `8G`"; 8x A100 229 GB/s at 1 GiB, 235 at 8 GiB: superbench-results NDmv4), so the GPU
# sweep goes to 8 GiB, as far as free memory (workloads/allreduce.py) and its time budget allow,
# and stops early once busbw has flattened (the plateau rule below, a heuristic).
CUDA_SIZES = [8 << 20 << i for i in range(11)]  # 8 MiB .. 8 GiB, x2
CPU_SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20]  # 64 KiB .. 4 MiB, x4
# Stop once a size >= 1 GiB gains less than 3% over the size before it: the curve has flattened
# (ml-engineering's 8x A100 sweep: +1.0% from 1 to 2 GiB, +0.3% from 4 to 8 GiB).
PLATEAU = {"from_bytes": 1 << 30, "gain": 0.03}
# The GPU sweep's share of the active checks' deadline (which also covers importing torch,
# joining and the DDP run): a heuristic; the sweep ends before a size predicted to overrun it.
SWEEP_SHARE = 0.3
COLLECTIVE_CUDA_SIZES = CUDA_SIZES[:8]  # 8 MiB .. 1 GiB: `check --collectives`
PAIR_BYTES_CUDA, PAIR_BYTES_CPU = 256 << 20, 1 << 20  # send/recv per pair (--collectives sendrecv)


@dataclass(frozen=True)
class Plan:
    device: str  # "cuda" or "cpu"
    ranks: int  # ranks on this node (world size unless under torchrun)
    gpus: list[int]  # NVML index per local rank (cuda)
    skip: str = ""  # why nothing runs ("" when it runs)
    uuids: list[str] | None = None  # the same GPUs' UUIDs (MIG instance UUIDs under MIG), rank order
    # The finding that says why nothing runs (GD002 no torch, GD101 no driver, GD201 none visible):
    # the runner shows it when the selection hid it (`--select GD601` on a node whose driver is gone).
    see: str = ""


def plan(ctx: CheckContext) -> Plan:
    """Where the ranks run. Without a GPU and --device cuda, `no_gpu_skip` gives the finding."""
    opts = ctx.options
    if isinstance(ctx.snapshot.software.torch, Missing) and ctx.snapshot.software.torch.reason == "unsupported":
        device = "cpu" if opts.device == "cpu" else "cuda"
        return Plan(device, 0, [], "PyTorch is not installed: see GD002", see="GD002")
    visible = ctx.visible
    gpus = list(visible.nvml_indices) if ctx.snapshot.driver.nvml_status == "ok" else []
    from gpudoctor.launch import choose_device

    device, why_not = choose_device(opts.device, len(gpus))  # the rule `bench` uses too
    if device == "cpu":
        return Plan("cpu", opts.ranks or 2, [])
    if not device:
        see = "GD101" if ctx.snapshot.driver.nvml_status != "ok" or not ctx.snapshot.gpus else "GD201"
        return Plan("cuda" if opts.device == "cuda" else "cpu", 0, [], why_not, see=see)
    if any(d.mig is not None for d in visible.devices) and len(gpus) > 1 and not opts.allow_mig:
        return Plan("cuda", 0, gpus, "MIG instances cannot join one multi-GPU process group (see GD3 findings)")
    return Plan("cuda", len(gpus), gpus, uuids=[d.uuid for d in visible.devices])


def skip_finding(ctx: CheckContext, code: Code, p: Plan, what: str) -> Finding:
    """The skip for a plan that runs nothing: with --device cuda and no GPU, the runner's uniform
    "no GPUs" skip (as `needs="visible"` gives); otherwise `what` skipped and the plan's reason."""
    if p.device == "cuda" and not p.gpus:
        uniform = missing_gpus(code.code, "visible", ctx)
        if uniform is not None:
            return uniform
    evidence = {"see": p.see} if p.see else {}
    return Finding(code.code, Status.SKIP, "host", f"{what} skipped: {p.skip}", evidence=evidence)


def world_size(ctx: CheckContext, p: Plan) -> int:
    from gpudoctor.launch import launcher_env

    launcher = launcher_env(os.environ)  # read and checked before any check runs (api.check)
    return launcher.world_size if launcher is not None else p.ranks


def collectives_params(p: Plan, collectives: tuple[str, ...]) -> dict[str, Any]:
    """`check --collectives`: 8 MiB .. 1 GiB on GPUs (the whole curve is `bench collectives`'s, so
    the check keeps within its deadline beside the all-reduce sweep), the CPU sweep on CPU."""
    cuda = p.device == "cuda"
    return {
        "ops": [op for op in collectives if op != "sendrecv"],
        "sizes": COLLECTIVE_CUDA_SIZES if cuda else CPU_SIZES,
        "warmup": 5 if cuda else 1,
        "iters": 20 if cuda else 3,
        "pair_bytes": (PAIR_BYTES_CUDA if cuda else PAIR_BYTES_CPU) if "sendrecv" in collectives else 0,
    }


def tasks_for(p: Plan, world: int, timeout_s: float = 120.0, collectives: tuple[str, ...] = ()) -> list[Task]:
    from gpudoctor.launch import Task

    tasks = []
    if world >= 2:
        if p.device == "cuda":
            params: dict[str, Any] = {
                "sizes": CUDA_SIZES,
                "warmup": 5,
                "iters": 20,
                "plateau": PLATEAU,
                "budget_s": timeout_s * SWEEP_SHARE,
            }
        else:
            params = {"sizes": CPU_SIZES, "warmup": 1, "iters": 3}
        tasks.append(Task("allreduce", params))
        if collectives:  # check --collectives: a sweep for each, send/recv per pair
            tasks.append(Task("collectives", collectives_params(p, collectives)))
    tasks.append(Task("ddp", {"batch": 8, "steps": 5}))
    return tasks


def rank_table(result: LaunchResult) -> dict[str, Any]:
    rows = []
    for r in sorted(result.ranks, key=lambda r: r.rank):
        ddp = r.result("ddp")
        step = ddp.get("step_s_mean") if ddp else None
        rows.append(
            [
                r.rank,
                "-" if r.gpu is None else r.gpu,
                r.host or "-",
                r.state,
                "-" if r.join_s is None else f"{r.join_s:.2f}",
                "-" if step is None else f"{step * 1000:.1f}",
                r.phase,
            ]
        )
    return {
        "title": f"ranks ({result.backend}, {result.elapsed_s:.1f} s)",
        "columns": ["rank", "gpu", "host", "state", "join s", "step ms", "last phase"],
        "rows": rows,
    }


def describe(ranks: list[RankOutcome]) -> str:
    return ", ".join(r.label for r in ranks)


def failure_hint(p: Plan, r: RankOutcome, rerun: str) -> str:
    """What to do about a rank that failed or hung, worded for the device it ran on: on a GPU, run
    `rerun` (a gpudoctor command line) with that GPU alone to see whether the failure follows it; on
    CPU ranks there is no GPU to blame. Shared by the active (GD710) and the deep checks."""
    slow = " If the machine is merely slow, a longer --timeout lets it finish." if r.state == "hung" else ""
    if p.device != "cuda" or r.gpu is None:
        return (
            "Read the rank's error and log tail in the evidence. These ranks ran on the CPU (--device cpu), so "
            "the cause is the software setup (the torch install, memory, /dev/shm, the temporary directory the "
            "ranks meet in, "
            f"GPUDOCTOR_FAULT), not a GPU.{slow}"
        )
    uuids = p.uuids or []
    where = p.gpus.index(r.gpu) if r.gpu in p.gpus else -1
    select = f"CUDA_VISIBLE_DEVICES={uuids[where]}" if 0 <= where < len(uuids) else f"CUDA_VISIBLE_DEVICES={r.gpu}"
    return (
        f"Read the rank's error and log tail in the evidence; run `{select} {rerun}` with GPU {r.gpu} alone to "
        f"see whether the failure follows the GPU.{slow}"
    )


def not_run_message(result: LaunchResult, what: str) -> str:
    """Why a task of the shared launch gave no result: "<what> did not start/complete: ..."."""
    if result.setup_error is not None:
        return f"{what} did not start: {result.setup_error['message']}"
    msg = f"{what} did not complete: {describe(result.suspects()) or 'a rank'} failed"
    first = next(iter(result.suspects()), None)
    if first is not None and first.error:
        msg += f" ({first.error[:200]})"
    return msg
