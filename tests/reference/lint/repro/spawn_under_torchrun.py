# torchrun --nproc_per_node=2 spawn_under_torchrun.py : an mp.spawn script (tutorial style, hard-coded port) launched by torchrun
import os, datetime, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = "29613"
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=10))
    print(f"spawned rank {rank} of {world_size} (torchrun RANK={os.environ.get('RANK')})", flush=True)
    dist.barrier(); dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
