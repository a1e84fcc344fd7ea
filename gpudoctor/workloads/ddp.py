"""DDP sanity run inside a rank: a small model trained a few steps on DistributedSampler shards.

It proves that the shards are disjoint and cover the dataset, that every rank ends with
bit-identical parameters, that DDP's averaged gradient equals the gradient of one process on the
union of the ranks' batches (and which rank sent a wrong one), and that the loss goes down.
float64 keeps the gradient comparison tight; each rank starts from different weights on purpose,
so DDP's initial broadcast is part of what is proven.
"""

from __future__ import annotations

import time
from typing import Any

from gpudoctor.launch.workload_results import DdpResult, ShardReport
from gpudoctor.workloads.rank import RankContext

FEATURES = 16


def _model() -> Any:
    import torch.nn as nn

    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1)).double()


def _flat_grad(model: Any, x: Any, y: Any) -> Any:
    import torch
    import torch.nn.functional as F

    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def run(ctx: RankContext, params: dict[str, Any]) -> DdpResult:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    n, rank, dev = ctx.world_size, ctx.rank, ctx.device
    batch = int(params.get("batch", 8))
    steps = int(params.get("steps", 5))
    lr = float(params.get("lr", 0.05))

    # The same dataset on every rank, from a fixed seed; its size divides evenly, so no padding.
    g = torch.Generator().manual_seed(1234)
    size = n * batch * steps
    x_all = torch.randn(size, FEATURES, generator=g, dtype=torch.float64)
    y_all = x_all @ torch.randn(FEATURES, 1, generator=g, dtype=torch.float64) + 0.01 * torch.randn(
        size, 1, generator=g, dtype=torch.float64
    )
    dataset = TensorDataset(x_all, y_all)
    sampler = DistributedSampler(dataset, num_replicas=n, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(0)
    mine = list(sampler)
    shards = ctx.all_gather_json(mine)  # not all_gather_object: it needs numpy
    flat = [i for s in shards for i in s]
    shard_report: ShardReport = {
        "dataset": size,
        "per_rank": [len(s) for s in shards],
        "overlap": len(flat) - len(set(flat)),
        "missing": len(set(range(size)) - set(flat)),
    }

    torch.manual_seed(1000 + rank)  # different start weights per rank: DDP must broadcast rank 0's
    model = _model().to(dev)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    reference = _model().to(dev)
    reference.load_state_dict(ddp.module.state_dict())  # the synchronised start, for the reference
    order = {p.data_ptr(): i for i, p in enumerate(ddp.module.parameters())}
    sent: dict[int, Any] = {}
    capture = {"on": True}
    corrupt = ctx.faults.has("corrupt")

    def hook(state, bucket):  # type: ignore[no-untyped-def]  (DDP rejects a non-GradBucket annotation)
        if corrupt:
            bucket.buffer().mul_(1.5)  # the test fault: this rank sends wrong gradients
        if capture["on"]:
            for p, grad in zip(bucket.parameters(), bucket.gradients(), strict=True):
                sent[order[p.data_ptr()]] = grad.detach().clone().reshape(-1)
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
    losses: list[float] = []
    step_s: list[float] = []
    averaged = None
    for step, (xb, yb) in enumerate(loader):
        t0 = time.perf_counter()
        xb, yb = xb.to(dev), yb.to(dev)
        opt.zero_grad()
        loss = F.mse_loss(ddp(xb), yb)
        loss.backward()
        if step == 0:
            capture["on"] = False
            averaged = torch.cat([p.grad.reshape(-1) for p in ddp.module.parameters()]).clone()
        opt.step()
        ctx.sync()
        step_s.append(time.perf_counter() - t0)
        losses.append(loss.item())

    # Gradient: one process's gradient on the union of the first batches vs DDP's average. Every
    # tensor of a collective on the rank's device, outputs too: NCCL writes a host output list
    # through a host pointer (workloads/placement.py).
    first = torch.tensor(mine[:batch], dtype=torch.int64, device=dev)
    firsts = [torch.empty_like(first) for _ in range(n)]
    dist.all_gather(firsts, first)
    firsts = [f.cpu() for f in firsts]
    union = torch.cat(firsts)
    expected = _flat_grad(reference, x_all[union].to(dev), y_all[union].to(dev))
    grad_diff = (averaged - expected).abs().max().item()
    tol = 1e-9 + 1e-6 * expected.abs().max().item()
    # Which rank sent a wrong gradient: recompute each rank's share here and compare.
    contribution = torch.cat([sent[i] for i in range(len(sent))])
    contributions = [torch.empty_like(contribution) for _ in range(n)]
    dist.all_gather(contributions, contribution)
    bad_ranks = []
    for r in range(n):
        own = _flat_grad(reference, x_all[firsts[r]].to(dev), y_all[firsts[r]].to(dev))
        if (contributions[r] - own).abs().max().item() > 1e-9 + 1e-6 * own.abs().max().item():
            bad_ranks.append(r)

    # Parameters after training: bit-identical on every rank.
    params_flat = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
    gathered = [torch.empty_like(params_flat) for _ in range(n)]
    dist.all_gather(gathered, params_flat)
    differ = [r for r in range(n) if not torch.equal(gathered[r], gathered[0])]

    # Loss over the whole group, first step vs last step.
    pair = torch.tensor([losses[0], losses[-1]], dtype=torch.float64, device=dev)
    dist.all_reduce(pair)
    pair /= n
    return {
        "shards": shard_report,
        "grad_max_abs_diff": grad_diff,
        "grad_tolerance": tol,
        "grad_ok": grad_diff <= tol,
        "bad_gradient_ranks": bad_ranks,
        "params_differ_ranks": differ,
        "loss_first": pair[0].item(),
        "loss_last": pair[1].item(),
        "steps": len(losses),
        "batch": batch,
        "step_s_mean": sum(step_s) / len(step_s),
        "step_s_max": max(step_s),
    }
