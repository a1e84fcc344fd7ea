"""What each node sends to rank 0 in a multi-node run: the `nodes` task of the shared launch,
with this node's facts (built from its snapshot, knowledge/node_facts.py) and static findings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudoctor.checks.active.common import Plan
from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine.context import CheckContext
from gpudoctor.engine.runner import run_one
from gpudoctor.engine.selection import Selection
from gpudoctor.findings import Status
from gpudoctor.knowledge.node_facts import MAX_FORWARDED
from gpudoctor.knowledge.node_record import from_snapshot

if TYPE_CHECKING:  # launch loads when a run starts: check --quick never pays for it
    from gpudoctor.launch import Task

GPU_BYTES = 256 << 20  # large enough for NICs' plateau (nccl-tests multi-node sweeps reach 8 GiB)
CPU_BYTES = 2 << 20
ROUNDS = 3


def ranks_on_node(ctx: CheckContext, p: Plan) -> int:
    local = ctx.snapshot.env.get("LOCAL_WORLD_SIZE", "")
    return int(local) if local.isdigit() and int(local) > 0 else max(1, p.ranks)


def static_findings(ctx: CheckContext) -> list[dict[str, str]]:
    """This node's static findings that are not a pass: what rank 0 lists for the other nodes."""
    out = []
    assert ctx.registry is not None
    for chk in ctx.registry.checks.values():
        if chk.active:
            continue
        for f in run_one(chk, ctx, Selection()).findings:
            if f.status in (Status.WARN, Status.FAIL, Status.ERROR):
                out.append({"code": f.code, "status": f.status.value, "subject": f.subject, "message": f.message})
    return out[:MAX_FORWARDED]


def node_facts(ctx: CheckContext, p: Plan) -> dict[str, Any]:
    """This node's facts (knowledge/node_record.py) with its NIC capacity and static findings."""
    from gpudoctor.knowledge.network_expectation import node_capacity

    capacity = node_capacity(ctx.snapshot, target_gpus(ctx), ranks_on_node(ctx, p)) if p.device == "cuda" else None
    return from_snapshot(ctx.snapshot, capacity.to_json() if capacity else None, static_findings(ctx))


def task(ctx: CheckContext, p: Plan) -> Task:
    """The `nodes` task of the shared launch (active_common.tasks_for adds it under a launcher)."""
    from gpudoctor.launch import Task

    facts = node_facts(ctx, p)
    capacity = facts.get("capacity") or {}
    return Task(
        "nodes",
        {
            "facts": facts,
            "bytes": GPU_BYTES if p.device == "cuda" else CPU_BYTES,
            "warmup": 2 if p.device == "cuda" else 1,
            "iters": 10 if p.device == "cuda" else 7,
            "rounds": ROUNDS,
            "expected_gbps": capacity.get("expected_gbps"),
            "low_ratio": ctx.options.busbw_warn_ratio,
        },
    )
