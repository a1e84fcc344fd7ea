import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, WeightedRandomSampler
# ... other imports and setup as in Example 1 ...

class ImbalancedDatasetSampler(torch.utils.data.sampler.Sampler):
    ...  # ...implementation to handle class imbalance in dataset...

weights = get_class_weights(dataset) # function to calculate weights
sampler = WeightedRandomSampler(weights, len(dataset))
train_sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world_size, rank=rank)
train_loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)

#... rest of the code remains similar to Example 1...
