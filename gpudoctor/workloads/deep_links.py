"""Level 3: host-to-device and device-to-host bandwidth per GPU, alone and all at once, and
device-to-device copies per GPU pair.

For each rank's GPU, four figures: H2D and D2H from pinned (page-locked) host memory, and the
same from pageable memory (what a DataLoader without pin_memory=True gets). "Alone": one rank
at a time copies while the others wait at a barrier. "At once": every rank copies at the same
moment (a barrier before each figure), which is where a shared PCIe switch, a narrow uplink or
the host's memory bandwidth shows. Then rank 0 times direct device-to-device copies for each
pair it is given (the pairs with P2P on), in both directions.

GB/s are decimal (1e9 bytes), like nvbandwidth and nccl-tests. Each figure: one warm-up copy,
then `iters` copies of `bytes`, timed with the device synchronised.

params: "bytes", "iters", "pairs" ([cuda_a, cuda_b] lists, for rank 0), "gpus" (NVML index of
each local rank's GPU, to name pairs).
"""

from __future__ import annotations

import time
from typing import Any

from gpudoctor.workloads.deep_common import device_info, gather_rows
from gpudoctor.workloads.rank import RankContext

GB = 1e9
FIGURES = ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable")


def _timed(copy: Any, nbytes: int, iters: int, devices: list[Any]) -> float:
    import torch

    def sync() -> None:
        for d in devices:
            torch.cuda.synchronize(d)

    copy()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        copy()
    sync()
    return round(nbytes * iters / (time.perf_counter() - t0) / GB, 3)


class _Buffers:
    def __init__(self, device: Any, nbytes: int) -> None:
        import torch

        self.device = device
        self.nbytes = nbytes
        self.pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.pageable = torch.empty(nbytes, dtype=torch.uint8)
        self.dev = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def measure(self, figure: str, iters: int) -> float:
        host = self.pinned if figure.endswith("pinned") else self.pageable
        if figure.startswith("h2d"):
            return _timed(lambda: self.dev.copy_(host, non_blocking=True), self.nbytes, iters, [self.device])
        return _timed(lambda: host.copy_(self.dev, non_blocking=True), self.nbytes, iters, [self.device])


def _pair(a: int, b: int, nbytes: int, iters: int) -> dict[str, Any]:
    """Direct copies between CUDA devices a and b, both ways (peer-to-peer where CUDA allows it)."""
    import torch

    da, db = torch.device("cuda", a), torch.device("cuda", b)
    xa = torch.empty(nbytes, dtype=torch.uint8, device=da)
    xb = torch.empty(nbytes, dtype=torch.uint8, device=db)
    return {
        "peer_access": bool(torch.cuda.can_device_access_peer(da, db)),
        "a_to_b_gbps": _timed(lambda: xb.copy_(xa, non_blocking=True), nbytes, iters, [da, db]),
        "b_to_a_gbps": _timed(lambda: xa.copy_(xb, non_blocking=True), nbytes, iters, [da, db]),
    }


def _pairs(params: dict[str, Any], nbytes: int, iters: int) -> list[dict[str, Any]]:
    gpus = params.get("gpus") or []
    return [
        {"a": gpus[a] if a < len(gpus) else a, "b": gpus[b] if b < len(gpus) else b, **_pair(a, b, nbytes, iters)}
        for a, b in params.get("pairs", [])
    ]


def run(ctx: RankContext, params: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    if ctx.device.type != "cuda":
        raise RuntimeError("host links are measured on GPUs only")
    nbytes = int(params.get("bytes", 256 << 20))
    iters = int(params.get("iters", 5))
    buffers = _Buffers(ctx.device, nbytes)
    alone: dict[str, float] = {}
    for turn in range(ctx.world_size):
        dist.barrier()
        if turn == ctx.rank:
            alone = {f: buffers.measure(f, iters) for f in FIGURES}
    at_once: dict[str, float] = {}
    for figure in FIGURES:
        dist.barrier()
        at_once[figure] = buffers.measure(figure, iters)
    del buffers
    dist.barrier()
    pairs = _pairs(params, nbytes, iters) if ctx.rank == 0 else []
    gpus = params.get("gpus") or []
    mine = {
        **device_info(ctx),
        "gpu": gpus[ctx.local_rank] if ctx.local_rank < len(gpus) else None,
        "alone": alone,
        "at_once": at_once,
    }
    rows = gather_rows(mine, ctx.world_size)
    return {"rows": rows, "pairs": pairs, "bytes": nbytes, "iters": iters}
