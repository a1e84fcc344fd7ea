# python world_size_mismatch.py : one process, world_size=2 -> the store waits for a second client
import os, datetime, torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29611")
dist.init_process_group("gloo", rank=0, world_size=2, timeout=datetime.timedelta(seconds=5))
