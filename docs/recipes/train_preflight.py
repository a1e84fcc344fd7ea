"""A training script that checks its machine first: `torchrun --nproc_per_node 8 train_preflight.py`.

Every rank calls preflight: it is cheap (static checks, no torch import, no process spawned), and
when the machine is not fit every rank stops at once with the same message, instead of rank 0
stopping while the others wait in init_process_group until its timeout.
"""

from __future__ import annotations

import os
import sys

import gpudoctor


def check_machine() -> None:
    """Stop before any GPU work when this node is not ready for the run torchrun started."""
    gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun: --nproc_per_node
    try:
        # The team's policy (pyproject.toml [tool.gpudoctor] or gpudoctor.toml) applies too.
        gpudoctor.preflight(expect_gpus=gpus)
    except gpudoctor.PreflightError as exc:
        if os.environ.get("LOCAL_RANK", "0") == "0":  # one copy of the message per node
            print(exc, file=sys.stderr)
        sys.exit(1)


def train() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(100):
        optimizer.zero_grad()
        model(torch.randn(64, 1024, device="cuda")).square().mean().backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    check_machine()
    train()
