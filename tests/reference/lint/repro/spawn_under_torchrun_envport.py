# torchrun --nproc_per_node=2 spawn_under_torchrun_envport.py : mp.spawn script that keeps torchrun's MASTER_ADDR/PORT (setdefault)
import os, datetime, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29615")
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=10))
    t = torch.ones(1) * (int(os.environ["RANK"]) * 10 + rank)
    dist.all_reduce(t)
    print(f"spawned rank {rank}/{world_size} inside torchrun RANK={os.environ['RANK']}: all_reduce={t.item()}", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    print(f"torchrun worker RANK={os.environ.get('RANK')} WORLD_SIZE={os.environ.get('WORLD_SIZE')} spawning 2", flush=True)
    mp.spawn(run, args=(2,), nprocs=2)
