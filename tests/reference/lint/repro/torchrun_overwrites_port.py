# torchrun --nproc_per_node=2 torchrun_overwrites_port.py : a torchrun script that overwrites MASTER_PORT (10 s timeout)
import os, datetime, torch.distributed as dist
os.environ["MASTER_PORT"] = "29614"
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
print(f"rank {dist.get_rank()} joined", flush=True)
dist.destroy_process_group()
