"""Collectives beyond all-reduce inside a rank: all-gather, reduce-scatter, all-to-all,
broadcast, and send/recv between every pair of ranks, timed and verified like nccl-tests.

Sizes are nccl-tests' S (gpudoctor/knowledge/busbw.py), rounded down so that every rank's chunk is whole
rows of the verification pattern. For each size: fill a known pattern, run the collective once
and count the wrong elements per source rank (nccl-tests' #wrong, attributed), then warm up and
time it with the device synchronised; the time of a size is the slowest rank's.

Attribution: `wrong_cells` lists [receiver, source, count] for every receiver that got wrong
elements from a source. Each output chunk of all-gather, all-to-all, broadcast (every rank is the
root once while verifying) and send/recv has one source. A reduce-scatter chunk is a sum: when one
is wrong, each rank's unreduced contributions are moved once more with all-to-all to see whose
were wrong; when every contribution arrives right, the reduction itself is named (`wrong_sums`).

Send/recv runs one pair at a time (both directions at once, as nccl-tests' sendrecv does on two
GPUs); the other ranks wait in a barrier of a CPU (gloo) group, so no pair shares links with
another and idle GPUs run no spinning kernel.

params: "ops" (names from gpudoctor.knowledge.busbw.OPS, without allreduce/sendrecv), "sizes" (bytes),
"warmup", "iters", "bytes_per_size" (fewer iterations for huge sizes), "pair_bytes" (0: no
send/recv pairs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import combinations
from typing import Any

from gpudoctor.knowledge.busbw import algbw_gbps, busbw_factor, figure
from gpudoctor.launch.protocol import PAIR_SENDRECV
from gpudoctor.launch.workload_results import CollectiveRow, CollectivesResult, CollectiveSweep, PairRow, PairsResult
from gpudoctor.workloads.rank import RankContext, all_gather_json

ROWS = 64  # pattern rows per chunk: misplaced chunks and rows show, not only missing data
ELEMENT = 4  # float32
COLLECTIVES = ("allgather", "reducescatter", "alltoall", "broadcast")


def aligned(nbytes: int, world: int) -> int:
    """The largest size <= nbytes whose per-rank chunks are whole pattern rows."""
    unit = ROWS * ELEMENT * world
    return nbytes - nbytes % unit


def _pattern(src: int, dst: int, device: Any) -> Any:
    """The (ROWS, 1) values `src` sends to `dst`: 1..61, exact in float32 even summed over 64 ranks."""
    import torch

    rows = torch.arange(ROWS, dtype=torch.float32, device=device).unsqueeze(1)
    return (rows + (src * 13 + dst * 7)) % 61 + 1


def _fill(chunk: Any, src: int, dst: int) -> None:
    view = chunk.view(ROWS, -1)
    view.copy_(_pattern(src, dst, chunk.device).expand_as(view))


def _wrong(chunk: Any, expected: Any) -> int:
    return int((chunk.view(ROWS, -1) != expected).sum().item())


class _Case:
    """One collective at one size, verified: `run` repeats it for timing."""

    def __init__(
        self, run: Callable[[], None], count: int, wrong_from: list[int], wrong_total: int, wrong_sum: int = 0
    ) -> None:
        self.run = run
        self.count = count  # nccl-tests' count column: elements per rank argument
        self.wrong_from = wrong_from  # wrong elements this rank received, per source rank
        self.wrong_total = wrong_total  # wrong elements in this rank's output (nccl-tests' #wrong)
        self.wrong_sum = wrong_sum  # reduce-scatter: wrong sums whose contributions all arrived right


def _allgather(ctx: RankContext, nbytes: int, garble: bool) -> _Case:
    import torch
    import torch.distributed as dist

    n, me, dev = ctx.world_size, ctx.rank, ctx.device
    c = nbytes // ELEMENT // n
    inp = torch.empty(c, device=dev)
    _fill(inp, me, 0)
    if garble:
        inp[0] += 1
    out = torch.full((c * n,), -1.0, device=dev)
    dist.all_gather_into_tensor(out, inp)
    wrong = [_wrong(out[s * c : (s + 1) * c], _pattern(s, 0, dev)) for s in range(n)]
    return _Case(lambda: dist.all_gather_into_tensor(out, inp), c, wrong, sum(wrong))


def _chunks_for_everyone(ctx: RankContext, c: int, garble: bool) -> Any:
    """This rank's input of n chunks of c elements, chunk d holding the pattern it sends to rank d."""
    import torch

    inp = torch.empty(c * ctx.world_size, device=ctx.device)
    for d in range(ctx.world_size):
        _fill(inp[d * c : (d + 1) * c], ctx.rank, d)
        if garble:
            inp[d * c] += 1
    return inp


