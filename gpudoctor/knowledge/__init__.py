"""What gpudoctor knows about GPUs, NCCL and networks: pure tables and functions over a snapshot, no I/O."""
