"""The active checks' one launch: all-reduce, the other collectives, DDP and, under torchrun/srun,
the cross-node task, in ONE set of ranks and process group (one spawn, one torch import per rank).

The check runner calls `start_active_run` once per check run, when the first active check reads
`ctx.run("active")`; what it starts is planned from the whole run (the options and ctx.planned),
so it is the same whichever check asks first.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpudoctor.checks.active.common import plan, tasks_for, world_size
from gpudoctor.checks.active.node_task import task as nodes_task
from gpudoctor.engine.context import CheckContext
from gpudoctor.knowledge.busbw import parse_ops

if TYPE_CHECKING:  # launch (and its dataclasses) loads when a run starts: check --quick never pays for it
    from gpudoctor.launch import LaunchResult

RUN = "active"


def start_active_run(ctx: CheckContext) -> LaunchResult | None:
    """The launch of this check run, or None when the plan runs nothing (the checks give its skip)."""
    p = plan(ctx)
    if p.skip:
        return None
    from gpudoctor.launch import launch, torchrun_env

    world = world_size(ctx, p)
    tasks = tasks_for(p, world, ctx.options.timeout_s, parse_ops(",".join(ctx.options.collectives or ())))
    if torchrun_env(os.environ) and world >= 2:
        tasks.append(nodes_task(ctx, p))  # facts gather, inter-node all-reduce, slow-node isolation
    return launch(
        tasks,
        device=p.device,
        ranks=p.ranks,
        timeout_s=ctx.options.timeout_s,
        gpus=p.gpus,
        gpu_uuids=p.uuids,
        progress=ctx.progress,
        python=ctx.options.python,
    )
