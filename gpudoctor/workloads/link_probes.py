"""Link probes that move data, inside one rank that drives every visible GPU.

`pcie(ctx, params)`: for each GPU, queue host-to-device copies from pinned memory for a short
while and read the PCIe link generation and width from NVML while they run (idle GPUs train
their links down, so an idle reading proves nothing). Also reports the measured H2D GB/s.

`p2p(ctx, params)`: for each GPU pair, time a direct device-to-device copy (peer-to-peer where
CUDA allows it) and the same bytes staged through pinned host memory. Before each pair it
announces the pair as its phase, so when a copy hangs and the launcher kills the rank at its
deadline, the parent knows which pair hung.

params: "gpus": NVML index of each CUDA device, in CUDA order; pcie: "seconds", "bytes";
p2p: "pairs" ([cuda_a, cuda_b] lists), "bytes", "iters".
"""

from __future__ import annotations

import time
from typing import Any

from gpudoctor.launch.protocol import PAIR_P2P
from gpudoctor.snapshot import Missing
from gpudoctor.workloads.rank import RankContext

GB = 1e9


def _nvml_link(nvml: Any, index: int) -> tuple[int | None, int | None]:
    """The current PCIe generation and width, read by the probe's own reader (None: unreadable)."""
    from gpudoctor.probe.device import DeviceReader
    from gpudoctor.probe.links import pcie as read_pcie

    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    if isinstance(handle, Missing) or handle is None:
        return None, None
    link = read_pcie(DeviceReader(nvml, handle))
    gen, width = link["pcie_gen_current"], link["pcie_width_current"]
    return (gen if isinstance(gen, int) else None), (width if isinstance(width, int) else None)


def pcie(ctx: RankContext, params: dict[str, Any]) -> dict[str, Any]:
    import torch

    from gpudoctor.probe.nvml import Nvml

    nvml = Nvml()
    nvml_ok = nvml.init().ok
    gpus = [int(g) for g in params["gpus"]]
    seconds = float(params.get("seconds", 0.5))
    nbytes = int(params.get("bytes", 64 << 20))
    rows = []
    try:
        for cuda_index, nvml_index in enumerate(gpus):
            ctx.progress(f"PCIe load on GPU {nvml_index}")
            device = torch.device("cuda", cuda_index)
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
            dev.copy_(host, non_blocking=True)  # wake the link up
            torch.cuda.synchronize(device)
            copies, gen, width = 0, None, None
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                for _ in range(4):
                    dev.copy_(host, non_blocking=True)
                copies += 4
                if gen is None and time.perf_counter() - start > seconds / 3 and nvml_ok:
                    gen, width = _nvml_link(nvml, nvml_index)  # read while copies are in flight
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            rows.append({"gpu": nvml_index, "gen": gen, "width": width, "h2d_gbps": copies * nbytes / elapsed / GB})
            del host, dev
    finally:
        if nvml_ok:
            nvml.shutdown()
    return {"gpus": rows, "bytes": nbytes, "seconds": seconds, "nvml": nvml_ok}


def _timed(fn: Any, iters: int, devices: list[Any]) -> float:
    import torch

    fn()  # warm-up: enables peer access, allocates
    for d in devices:
        torch.cuda.synchronize(d)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    for d in devices:
        torch.cuda.synchronize(d)
    return (time.perf_counter() - start) / iters


def _measure_pair(a: int, b: int, nbytes: int, iters: int) -> dict[str, Any]:
    import torch

    da, db = torch.device("cuda", a), torch.device("cuda", b)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=da)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=db)
    staging = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def direct() -> None:
        dst.copy_(src, non_blocking=True)

    def staged() -> None:
        staging.copy_(src, non_blocking=True)
        torch.cuda.synchronize(da)
        dst.copy_(staging, non_blocking=True)

    t_staged = _timed(staged, iters, [da, db])
    t_direct = _timed(direct, iters, [da, db])
    return {
        "can_access_peer": bool(torch.cuda.can_device_access_peer(a, b)),
        "p2p_gbps": nbytes / t_direct / GB,
        "staged_gbps": nbytes / t_staged / GB,
        "data_ok": bool(torch.equal(dst.cpu(), src.cpu())),  # the direct copy ran last
    }


def p2p(ctx: RankContext, params: dict[str, Any]) -> dict[str, Any]:
    gpus = [int(g) for g in params["gpus"]]
    nbytes = int(params.get("bytes", 64 << 20))
    iters = int(params.get("iters", 5))
    rows = []
    for a, b in params["pairs"]:
        ga, gb = gpus[a], gpus[b]
        ctx.events.pair(PAIR_P2P, ga, gb)  # names the pair if this copy hangs
        rows.append({"a": ga, "b": gb, **_measure_pair(a, b, nbytes, iters)})
    ctx.events.phase("link_p2p")
    return {"pairs": rows, "bytes": nbytes, "iters": iters}
