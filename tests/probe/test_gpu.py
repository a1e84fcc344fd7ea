"""The probe against the real NVML of a GPU machine (skipped without one)."""

from __future__ import annotations

import pytest

from gpudoctor.probe import collect
from gpudoctor.snapshot import known


@pytest.mark.gpu
def test_real_probe_sees_every_gpu_nvml_counts() -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    snapshot = collect()
    assert snapshot.driver.nvml_status == "ok"
    assert len(snapshot.gpus) == count
    assert [g.index for g in snapshot.gpus] == list(range(count))
    assert len(snapshot.pairs) == count * (count - 1) // 2
    for gpu in snapshot.gpus:
        assert gpu.uuid.startswith("GPU-"), gpu.uuid
        assert gpu.name and gpu.pci_bus_id.count(":") == 2
        assert known(gpu.memory_total_mib) and gpu.memory_total_mib > 0
        assert known(gpu.compute_capability)
    assert isinstance(snapshot.driver.driver_version, str)
    assert isinstance(snapshot.driver.cuda_driver_version, str) and "." in snapshot.driver.cuda_driver_version
