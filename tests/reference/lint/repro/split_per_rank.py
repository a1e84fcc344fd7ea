# torchrun --nproc_per_node=2 split_per_rank.py : random_split without a generator, no seeding
import os, torch, torch.distributed as dist
from torch.utils.data import random_split
dist.init_process_group("gloo")
train, test = random_split(range(20), [15, 5])
print(f"rank {dist.get_rank()} initial_seed={torch.initial_seed()} test={sorted(test.indices)}", flush=True)
dist.destroy_process_group()
