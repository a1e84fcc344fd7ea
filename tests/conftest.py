"""Shared test set-up: the `gpu` marker skips cleanly on machines without an NVIDIA GPU."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _have_gpu() -> bool:
    if shutil.which("nvidia-smi") is None and not Path("/proc/driver/nvidia").exists():
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count > 0
    except Exception:  # noqa: BLE001
        return False


HAVE_GPU = _have_gpu()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found by NVML)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
