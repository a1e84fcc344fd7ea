from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
# Wrap model with FSDP
model = FSDP(
model,
device_id=rank,
auto_wrap_policy=default_auto_wrap_policy,
mixed_precision=mp_policy,
)
