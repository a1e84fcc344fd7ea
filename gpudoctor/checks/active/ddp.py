"""GD7 (DDP): a real DistributedDataParallel run in spawned ranks, and why a rank failed.

Active: runs in the same ranks and process group as the all-reduce sweep (active_common).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpudoctor.checks.active.common import Plan, describe, failure_hint, plan, rank_table, skip_finding
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status

if TYPE_CHECKING:  # launch (and its dataclasses) is imported when a run starts: check --quick never pays for it
    from gpudoctor.launch import LaunchResult, RankOutcome
    from gpudoctor.launch.workload_results import DdpResult

JOINED = Code(
    "GD701",
    "ddp-ranks-joined",
    "Every rank joins the process group in time",
    what="Starts one rank per visible GPU (or N CPU ranks with gloo), each setting its device before "
    "touching CUDA, and has them join one torch.distributed process group with a short timeout. "
    "Reports each rank's time to join and step time.",
    why="A rank that cannot join makes every other rank wait in init_process_group until the "
    "(often 30-minute) timeout; knowing which rank and GPU failed saves the guesswork.",
    fix="Read the rank's error in the finding's evidence; the other GD7 findings name known causes "
    "(port in use, fabric manager, /dev/shm, exclusive compute mode). Re-run with a longer "
    "`--timeout` on a slow, cold machine.",
)
SHARDS = Code(
    "GD702",
    "ddp-sampler-shards",
    "DistributedSampler shards are disjoint and cover the dataset",
    what="Gathers the indices each rank's DistributedSampler yields and checks that no index is "
    "seen by two ranks and that every index is seen.",
    why="Overlapping shards train on duplicates and skew the epoch; missing indices silently drop "
    "data. Both come from a wrong rank/world size reaching the sampler.",
    fix="Build the sampler with the process group's rank and world size "
    "(`DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank())`) and call "
    "`set_epoch` every epoch.",
)
PARAMS = Code(
    "GD703",
    "ddp-params-identical",
    "Every rank ends the steps with bit-identical parameters",
    what="Starts each rank from different weights, trains a few DDP steps, then compares every "
    "rank's parameters bit for bit with rank 0's.",
    why="DDP must broadcast rank 0's weights at start and apply the same averaged gradient on every "
    "rank; diverging replicas mean the ranks train different models.",
    fix="Do not modify parameters outside the optimizer step on one rank only; keep the model's "
    "structure and buffers the same on every rank; check for non-deterministic parameter "
    "registration order.",
)
GRADIENT = Code(
    "GD704",
    "ddp-gradient-average",
    "DDP's averaged gradient equals the gradient of the whole batch",
    what="Compares DDP's averaged gradient after the first step with the gradient one process "
    "computes on the union of all ranks' batches (float64), and recomputes each rank's own "
    "share to name a rank that sent a wrong gradient.",
    why="A wrong gradient (a faulty GPU, a broken reduction, a bad custom comm hook) trains a "
    "slightly wrong model without any error message.",
    fix="Re-run to see whether the same rank/GPU is named again; if so run the health checks "
    "(GD8) and a GPU memory test on that GPU, and remove custom comm hooks while testing.",
)
LOSS = Code(
    "GD705",
    "ddp-loss-decreases",
    "The loss goes down over the sanity steps",
    what="Trains a small regression model a few SGD steps and compares the group's mean loss at "
    "the first and the last step.",
    why="If the loss does not fall on a trivially learnable problem, updates are not being applied "
    "coherently across ranks.",
    fix="Look at GD703/GD704 first; a rank sending wrong gradients usually explains it.",
)
SHUTDOWN = Code(
    "GD706",
    "ddp-clean-shutdown",
    "The process group shuts down cleanly",
    what="After the steps every rank meets in a last collective and destroys the process group.",
    why="Ranks that cannot leave the group hang at exit and keep GPUs and ports busy.",
    fix="Call `dist.destroy_process_group()` at the end of training; look for a rank stuck in a collective (GD711).",
)
RANK_FAILED = Code(
    "GD710",
    "rank-failed",
    "A rank failed or exited during the active checks",
    what="Watches every spawned rank; a rank that raised an error or exited names itself, its GPU "
    "and the phase it was in.",
    why="One failing rank blocks all others in the next collective; the first failure is the one "
    "to fix, the others' errors are its consequences.",
    fix="Read the rank's error and log tail in the evidence. On GPU ranks, run that GPU alone "
    "(`CUDA_VISIBLE_DEVICES=<its UUID> gpudoctor check --select ddp`) to see whether the failure follows the "
    "GPU; on CPU ranks (--device cpu) the cause is the software setup (the torch install, memory, /dev/shm, "
    "the temporary directory the ranks meet in), not a GPU. When the ranks' sockets were open to other local "
    "users (no private network namespace: the finding says so), a lost connection may be another process's "
    "doing: no rank is blamed for it; re-run, and see `launch.isolation` in the evidence.",
)
RANK_TIMEOUT = Code(
    "GD711",
    "rank-timeout",
    "A rank did not answer before the deadline",
    what="Every phase of the active checks has a deadline (`--timeout` is the whole; importing torch "
    "may take all of it, and the ranks must join within 60% of it once every rank has imported). "
    "At expiry the ranks are terminated, then killed, and the ranks that got least far are named "
    "with what they had not done: finish importing torch, join the process group, or answer.",
    why="A rank that hangs in a collective is what turns into a 30-minute NCCL watchdog timeout in training.",
    fix="Look at the named rank's GPU: stray processes (GD8), P2P/ACS issues on PCIe machines "
    "(GD4), a busy GPU. A slow first start on a cold machine may only need a longer `--timeout`.",
)
PORT_IN_USE = Code(
    "GD712",
    "rendezvous-port-in-use",
    "The rendezvous port is free",
    what="Recognises 'Address already in use' raised while the ranks join (under torchrun/srun, the "
    "launcher's MASTER_PORT). On one node gpudoctor's ranks meet in a private file, not on a port; "
    "GD221 names the holder of a busy MASTER_PORT for your training.",
    why="c10d fails with `DistNetworkError ... errno: 98 - Address already in use` when a previous "
    "run (or another job) still holds the port.",
    fix="Choose a free port or stop the process holding it (GD221 names it); with torchrun use "
    "`--rdzv-endpoint localhost:0` on one node, or a free `--master-port`.",
)
FABRIC = Code(
    "GD713",
    "cuda-802-fabric-manager",
    "CUDA initialises (no error 802)",
    what="Recognises CUDA error 802 ('system not yet initialized') while a rank sets its device.",
    why="On NVSwitch systems (HGX/DGX) CUDA refuses to start until nvidia-fabricmanager has "
    "configured the fabric; torch then sees no GPU.",
    fix="Start the fabric manager, matching the driver version exactly: "
    "`sudo systemctl enable --now nvidia-fabricmanager`; check `nvidia-smi -q | grep -A2 Fabric`.",
)
SHM = Code(
    "GD714",
    "nccl-shm-too-small",
    "NCCL can allocate its shared memory",
    what="Recognises NCCL's shared-memory errors ('posix_fallocate failed', 'Error while creating "
    "shared memory segment') in a rank's error or log.",
    why="Containers get a 64 MiB /dev/shm by default; NCCL's intra-node transport needs more and "
    "fails with 'unhandled system error' or a bus error.",
    fix="Give the container more shared memory: `docker run --shm-size=1g --ulimit memlock=-1` (or "
    "`--ipc=host`); in Kubernetes mount an emptyDir with medium: Memory at /dev/shm.",
)
BUSY = Code(
    "GD715",
    "cuda-devices-busy",
    "The GPU accepts this process (not held in exclusive mode)",
    what="Recognises 'all CUDA-capable devices are busy or unavailable' while a rank sets its device.",
    why="A GPU in EXCLUSIVE_PROCESS compute mode accepts one process; a second process (or a rank "
    "that touched cuda:0 before set_device) is refused.",
    fix="Free the GPU (see its processes), or set the default compute mode: "
    "`sudo nvidia-smi -i <gpu> -c DEFAULT`; in your code call `torch.cuda.set_device(local_rank)` "
    "before anything touches CUDA.",
)
OOM = Code(
    "GD716",
    "cuda-out-of-memory",
    "The ranks have enough GPU memory for the sanity run",
    what="Recognises CUDA out-of-memory errors raised inside a rank.",
    why="The sanity run needs little memory; running out means other processes hold the GPU.",
    fix="Stop the processes holding the GPU's memory (see the process findings) and re-run.",
)

CODES = [
    JOINED,
    SHARDS,
    PARAMS,
    GRADIENT,
    LOSS,
    SHUTDOWN,
    RANK_FAILED,
    RANK_TIMEOUT,
    PORT_IN_USE,
    FABRIC,
    SHM,
    BUSY,
    OOM,
]

# The command a failed rank's hint suggests re-running with its GPU alone.
RERUN = "gpudoctor check --select ddp"
INTERFERENCE_HINT = (
    "Re-run. If it repeats, run where other users cannot reach this machine's loopback: gpudoctor puts one node's "
    "CPU ranks in a private network namespace where the kernel allows unprivileged user namespaces "
    "(`launch.isolation` in the evidence says why it could not)."
)
MAY_BE_INTERFERENCE = " (may be interference: the ranks' sockets were open to other local users)"
# known_errors kind -> the code that explains it
KIND_CODE = {"port_in_use": PORT_IN_USE, "fabric_manager": FABRIC, "shm": SHM, "devices_busy": BUSY, "oom": OOM}


def rank_subject(r: RankOutcome) -> str:
    return f"rank:{r.rank}"


def failure_findings(result: LaunchResult, p: Plan) -> list[Finding]:
    """The findings that explain why ranks did not finish: the cause first, named by rank and GPU.
    `p` says where the ranks ran, so a hint never sends a CPU rank's failure to a GPU."""
    if result.setup_error is not None:
        err = result.setup_error
        code = KIND_CODE.get(err["kind"], RANK_FAILED)
        return [Finding(code.code, Status.FAIL, "host", err["message"], code.fix, dict(err))]
    out = []
    suspects = result.suspects()
    victims = [r for r in result.failed_ranks() if r not in suspects]
    interference = result.interference()
    if interference and not suspects:  # only lost connections: nobody's fault that can be told
        evidence = {"failed_ranks": [r.rank for r in victims], "isolation": result.isolation}
        message = f"the ranks did not finish: {interference}"
        out.append(Finding(RANK_FAILED.code, Status.FAIL, "host", message, INTERFERENCE_HINT, evidence))
    for r in suspects:
        evidence = {
            "rank": r.rank,
            "gpu": r.gpu,
            "state": r.state,
            "phase": r.phase,
            "error": r.error[:1000],
            "exit_code": r.exit_code,
            "log_tail": r.log_tail[-1500:],
            "others_stopped": [v.rank for v in victims],
        }
        # A known cause (OOM, a busy port, ...) is said as it is; a hang or an unexplained error
        # may be another local process's doing.
        suffix = MAY_BE_INTERFERENCE if interference else ""
        if interference:
            evidence["interference"] = interference
        code = KIND_CODE.get(r.error_kind or "")
        if code is not None:
            out.append(Finding(code.code, Status.FAIL, rank_subject(r), f"{r.label}: {r.error}", code.fix, evidence))
        elif r.state == "hung":
            evidence["deadline_s"] = result.deadline_s
            evidence["timed_out"] = result.timed_out
            what = r.hang_reason()
            out.append(
                Finding(
                    RANK_TIMEOUT.code,
                    Status.FAIL,
                    rank_subject(r),
                    f"{r.label} {what} within the {result.deadline_s:g} s deadline (last phase: {r.phase}){suffix}",
                    RANK_TIMEOUT.fix if p.device == "cuda" else failure_hint(p, r, RERUN),
                    evidence,
                )
            )
        else:
            out.append(
                Finding(
                    RANK_FAILED.code,
                    Status.FAIL,
                    rank_subject(r),
                    f"{r.label} failed: {r.error}{suffix}",
                    failure_hint(p, r, RERUN),
                    evidence,
                )
            )
    return out


