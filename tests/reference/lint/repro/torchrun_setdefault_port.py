# control: setdefault leaves torchrun's MASTER_PORT alone
import os, datetime, torch.distributed as dist
os.environ.setdefault("MASTER_PORT", "29614")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
print(f"rank {dist.get_rank()} joined", flush=True)
dist.destroy_process_group()
