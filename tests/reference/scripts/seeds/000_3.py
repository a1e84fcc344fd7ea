import os
# ... (Import statements, model definition, etc. as before) ...

def run(rank, world_size, master_addr, master_port):
    os.environ['MASTER_ADDR'] = master_addr
    os.environ['MASTER_PORT'] = master_port
    dist.init_process_group(backend="nccl", init_method="env://", rank=rank, world_size=world_size)
    # ... (rest of the code remains largely similar to Example 1, but with NCCL backend) ...

if __name__ == '__main__':
    world_size = torch.cuda.device_count() * num_machines #total number of GPUs
    mp.spawn(run, args=(world_size, master_addr, master_port), nprocs=world_size, join=True)
