"""Snapshots of real machine shapes for the probe tests, built in code.

Readings follow /work/shared/reference/machines.md: an HGX H100 (8x "NVIDIA H100 80GB
HBM3", 81559 MiB, 700 W, VBIOS 96.00.74.00.01, Gen5 x16, 18 NVLink-4 links each into
four NVSwitches, NV18 between all pairs, 2 NUMA nodes "0-55,112-167" / "56-111,168-223",
driver 550.54.15 with CUDA 12.4), and a PCIe box of RTX 4090s without NVLink or ECC.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from typing import Any

from gpudoctor import snapshot as snap
from gpudoctor.snapshot import (
    SCHEMA_VERSION,
    Driver,
    FabricInfo,
    Gpu,
    GpuPair,
    GpuProcess,
    MigDevice,
    Missing,
    RemappedRows,
    Snapshot,
)
from tests.helpers import snapshots
from tests.paths import FIXTURES

UNSUPPORTED = Missing("unsupported")
CREATED = "2024-11-14T07:00:14+00:00"


def cpus(lo: int, hi: int) -> list[int]:
    return list(range(lo, hi + 1))


def h100_nvswitch_8x() -> Snapshot:
    """The recorded 8x H100 HGX fixture (tests/fixtures/h100_sxm_8x.json), so the probe's round
    trip and the checks read one and the same machine."""
    return snapshots.load("h100_sxm_8x")


def rtx4090_gpu(index: int) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-4090{index:04x}-0000-4000-8000-00000000000{index}",
        name="NVIDIA GeForce RTX 4090",
        pci_bus_id=f"00000000:{0x01 + 0x20 * index:02X}:00.0",
        memory_total_mib=24564,
        memory_used_mib=0,
        compute_capability="8.9",
        vbios="95.02.3C.00.EB",
        power_limit_w=450.0,
        persistence_mode=False,
        compute_mode="exclusive_process" if index == 1 else "default",
        mig_mode_current=UNSUPPORTED,
        mig_mode_pending=UNSUPPORTED,
        mig_devices=UNSUPPORTED,
        ecc_mode_current=False,
        ecc_mode_pending=False,
        pcie_gen_current=1,  # idle GPUs drop to Gen1
        pcie_gen_max=4,
        pcie_width_current=16,
        pcie_width_max=16,
        nvlinks=UNSUPPORTED,  # no NVLink on Ada GeForce
        numa_node=Missing("no_permission"),
        cpu_affinity=cpus(0, 31),
        ecc_uncorrected_volatile=UNSUPPORTED,
        ecc_uncorrected_aggregate=UNSUPPORTED,
        retired_pages_pending=UNSUPPORTED,
        remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failed=False),
        clock_event_reasons=0x1,
        fabric=UNSUPPORTED,
        processes=[],
        temperature_c=35,
        power_draw_w=21.5,
    )


def rtx4090_pcie_2x() -> Snapshot:
    return Snapshot(
        schema_version=SCHEMA_VERSION,
        created=CREATED,
        gpus=[rtx4090_gpu(0), rtx4090_gpu(1)],
        pairs=[GpuPair(a=0, b=1, pcie_level="PHB", p2p_read="gpu_not_supported", p2p_write="gpu_not_supported")],
        driver=Driver(driver_version="550.127.05", cuda_driver_version="12.4", nvml_version="12.550.127.05"),
    )


def a100_mig_gpu() -> Gpu:
    """An A100 with MIG on: 4 slices of 19968 MiB in slots 0, 1, 2 and 5 (slot 3, 4 empty)."""
    gpu = h100_nvswitch_8x().gpu(0)
    return Gpu(
        **{
            **gpu.__dict__,
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": "GPU-a1000000-0000-4000-8000-000000000001",
            "mig_mode_current": True,
            "mig_mode_pending": True,
            "mig_devices": [
                MigDevice(index=i, uuid=f"MIG-a1000000-0000-4000-8000-00000000010{i}", memory_total_mib=19968)
                for i in (0, 1, 2, 5)
            ],
            "remapped_rows": UNSUPPORTED,  # N/A at GPU level while MIG is enabled
            "fabric": FabricInfo(state="not_supported", status="success", health=UNSUPPORTED),
            "processes": [GpuProcess(pid=5151, used_memory_mib=None)],  # MIG hides per-process memory
        }
    )


# A real machine: one H200 in a pass-through Firecracker VM, driver 580.159.04, recorded by
# `gpudoctor snapshot` on 2026-11-26 (tests/fixtures/real/h200-vm-driver580.159.04-2026-11-26/README.md).
H200_VM = FIXTURES / "real" / "h200-vm-driver580.159.04-2026-11-26"


def h200_nvml_raw() -> dict[str, Any]:
    """What NVML itself answered on the H200 (nvml_raw.json, read with pynvml beside the probe)."""
    return json.loads((H200_VM / "nvml_raw.json").read_text(encoding="utf-8"))["gpus"][0]  # type: ignore[no-any-return]


def h200_vm() -> Snapshot:
    """The H200 as NVML reports it. The recording predates the probe's v2 memory call, the card's own
    PCIe maximum and the NUMA affinity: those readings come from what NVML answered on the same
    machine (nvml_raw.json: v2 used 0, reserved 615 MiB; GpuMaxPcieLinkGeneration 5) and from what
    nvidia-smi topo -m printed (NUMA Affinity 0; NVML's memory affinity call was not made there)."""
    recorded = snap.load(H200_VM / "snapshot.json")
    raw = h200_nvml_raw()
    gpu = dataclasses.replace(
        recorded.gpu(0),
        memory_used_mib=raw["mem_v2_mib"]["used"],
        memory_reserved_mib=raw["mem_v2_mib"]["reserved"],
        pcie_gen_gpu_max=raw["GpuMaxPcieLinkGeneration"],
        numa_affinity=[0],
    )
    return dataclasses.replace(recorded, gpus=[gpu])


def h200_smi() -> dict[str, str]:
    """nvidia-smi --query-gpu on the H200 at the same minute: field name -> printed value."""
    out: dict[str, str] = {}
    for name in ("nvidia-smi.csv", "nvidia-smi-extra.csv"):
        rows = list(csv.reader((H200_VM / name).read_text(encoding="utf-8").splitlines()))
        out.update({k.strip(): v.strip() for k, v in zip(rows[0], rows[1], strict=True)})
    return out
