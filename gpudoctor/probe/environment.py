"""The environment variables a snapshot may hold: an allow-list, never the whole environment.

Anything else (tokens, passwords, cloud keys) must never reach a snapshot that users
attach to bug reports, so variables are kept only when they are named here.
"""

from __future__ import annotations

from collections.abc import Mapping

ALLOWED_PREFIXES = ("CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "ROLE_")
ALLOWED_NAMES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "NNODES",
        "OMP_NUM_THREADS",
        # Debugger/profiler switches that slow or break a run (DCGM's list; CUDA_* ones
        # are covered by the prefix).
        "NSIGHT_CUDA_DEBUGGER",
        "COMPUTE_PROFILE",
        "OPENCL_PROFILE",
        # Slurm job geometry: how many tasks and GPUs, and where this task sits.
        "SLURM_NTASKS",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_NNODES",
        "SLURM_JOB_NUM_NODES",
        "SLURM_NODEID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_GPUS",
        "SLURM_GPUS_ON_NODE",
        "SLURM_GPUS_PER_NODE",
        "SLURM_GPUS_PER_TASK",
        "SLURM_JOB_GPUS",
        "SLURM_STEP_GPUS",
        "SLURM_CPUS_PER_TASK",
        "SLURM_JOB_ID",
    }
)


def allowed(name: str) -> bool:
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def allowed_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {name: str(value) for name, value in sorted(environ.items()) if allowed(name)}
