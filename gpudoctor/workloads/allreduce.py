"""All-reduce bandwidth sweep inside a rank, with nccl-tests' definitions.

algbw = bytes / time (decimal GB/s), busbw = algbw * 2(n-1)/n. Each size is first verified
(every element must equal the exact sum; the count of wrong elements is nccl-tests' #wrong),
then warmed up and timed with the device synchronised. The time per size is the slowest rank's.

Verification also checks each rank's own contribution against the pattern it was meant to send,
so a wrong sum names the rank that put the wrong values in (or says every input was right and
the reduction itself went wrong).

Optional stops (the check uses them, `bench` does not): `budget_s` ends the sweep before a size
whose predicted time would pass the budget; `plateau` ends it once busbw stops rising (a size at
or above `from_bytes` gains less than `gain` over the size before it). Every decision is made
from the all-reduced (slowest-rank) times, so all ranks stop at the same size.
"""

from __future__ import annotations

import time
from typing import Any

from gpudoctor.knowledge.busbw import figure
from gpudoctor.launch.workload_results import AllreduceResult, AllreduceRow
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


def _runs(size: int, warmup: int, iters: int, budget_bytes: float) -> tuple[int, int]:
    """Warm-ups and timed iterations for one size: fewer for huge sizes (one pass of 8 GiB on
    NVLink already takes tens of milliseconds), never below one of each."""
    cap = max(1, int(budget_bytes // max(size, 1)))
    return min(warmup, cap), max(1, min(iters, cap))


def _verify(ctx: RankContext, buf: Any, view: Any, offsets: Any, n: int) -> tuple[int, list[int], list[int]]:
    """One all-reduce of a known pattern: (#wrong elements over all ranks, wrong elements each rank
    received, ranks whose own contribution differed from the pattern they were meant to send)."""
    import torch
    import torch.distributed as dist

    mine = offsets + (ctx.rank + 1)
    view.copy_(mine.expand_as(view))
    if ctx.faults.has("wrongsum"):
        buf[0] += 1.0
    sent_wrong = (view != mine).sum().to(torch.float64)
    dist.all_reduce(buf)
    got_wrong = (view != offsets * n + n * (n + 1) / 2).sum().to(torch.float64)
    table = torch.zeros(n, 2, dtype=torch.float64, device=ctx.device)
    table[ctx.rank, 0] = sent_wrong
    table[ctx.rank, 1] = got_wrong
    dist.all_reduce(table)
    received = [int(v) for v in table[:, 1].tolist()]
    bad_inputs = [r for r, v in enumerate(table[:, 0].tolist()) if v > 0]
    return sum(received), received, bad_inputs


def run(ctx: RankContext, params: dict[str, Any]) -> AllreduceResult:
    import torch
    import torch.distributed as dist

    n = ctx.world_size
    sizes, skipped = _fits(ctx, [int(s) for s in params["sizes"]])
    warmup = int(params.get("warmup", 2))
    iters = int(params.get("iters", 5))
    budget_bytes = float(params.get("bytes_per_size", 4e9))  # fewer iterations for huge sizes
    budget_s = params.get("budget_s")
    plateau = params.get("plateau")
    offsets = (torch.arange(_ROWS, dtype=torch.float32, device=ctx.device) % 8).unsqueeze(1)
    rows: list[AllreduceRow] = []
    spent = 0.0
    stopped = ""
    unswept: list[int] = []
    for i, size in enumerate(sizes):
        count = size // 4
        ctx.progress(f"all-reduce {size} bytes")
        buf = torch.empty(count, dtype=torch.float32, device=ctx.device)
        view = buf.view(_ROWS, -1)
        wrong, received, bad_inputs = _verify(ctx, buf, view, offsets, n)

        warm, reps = _runs(size, warmup, iters, budget_bytes)
        for _ in range(warm):
            dist.all_reduce(buf)
        ctx.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(buf)
        ctx.sync()
        elapsed = (time.perf_counter() - t0) / reps
        stats = torch.tensor([elapsed], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        seconds = stats[0].item()
        algbw = size / seconds / 1e9
        row: AllreduceRow = {
            "bytes": size,
            "count": count,
            "iters": reps,
            "time_us": round(seconds * 1e6, 3),
            "algbw_gbps": figure(algbw),
            "busbw_gbps": figure(algbw * busbw_factor(n)),
            "wrong": wrong,
        }
        if wrong:
            row["wrong_by_rank"] = received
            row["bad_input_ranks"] = bad_inputs
        rows.append(row)
        del buf, view
        spent += seconds * (1 + warm + reps)
        if i + 1 == len(sizes):
            break
        if plateau and size >= int(plateau["from_bytes"]) and len(rows) >= 2:
            if rows[-1]["busbw_gbps"] < rows[-2]["busbw_gbps"] * (1 + float(plateau["gain"])):
                stopped, unswept = "plateau", sizes[i + 1 :]
                break
        if budget_s is not None:
            nxt = sizes[i + 1]
            warm_next, reps_next = _runs(nxt, warmup, iters, budget_bytes)
            if spent + seconds * nxt / size * (1 + warm_next + reps_next) > float(budget_s):
                stopped, unswept = "time budget", sizes[i + 1 :]
                break
    return {
        "rows": rows,
        "skipped_sizes": skipped,
        "unswept_sizes": unswept,
        "stopped": stopped,
        "world_size": n,
        "dtype": "float32",
        "op": "sum",
        "backend": ctx.backend,
        "device": ctx.device.type,
        "busbw_factor": busbw_factor(n),
    }
