# PyTorch DDP automatically buckets gradients
model = DDP(
model,
device_ids=[rank],
bucket_cap_mb=25, # Default, tune if needed
find_unused_parameters=False # Set True only if necessary
)