@check("ddp", "DDP sanity run", codes=CODES, active=True, shares="active")
def ddp_sanity(ctx: CheckContext) -> tuple[list[Finding], dict]:
    p = plan(ctx)
    if p.skip:
        return [skip_finding(ctx, CODES[0], p, "DDP sanity run")], {}
    result = ctx.run("active")
    # The ranks ran every active check in one process group: say how long that run took, since
    # this check's own time is ~0 when another active check started the run.
    details = (
        {"tables": [rank_table(result)], "launch": result.to_json(), "shared_run_s": round(result.elapsed_s, 3)}
        if result.ranks
        else {}
    )
    findings = failure_findings(result, p)
    joined = [r for r in result.ranks if r.join_s is not None]
    if result.ranks:
        status = Status.PASS if len(joined) == len(result.ranks) else Status.FAIL
        slowest = f" (slowest {max(r.join_s or 0.0 for r in joined):.2f} s)" if joined else ""
        findings.insert(
            0,
            Finding(
                JOINED.code,
                status,
                "host",
                f"{len(joined)}/{len(result.ranks)} rank(s) joined the {result.backend} group{slowest}"
                + (
                    ""
                    if status is Status.PASS
                    else f"; not joined: {describe([r for r in result.ranks if r.join_s is None])}"
                ),
                "" if status is Status.PASS else JOINED.fix,
                {"ranks": [r.to_json() for r in result.ranks], "rendezvous": result.rendezvous},
            ),
        )
    data = result.results("ddp")
    if data is None:
        return findings, details
    findings += _verdicts(result, data)
    return findings, details


