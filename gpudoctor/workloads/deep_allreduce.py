"""Level 3: a long all-reduce run whose every result is checked exactly, on every rank.

Each iteration fills rank r's buffer with v * (r + 1), where v is a small integer pattern that
changes with the iteration (v in [-63, 63], so every partial sum is an integer well below 2^24
and exact in float32 in any order of reduction, for up to 700 ranks). The sum must be
v * n(n+1)/2 element for element; each rank counts the elements that differ (nccl-tests'
#wrong) and keeps the first. At the end each rank takes a digest of its last result
(deep_common.digest): all ranks must hold the same bits. The number of iterations is sized
from the first ones to fill `seconds`, and agreed by all ranks (the slowest rank's estimate).

params: "seconds", "bytes" (per device type: {"cuda": 256 MiB, "cpu": 1 MiB}).
"""

from __future__ import annotations

import time
from typing import Any

from gpudoctor.workloads.deep_common import device_info, digest, flip_bit, gather_rows
from gpudoctor.workloads.rank import RankContext

PATTERN = 127  # v = ((i * 131 + iteration * 17) % 127) - 63


def run(ctx: RankContext, params: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    seconds = float(params["seconds"])
    nbytes = int(params.get("bytes", {}).get(ctx.device.type, (1 << 20) if ctx.device.type == "cpu" else 256 << 20))
    count = max(1024, nbytes // 4)
    world = ctx.world_size
    scale = world * (world + 1) / 2
    index = torch.arange(count, dtype=torch.int64, device=ctx.device)
    buf = torch.empty(count, dtype=torch.float32, device=ctx.device)
    sdc = ctx.faults.has("sdc")

    def pattern(iteration: int) -> Any:
        return ((index * 131 + iteration * 17) % PATTERN - PATTERN // 2).to(torch.float32)

    wrong_iterations, wrong_elements, first = 0, 0, None

    def one(iteration: int) -> None:
        nonlocal wrong_iterations, wrong_elements, first
        v = pattern(iteration)
        buf.copy_(v * (ctx.rank + 1))
        dist.all_reduce(buf)
        if sdc and iteration >= 1:
            flip_bit(buf, 4099, 20)  # the fault: one bit of this rank's result
        bad = buf != v * scale
        wrong = int(bad.sum().item())
        if wrong:
            wrong_iterations += 1
            wrong_elements += wrong
            if first is None:
                at = int(torch.nonzero(bad)[0].item())
                first = {
                    "iteration": iteration,
                    "index": at,
                    "expected": float(v[at].item() * scale),
                    "got": float(buf[at].item()),
                    "wrong": wrong,
                }

    t0 = time.perf_counter()
    for it in range(2):
        one(it)
    per = (time.perf_counter() - t0) / 2
    # Every rank must run the same number of all-reduces: agree on the slowest rank's estimate.
    plan = torch.tensor([max(3.0, seconds / max(per, 1e-6))], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(plan, op=dist.ReduceOp.MIN)
    iterations = int(plan.item())
    for it in range(2, iterations):
        one(it)
    ctx.sync()
    mine = {
        **device_info(ctx),
        "iterations": iterations,
        "bytes": count * 4,
        "seconds": round(time.perf_counter() - t0, 3),
        "wrong_iterations": wrong_iterations,
        "wrong_elements": wrong_elements,
        "first": first,
        "digest": digest(buf),
    }
    rows = gather_rows(mine, world)
    return {"rows": rows, "bytes": count * 4, "iterations": iterations, "dtype": "float32", "op": "sum"}
