"""Debugger and profiler variables that slow or break a run (DCGM's diagnostic flags them)."""

from __future__ import annotations

# The CUDA debugger/profiler variables DCGM's diagnostic flags as slowing or breaking a run (the
# GD1xx lint in checks/nccl_env.py reads this list, the probe keeps these names in a snapshot).
DCGM_DEBUG_VARS = (
    "NSIGHT_CUDA_DEBUGGER",
    "CUDA_INJECTION32_PATH",
    "CUDA_INJECTION64_PATH",
    "CUDA_AUTO_BOOST",
    "CUDA_ENABLE_COREDUMP_ON_EXCEPTION",
    "CUDA_COREDUMP_FILE",
    "CUDA_DEVICE_WAITS_ON_EXCEPTION",
    "CUDA_PROFILE",
    "COMPUTE_PROFILE",
    "OPENCL_PROFILE",
)
