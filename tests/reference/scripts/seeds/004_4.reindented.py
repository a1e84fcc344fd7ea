# Use distributed sampler
train_sampler = DistributedSampler(dataset, shuffle=True)
# Increase num_workers
DataLoader(dataset, num_workers=8) # Higher
# Move evaluation model correctly
model.eval()
with torch.no_grad():
    # Ensure data goes to correct GPU
    data = data.to(rank)
