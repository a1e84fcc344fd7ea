"""Level 3: a sustained GEMM on every rank at once, with silent-data-corruption checks inside it.

Every rank multiplies the SAME two matrices (drawn once from a fixed seed on the host, so the
inputs are bitwise identical everywhere) over and over for `seconds`, in the device's fast
precision: bf16 on compute capability 8.0+ (Ampere, Hopper, Blackwell), fp16 on 7.x (Volta,
Turing), fp32 before that and on CPU. Because the work never changes, every result is the same
bits: at least `min_checks` times during the load (about every `check_every_s`) the rank takes a
digest of its result (deep_common.digest). The parent compares the digests across GPUs of the
same model and SM count (cuBLAS promises bitwise-equal results only for the same architecture
and SM count) and, within a rank, each check against the others: a recomputation of identical
work that comes out different is silent data corruption (DCGM's diagnostic GEMM compares its
repeated results the same way, nvvs/plugin_src/diagnostic/compare.cu).

Throughput: TFLOPS = 2 n^3 x multiplications / seconds, per interval of about a second (the
timeline) and over the whole load; the sustained figure is the second half's, after the GPU has
warmed up (a GPU that throttles when hot runs at full speed for the first tens of seconds).

params: "seconds", "n" (per device type: {"cuda": 8192, "cpu": 384}), "check_every_s",
"min_checks", "seed".
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from gpudoctor.workloads.deep_common import device_info, digest, flip_bit, gather_rows
from gpudoctor.workloads.rank import RankContext

SEED = 20240611
INTERVAL_S = 1.0  # one timeline point per second or so
BATCH_S = 0.1  # multiplications queued between synchronisations


def precision(ctx: RankContext) -> str:
    """The fast GEMM precision of this rank's device (see the module docstring)."""
    import torch

    if ctx.device.type != "cuda":
        return "float32"
    major, _ = torch.cuda.get_device_capability(ctx.device)
    if major >= 8:
        return "bfloat16"
    return "float16" if major >= 7 else "float32"


def _deterministic() -> None:
    """Ask cuBLAS and torch for reproducible results (one stream, a fixed workspace)."""
    import os

    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def seeded(n: int, dtype: Any, device: Any, gen: Any) -> Any:
    """An n x n matrix of uniform values in [-1, 1) drawn on the host from `gen`, so it is the
    same bits on every rank; drawn in blocks of rows to keep host memory small."""
    import torch

    out = torch.empty(n, n, dtype=dtype, device=device)
    for row in range(0, n, 512):
        rows = min(512, n - row)
        out[row : row + rows].copy_((torch.rand(rows, n, generator=gen) * 2 - 1).to(dtype))
    return out


def run(ctx: RankContext, params: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    _deterministic()
    seconds = float(params["seconds"])
    n = int(params.get("n", {}).get(ctx.device.type, 384 if ctx.device.type == "cpu" else 8192))
    min_checks = int(params.get("min_checks", 3))
    check_every = min(float(params.get("check_every_s", 1.0)), seconds / min_checks)
    dtype_name = precision(ctx)
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(int(params.get("seed", SEED)))
    a = seeded(n, dtype, ctx.device, gen)
    b = seeded(n, dtype, ctx.device, gen)
    out = torch.empty(n, n, dtype=dtype, device=ctx.device)
    flops = 2.0 * n**3
    sdc = ctx.faults.has("sdc")

    # Warm up and size a batch of multiplications that takes about BATCH_S.
    torch.matmul(a, b, out=out)
    ctx.sync()
    t = time.perf_counter()
    for _ in range(3):
        torch.matmul(a, b, out=out)
    ctx.sync()
    per = max((time.perf_counter() - t) / 3, 1e-6)
    batch = max(1, min(1000, int(BATCH_S / per)))

    dist.barrier()  # all GPUs load (and heat) together
    start_epoch, t0 = time.time(), time.perf_counter()
    timeline: list[list[float]] = []
    checks: list[dict[str, Any]] = []
    iterations = 0
    interval_start, interval_iters = t0, 0
    next_check = t0
    while True:
        for _ in range(batch):
            torch.matmul(a, b, out=out)
        ctx.sync()
        now = time.perf_counter()
        iterations += batch
        interval_iters += batch
        done = now - t0 >= seconds
        if now - interval_start >= INTERVAL_S or done:
            tflops = interval_iters * flops / (now - interval_start) / 1e12
            timeline.append([round(time.time(), 3), round(tflops, 6)])
            interval_start, interval_iters = now, 0
        if now >= next_check or done:
            if sdc and checks:
                flip_bit(out, 7919, 5)  # the fault: the same bit of every result after the first check
            checks.append({"t": round(now - t0, 3), "iteration": iterations, "digest": digest(out)})
            next_check = now + check_every
        if done:
            break
    elapsed = time.perf_counter() - t0
    half = timeline[len(timeline) // 2 :] or timeline
    mine = {
        **device_info(ctx),
        "dtype": dtype_name,
        "n": n,
        "iterations": iterations,
        "seconds": round(elapsed, 3),
        "start": round(start_epoch, 3),
        "end": round(start_epoch + elapsed, 3),
        "tflops_mean": round(iterations * flops / elapsed / 1e12, 6),
        "tflops_sustained": round(sum(p[1] for p in half) / len(half), 6),
        "timeline": timeline,
        "sdc": _self_check(checks),
    }
    rows = gather_rows(mine, ctx.world_size)
    return {"rows": rows, "dtype": dtype_name, "n": n, "seconds": seconds, "device": ctx.device.type}


def _self_check(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """This rank's result digest (the one most of its checks gave), how many different results
    its recomputations gave, and the first check whose result differed from the first one's."""
    counts = Counter(c["digest"] for c in checks)
    own, _ = counts.most_common(1)[0]
    first_change = next((c for c in checks if c["digest"] != checks[0]["digest"]), None)
    return {
        "checks": len(checks),
        "digest": own,
        "distinct": len(counts),
        "mismatches": sum(1 for c in checks if c["digest"] != own),
        "first_change": first_change,
    }
