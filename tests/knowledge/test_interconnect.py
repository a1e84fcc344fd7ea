"""gpudoctor.knowledge.interconnect: PCI bus ids as the kernel log and NVML write them."""

from __future__ import annotations

from gpudoctor.knowledge.interconnect import normalize_bus_id, nvml_bus_id


def test_kernel_log_and_nvml_bus_ids_name_the_same_gpu() -> None:
    key = normalize_bus_id("00000000:3A:00.0")
    assert normalize_bus_id("PCI:0000:3a:00") == normalize_bus_id("0000:3a:00.0") == key == (0, 0x3A, 0, 0)
    assert normalize_bus_id("PCI:0001:3a:00") != key
    assert normalize_bus_id("garbage") != key
    assert nvml_bus_id("PCI:0000:3a:00") == nvml_bus_id("0000:3A:00") == "00000000:3A:00.0"
