"""The table beside the probe (gpudoctor/probe/nvml_calls.py) names every NVML call gpudoctor makes,
and nothing else, and docs/nvml-calls.md is that table."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from gpudoctor.probe.machine import collect_machine
from gpudoctor.probe.nvml import Nvml
from gpudoctor.probe.nvml_calls import CALLS
from gpudoctor.probe.sampler import NvmlSampler
from gpudoctor.workloads import deep_memory
from gpudoctor.workloads.link_probes import _nvml_link
from tests.fakes.fake_nvml import FakeNvml
from tests.fakes.live_nvml import LiveNvml
from tests.fakes.machines import a100_mig_gpu, h200_vm
from tests.helpers.snapshots import load
from tests.paths import REPO

TABLE = {c.function for c in CALLS}


def called_by_gpudoctor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The pynvml functions the probe, the watch sampler and the workloads call on the strict fake:
    machines with NVSwitch, MIG, a driver before R535/R570 (the fallbacks) and a live one."""
    asked: set[str] = set()
    a100 = dataclasses.replace(load("h100_sxm_8x"), gpus=[a100_mig_gpu()], pairs=[])
    old = {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetTemperatureV"}
    for fake in (FakeNvml(load("h100_sxm_8x")), FakeNvml(a100), FakeNvml(h200_vm(), missing=old)):
        collect_machine(Nvml(fake), {}, root=tmp_path, systemctl=lambda unit: "active")
        asked.update(fake.calls)
    live = LiveNvml()
    sampler = NvmlSampler(Nvml(live))
    assert sampler.open().ok
    sampler.read()
    sampler.processes()
    sampler.process_utilization()
    sampler.close()
    asked.update(live.calls)
    workload = FakeNvml(load("a100_sxm_8x"))
    monkeypatch.setattr("gpudoctor.probe.nvml.load_library", lambda: workload)
    deep_memory.ecc_counters(0)
    nvml = Nvml()
    nvml.init()
    _nvml_link(nvml, 0)
    nvml.shutdown()
    asked.update(workload.calls)
    return asked


def test_every_nvml_call_gpudoctor_makes_is_in_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert called_by_gpudoctor(tmp_path, monkeypatch) - TABLE == set()


def test_every_row_is_a_call_gpudoctor_makes_and_pynvml_has() -> None:
    sources = "\n".join(
        p.read_text(encoding="utf-8") for p in (REPO / "gpudoctor").rglob("*.py") if p.name != "nvml_calls.py"
    )
    assert [f for f in sorted(TABLE) if f'"{f}"' not in sources and f".{f}(" not in sources] == []
    assert [f for f in sorted(TABLE) if not hasattr(pynvml, f)] == []
    assert len(TABLE) == len(CALLS), "one row per function"


def test_the_doc_is_the_table() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_nvml_calls_doc.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