def _verdicts(result: LaunchResult, data: DdpResult) -> list[Finding]:
    out = []
    sh = data["shards"]
    ok = sh["overlap"] == 0 and sh["missing"] == 0
    out.append(
        Finding(
            SHARDS.code,
            Status.PASS if ok else Status.FAIL,
            "host",
            f"sampler shards of {sh['dataset']} samples are disjoint and cover the dataset"
            if ok
            else f"sampler shards overlap by {sh['overlap']} and miss {sh['missing']} of {sh['dataset']} samples",
            "" if ok else SHARDS.fix,
            sh,
        )
    )
    differ = data["params_differ_ranks"]
    out.append(
        Finding(
            PARAMS.code,
            Status.FAIL if differ else Status.PASS,
            "host",
            f"parameters differ from rank 0's on rank(s) {differ}"
            if differ
            else f"parameters bit-identical on all {result.world_size} rank(s) after {data['steps']} steps",
            PARAMS.fix if differ else "",
            {"differ_ranks": differ},
        )
    )
    evidence = {
        "max_abs_diff": data["grad_max_abs_diff"],
        "tolerance": data["grad_tolerance"],
        "bad_ranks": data["bad_gradient_ranks"],
    }
    if data["grad_ok"] and not data["bad_gradient_ranks"]:
        out.append(
            Finding(
                GRADIENT.code,
                Status.PASS,
                "host",
                f"DDP's averaged gradient equals the whole-batch gradient (max diff {data['grad_max_abs_diff']:.1e})",
                "",
                evidence,
            )
        )
    else:
        by_rank = {r.rank: r for r in result.ranks}
        for bad in data["bad_gradient_ranks"] or [None]:
            who = by_rank[bad].label if bad in by_rank else (f"rank {bad}" if bad is not None else "a rank")
            out.append(
                Finding(
                    GRADIENT.code,
                    Status.FAIL,
                    f"rank:{bad}" if bad is not None else "host",
                    f"{who} sent a wrong gradient: DDP's average differs from the whole-batch gradient "
                    f"by {data['grad_max_abs_diff']:.3g}",
                    GRADIENT.fix,
                    evidence,
                )
            )
    down = data["loss_last"] < data["loss_first"]
    out.append(
        Finding(
            LOSS.code,
            Status.PASS if down else Status.FAIL,
            "host",
            f"loss {data['loss_first']:.4g} -> {data['loss_last']:.4g} over {data['steps']} steps"
            + ("" if down else " (did not go down)"),
            "" if down else LOSS.fix,
            {"loss_first": data["loss_first"], "loss_last": data["loss_last"]},
        )
    )
    if result.ok:
        slowest = max(r.shutdown_s or 0.0 for r in result.ranks)
        out.append(
            Finding(
                SHUTDOWN.code,
                Status.PASS,
                "host",
                f"process group shut down cleanly on every rank ({slowest:.2f} s)",
                "",
                {"shutdown_s": slowest},
            )
        )
    else:
        stuck = result.failed_ranks()
        out.append(
            Finding(
                SHUTDOWN.code,
                Status.FAIL,
                "host",
                f"the process group did not shut down cleanly on {describe(stuck)}",
                SHUTDOWN.fix,
                {"ranks": [r.to_json() for r in stuck]},
            )
        )
    return out