def _alltoall(ctx: RankContext, nbytes: int, garble: bool) -> _Case:
    import torch
    import torch.distributed as dist

    n, me, dev = ctx.world_size, ctx.rank, ctx.device
    c = nbytes // ELEMENT // n
    inp = _chunks_for_everyone(ctx, c, garble)
    out = torch.full((c * n,), -1.0, device=dev)
    dist.all_to_all_single(out, inp)
    wrong = [_wrong(out[s * c : (s + 1) * c], _pattern(s, me, dev)) for s in range(n)]
    return _Case(lambda: dist.all_to_all_single(out, inp), c, wrong, sum(wrong))


def _reducescatter(ctx: RankContext, nbytes: int, garble: bool) -> _Case:
    import torch
    import torch.distributed as dist

    n, me, dev = ctx.world_size, ctx.rank, ctx.device
    c = nbytes // ELEMENT // n
    inp = _chunks_for_everyone(ctx, c, garble)
    out = torch.full((c,), -1.0, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    expected = sum(_pattern(s, me, dev) for s in range(n))
    wrong_total = _wrong(out, expected)
    flag = torch.tensor([float(wrong_total)], dtype=torch.float64, device=dev)
    dist.all_reduce(flag)
    wrong = [0] * n
    wrong_sum = 0
    if flag.item() > 0:  # whose contribution? move them unreduced and look
        moved = torch.full((c * n,), -1.0, device=dev)
        dist.all_to_all_single(moved, inp)
        wrong = [_wrong(moved[s * c : (s + 1) * c], _pattern(s, me, dev)) for s in range(n)]
        if wrong_total and not any(wrong):
            wrong_sum = wrong_total
        del moved
    return _Case(lambda: dist.reduce_scatter_tensor(out, inp), c, wrong, wrong_total, wrong_sum)


def _broadcast(ctx: RankContext, nbytes: int, garble: bool) -> _Case:
    import torch
    import torch.distributed as dist

    n, me, dev = ctx.world_size, ctx.rank, ctx.device
    c = nbytes // ELEMENT
    buf = torch.empty(c, device=dev)
    wrong = [0] * n
    for root in range(n):  # every rank is the root once, so each one's sending is verified
        if me == root:
            _fill(buf, root, 0)
            if garble:
                buf[0] += 1
        else:
            buf.fill_(-1.0)
        dist.broadcast(buf, root)
        if me != root:
            wrong[root] = _wrong(buf, _pattern(root, 0, dev))
    return _Case(lambda: dist.broadcast(buf, 0), c, wrong, sum(wrong))


_SETUP = {
    "allgather": _allgather,
    "reducescatter": _reducescatter,
    "alltoall": _alltoall,
    "broadcast": _broadcast,
}


def _budget(ctx: RankContext) -> float | None:
    """80 % of the smallest free GPU memory across the ranks (None on CPU: no limit)."""
    import torch
    import torch.distributed as dist

    if ctx.device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(ctx.device)
    t = torch.tensor([float(free)], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t.item() * 0.8


def _timed(ctx: RankContext, run: Callable[[], None], warmup: int, reps: int, slowest: bool = True) -> float:
    """Seconds per call after warm-up: the slowest rank's, or (slowest=False, when only some ranks
    take part) this rank's own."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        run()
    ctx.sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    ctx.sync()
    elapsed = (time.perf_counter() - t0) / reps
    if not slowest:
        return elapsed
    t = torch.tensor([elapsed], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _gather(ctx: RankContext, values: list[int]) -> list[list[int]]:
    """Every rank's `values` (all of one length), in rank order."""
    import torch
    import torch.distributed as dist

    n = ctx.world_size
    mine = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    table = torch.empty(n * len(values), dtype=torch.float64, device=ctx.device)
    dist.all_gather_into_tensor(table, mine)
    return [[int(v) for v in row] for row in table.view(n, len(values)).tolist()]


def _cells(rows: list[list[int]]) -> list[list[int]]:
    """[receiver, source, count] for every nonzero count of `rows[receiver][source]`."""
    return [[r, s, v] for r, row in enumerate(rows) for s, v in enumerate(row) if v]


def _sweep(
    ctx: RankContext, op: str, sizes: list[int], params: dict[str, Any], budget: float | None
) -> CollectiveSweep:
    import torch

    n = ctx.world_size
    warmup = int(params.get("warmup", 2))
    iters = int(params.get("iters", 5))
    per_size = float(params.get("bytes_per_size", 4e9))
    garble = ctx.faults.has("garble")
    rows: list[CollectiveRow] = []
    skipped: list[int] = []
    for size in sizes:
        nbytes = aligned(size, n)
        if nbytes <= 0 or (budget is not None and nbytes * 3 > budget):
            skipped.append(size)
            continue
        ctx.progress(f"{op} {nbytes} bytes")
        case = _SETUP[op](ctx, nbytes, garble)
        reps = max(1, min(iters, int(per_size // nbytes)))
        seconds = _timed(ctx, case.run, warmup, reps)
        table = _gather(ctx, [*case.wrong_from, case.wrong_total, case.wrong_sum])
        algbw = algbw_gbps(nbytes, seconds)
        rows.append(
            {
                "bytes": nbytes,
                "count": case.count,
                "iters": reps,
                "time_us": round(seconds * 1e6, 3),
                "algbw_gbps": figure(algbw),
                "busbw_gbps": figure(algbw * busbw_factor(op, n)),
                "wrong": sum(row[n] for row in table),
                "wrong_cells": _cells([row[:n] for row in table]),
                "wrong_sums": [[r, row[n + 1]] for r, row in enumerate(table) if row[n + 1]],
            }
        )
        del case
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    return {"rows": rows, "skipped_sizes": skipped, "busbw_factor": busbw_factor(op, n)}


def _pairs(ctx: RankContext, nbytes: int, params: dict[str, Any], cpu_group: Any) -> PairsResult:
    """Send/recv between every pair of ranks, one pair at a time, both directions at once."""
    import torch
    import torch.distributed as dist

    n, me, dev = ctx.world_size, ctx.rank, ctx.device
    nbytes = aligned(nbytes, 1)
    c = nbytes // ELEMENT
    warmup = int(params.get("warmup", 2))
    reps = max(1, min(int(params.get("iters", 5)), int(float(params.get("bytes_per_size", 4e9)) // nbytes)))
    garble = ctx.faults.has("garble")
    send = torch.empty(c, device=dev)
    recv = torch.empty(c, device=dev)
    mine = []
    for a, b in combinations(range(n), 2):
        dist.barrier(group=cpu_group)
        if me not in (a, b):
            continue
        peer = b if me == a else a
        ctx.events.pair(PAIR_SENDRECV, a, b)  # names the pair if it hangs

        def exchange(peer: int = peer) -> None:
            ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        _fill(send, me, peer)
        if garble:
            send[0] += 1
        recv.fill_(-1.0)
        exchange()
        ctx.sync()
        wrong = _wrong(recv, _pattern(peer, me, dev))
        seconds = _timed(ctx, exchange, warmup, reps, slowest=False)
        mine.append({"a": a, "b": b, "receiver": me, "source": peer, "seconds": seconds, "wrong": wrong})
    ctx.events.phase("collectives")
    every = all_gather_json(mine, n, torch.device("cpu"), cpu_group)  # numpy-free, on the CPU group
    rows: list[PairRow] = []
    for a, b in combinations(range(n), 2):
        halves = [h for part in every for h in part if (h["a"], h["b"]) == (a, b)]
        seconds = max(h["seconds"] for h in halves)
        algbw = algbw_gbps(nbytes, seconds)
        rows.append(
            {
                "a": a,
                "b": b,
                "time_us": round(seconds * 1e6, 3),
                "algbw_gbps": figure(algbw),
                "busbw_gbps": figure(algbw * busbw_factor("sendrecv", 2)),
                "wrong_cells": [[h["receiver"], h["source"], h["wrong"]] for h in halves if h["wrong"]],
            }
        )
    return {"bytes": nbytes, "count": c, "iters": reps, "rows": rows}


def run(ctx: RankContext, params: dict[str, Any]) -> CollectivesResult:
    import torch.distributed as dist

    n = ctx.world_size
    ops = [op for op in params.get("ops", COLLECTIVES) if op in _SETUP]
    sizes = [int(s) for s in params.get("sizes", [])]
    budget = _budget(ctx)
    result: CollectivesResult = {
        "world_size": n,
        "backend": ctx.backend,
        "device": ctx.device.type,
        "dtype": "float32",
        "ops": {op: _sweep(ctx, op, sizes, params, budget) for op in ops},
        "pairs": None,
    }
    pair_bytes = int(params.get("pair_bytes", 0))
    if pair_bytes and n >= 2:
        # A CPU group for the barriers between pairs: no kernel spins on the idle GPUs.
        cpu_group = dist.new_group(backend="gloo") if ctx.backend != "gloo" else None
        if budget is not None and pair_bytes * 2 > budget:
            result["pairs"] = {"bytes": pair_bytes, "rows": [], "skipped": "does not fit in free GPU memory"}
        else:
            result["pairs"] = _pairs(ctx, pair_bytes, params, cpu_group)
    return result
