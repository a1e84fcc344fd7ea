import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler
def setup(rank, world_size):
    """Initialize distributed training"""
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
    # Initialize process group
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
def cleanup():
    """Clean up distributed training"""
    dist.destroy_process_group()
def train(rank, world_size):
    """Training function for each GPU"""
    # Setup
    setup(rank, world_size)
    # Create model and move to GPU
    model = YourModel().to(rank)
    model = DDP(model, device_ids=[rank])
    # Create distributed sampler
    train_sampler = DistributedSampler(
        train_dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=True
    )
    train_loader = DataLoader(
        train_dataset,
        batch_size=batch_size,
        sampler=train_sampler,
        num_workers=4,
        pin_memory=True
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # Training loop
    for epoch in range(num_epochs):
        train_sampler.set_epoch(epoch) # Important for shuffling
        for batch in train_loader:
            data, target = batch
            data, target = data.to(rank), target.to(rank)
            optimizer.zero_grad()
            output = model(data)
            loss = criterion(output, target)
            loss.backward()
            optimizer.step()
    cleanup()
def main():
    world_size = torch.cuda.device_count()
    mp.spawn(train, args=(world_size,), nprocs=world_size, join=True)
if __name__ == "__main__":
    main()
