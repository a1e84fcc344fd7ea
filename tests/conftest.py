"""Shared test set-up: the `gpu` marker skips cleanly on machines without an NVIDIA GPU; the
orphan scan that the workload tests run after each test."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import psutil
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("OMP_NUM_THREADS", "1")

# Every process this test session starts inherits this marker, ranks included (the launcher
# passes the environment on), so a rank that escaped is found even after it was reparented to
# init: a true orphan is no child of ours any more. Other sessions on the machine have their own.
SESSION_VAR = "GPUDOCTOR_TEST_SESSION"
os.environ[SESSION_VAR] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
RANK_MARK = "gpudoctor.workloads.rank"


def leftover_ranks(within: float = 0.0) -> list[psutil.Process]:
    """This session's rank processes still alive anywhere on the machine (zombies aside),
    waiting up to `within` seconds for them to go."""
    end = time.monotonic() + within
    while True:
        alive = []
        for p in psutil.process_iter():
            try:
                if RANK_MARK not in " ".join(p.cmdline()) or p.status() == psutil.STATUS_ZOMBIE:
                    continue
                if p.environ().get(SESSION_VAR) == os.environ[SESSION_VAR]:
                    alive.append(p)
            except psutil.Error:
                continue
        if not alive or time.monotonic() >= end:
            return alive
        time.sleep(0.1)


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
