"""All-reduce bandwidth sweep inside a rank, with nccl-tests' definitions.

algbw = bytes / time (decimal GB/s), busbw = algbw * 2(n-1)/n. Each size is first verified
(every element must equal the exact sum; the count of wrong elements is nccl-tests' #wrong),
then warmed up and timed with the device synchronised. The time per size is the slowest rank's.
"""

from __future__ import annotations

import time
from typing import Any

from gpudoctor.workloads.rank import RankContext

# 64 row offsets make misplaced chunks visible, not only missing contributions.
_ROWS = 64


def busbw_factor(world: int) -> float:
    return 2.0 * (world - 1) / world


def _fits(ctx: RankContext, sizes: list[int]) -> tuple[list[int], list[int]]:
    """Sizes whose buffers fit in every rank's free GPU memory (input + verification mask)."""
    import torch
    import torch.distributed as dist

    if ctx.device.type != "cuda":
        return sizes, []
    free, _ = torch.cuda.mem_get_info(ctx.device)
    t = torch.tensor([float(free)], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    budget = t.item() * 0.8
    return [s for s in sizes if s * 1.5 < budget], [s for s in sizes if s * 1.5 >= budget]


def run(ctx: RankContext, params: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    n = ctx.world_size
    sizes, skipped = _fits(ctx, [int(s) for s in params["sizes"]])
    warmup = int(params.get("warmup", 2))
    iters = int(params.get("iters", 5))
    budget_bytes = float(params.get("bytes_per_size", 4e9))  # fewer iterations for huge sizes
    offsets = (torch.arange(_ROWS, dtype=torch.float32, device=ctx.device) % 8).unsqueeze(1)
    rows = []
    for size in sizes:
        count = size // 4
        ctx.progress(f"all-reduce {size} bytes")
        buf = torch.empty(count, dtype=torch.float32, device=ctx.device)
        view = buf.view(_ROWS, -1)
        view.copy_((offsets + (ctx.rank + 1)).expand_as(view))
        if ctx.faults.has("wrongsum"):
            buf[0] += 1.0
        dist.all_reduce(buf)
        expected = offsets * n + n * (n + 1) / 2
        wrong = (view != expected).sum().to(torch.float64)

        for _ in range(warmup):
            dist.all_reduce(buf)
        reps = max(1, min(iters, int(budget_bytes // max(size, 1))))
        ctx.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(buf)
        ctx.sync()
        elapsed = (time.perf_counter() - t0) / reps
        stats = torch.tensor([elapsed, 0.0], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        wrong_all = wrong.reshape(1)
        dist.all_reduce(wrong_all)
        seconds = stats[0].item()
        algbw = size / seconds / 1e9
        rows.append(
            {
                "bytes": size,
                "count": count,
                "iters": reps,
                "time_us": round(seconds * 1e6, 3),
                "algbw_gbps": round(algbw, 6),
                "busbw_gbps": round(algbw * busbw_factor(n), 6),
                "wrong": int(wrong_all.item()),
            }
        )
        del buf, view
    return {
        "rows": rows,
        "skipped_sizes": skipped,
        "world_size": n,
        "dtype": "float32",
        "op": "sum",
        "backend": ctx.backend,
        "device": ctx.device.type,
        "busbw_factor": busbw_factor(n),
    }
