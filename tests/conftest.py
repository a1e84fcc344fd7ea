"""Shared test set-up: the `gpu` marker skips cleanly on machines without an NVIDIA GPU; the
orphan-rank scan; and the fixtures tests in every folder receive:

- `gpudoctor_cli`: run `python -m gpudoctor ARGS` as a separate process (clean environment,
  repository root, timeout), tests/helpers/processes.py;
- `snapshot_of`: a recorded machine from tests/fixtures/ as a snapshot, tests/helpers/snapshots.py;
- `no_orphans`: after the test, no rank process of this session is left (modules that start ranks
  use it for every test: `pytestmark = pytest.mark.usefixtures("no_orphans")`);
- `no_policy`: the test runs in a fresh directory, with no policy file above it and no CI variables.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from tests.helpers.processes import GpudoctorCli, run_gpudoctor

if TYPE_CHECKING:
    from tests.helpers.snapshots import SnapshotOf

# A shell starts a background job (`pytest ... &` in a script) with SIGINT ignored, and an ignored
# signal stays ignored through exec: every gpudoctor and rank the tests start would shrug off the
# Ctrl-C the tests send. A handler, unlike SIG_IGN, is reset to the default at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Gloo ranks check that every collective's tensors are placed as NCCL needs them (on the rank's
# device, outputs too): the mistake NCCL turns into an illegal memory access on 2+ GPUs is caught
# here, on CPU (gpudoctor/workloads/placement.py).
os.environ.setdefault("GPUDOCTOR_CHECK_PLACEMENT", "1")

# Every process this test session starts inherits this marker, ranks included (the launcher
# passes the environment on), so a rank that escaped is found even after it was reparented to
# init: a true orphan is no child of ours any more. Other sessions on the machine have their own.
SESSION_VAR = "GPUDOCTOR_TEST_SESSION"
os.environ[SESSION_VAR] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
RANK_MARK = "gpudoctor.workloads.rank"


@pytest.fixture(autouse=True)
def _collector_as_it_was() -> Iterator[None]:
    """`watch` sets its started heap aside from the garbage collector (gpudoctor/watch/heap.py: gc.freeze);
    a test that runs it in this process gets the collector back as it was, the objects with it."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


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


def _gpu_count() -> int:
    """NVML's GPU count; 0 without a driver."""
    if shutil.which("nvidia-smi") is None and not Path("/proc/driver/nvidia").exists():
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        return 0


GPU_COUNT = _gpu_count()
HAVE_GPU = GPU_COUNT > 0


def usable_gpus() -> int:
    """The GPUs a run started now can use: NVML's count, capped by CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return GPU_COUNT if visible is None else min(GPU_COUNT, len([v for v in visible.split(",") if v.strip()]))


SHARED_SCOPES = ("module", "class", "package")


def shared_fixtures(item: pytest.Item) -> list[str]:
    """The fixtures of wider than test scope that `item` reads (a launch shared by a module's tests)."""
    # pytest's own records (not public API): where they differ in another pytest, no group is made and a shared
    # launch may run once per process, which costs time, not correctness.
    try:
        return sorted(
            f"{d.baseid or '.'}::{name}"
            for name, defs in item._fixtureinfo.name2fixturedefs.items()  # type: ignore[attr-defined]
            for d in defs[-1:]
            if d.scope in SHARED_SCOPES
        )
    except AttributeError:
        return []


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under pytest-xdist (the README runs `-n 4 --dist loadgroup`), the tests that read one shared launch
    # run on one worker, so the launch is made once; every other test goes to whichever worker is free.
    for item in items:
        shared = shared_fixtures(item)
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Longest first (a heuristic: `slow` marks the tests that start processes with torch): xdist hands
        # out tests in this order, so the run's tail is short tests that even out the workers, not one
        # long job started last on one of them. One process keeps the file order (its module fixtures).
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found by NVML)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gpudoctor_cli() -> GpudoctorCli:
    """`gpudoctor_cli(*args, env=None, timeout=60, **options)`: the completed `python -m gpudoctor
    ARGS`, run in a clean environment unless `env` is given (see run_gpudoctor)."""
    return run_gpudoctor


@pytest.fixture
def snapshot_of() -> SnapshotOf:
    """`snapshot_of(name, **env)`: tests/fixtures/NAME.json as a snapshot, `env` set in its environment."""
    from tests.helpers.snapshots import load  # here, so that a broken package fails only its users

    return load


@pytest.fixture
def no_orphans() -> Iterator[None]:
    yield
    assert leftover_ranks() == []


@pytest.fixture
def no_policy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no policy file above a fresh directory
    for var in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(var, raising=False)
