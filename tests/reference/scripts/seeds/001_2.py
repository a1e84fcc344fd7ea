import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import os

# Define a simple model
class SimpleModel(nn.Module):
    def __init__(self):
        super(SimpleModel, self).__init__()
        self.linear = nn.Linear(10, 2)

    def forward(self, x):
        return self.linear(x)

# Initialize distributed environment
def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355' # or other free port
    dist.init_process_group("nccl", rank=rank, world_size=world_size)

def cleanup():
    dist.destroy_process_group()

# Training process function
def train(rank, world_size):
    setup(rank, world_size)

    # Create synthetic data
    inputs = torch.randn(100, 10)
    targets = torch.randn(100, 2)
    dataset = TensorDataset(inputs, targets)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    dataloader = DataLoader(dataset, batch_size=32, sampler = sampler)

    # Instantiate the model
    model = SimpleModel()
    model = model.to(rank)

    # Wrap the model with DistributedDataParallel
    model = DistributedDataParallel(model, device_ids=[rank])

    # Optimizer and Loss function
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.MSELoss()


    # Training Loop
    for epoch in range(2):
        for batch_inputs, batch_targets in dataloader:
            batch_inputs = batch_inputs.to(rank)
            batch_targets = batch_targets.to(rank)

            optimizer.zero_grad()
            outputs = model(batch_inputs)
            loss = criterion(outputs, batch_targets)
            loss.backward()
            optimizer.step()
        print(f"Rank {rank}, Epoch: {epoch}, Loss: {loss.item()}")

    cleanup()


if __name__ == '__main__':
    world_size = torch.cuda.device_count()
    torch.multiprocessing.spawn(train,
                               args=(world_size,),
                               nprocs=world_size,
                               join=True)
