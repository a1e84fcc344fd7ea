"""Assemble one Snapshot of this machine: driver, GPUs, pairs, host, software, environment.

Nothing raises past `collect_machine`: when NVML cannot start, the driver status says
why, the GPU list is empty, and everything on the host side is still collected.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from gpudoctor.knowledge.interconnect import nvml_bus_id
from gpudoctor.probe.device import DeviceReader
from gpudoctor.probe.driver import (
    SystemctlRunner,
    fabric_manager,
    kernel_module_version,
    nvml_library,
    read_driver,
    systemctl_is_active,
)
from gpudoctor.probe.environment import allowed_env
from gpudoctor.probe.gpus import GpuReading, read_gpu
from gpudoctor.probe.host import guarded, pid_namespace_isolated, read_host
from gpudoctor.probe.links import read_error_counts, with_second_counts
from gpudoctor.probe.network import network_root, read_network
from gpudoctor.probe.nvml import Nvml
from gpudoctor.probe.pairs import read_pairs
from gpudoctor.probe.pci_tree import read_pci_tree
from gpudoctor.probe.software import read_software
from gpudoctor.snapshot import SCHEMA_VERSION, Driver, Gpu, GpuPair, Missing, Snapshot, now_iso


def driver_bus_ids(root: Path) -> list[str]:
    """The GPUs the kernel driver knows, by bus id (/proc/driver/nvidia/gpus/<bus id>), in PCI
    order: NVML's order too, so the bus id of a GPU NVML gives no handle for can be named."""
    base = root / "proc/driver/nvidia/gpus"
    ids = []
    for entry in base.iterdir() if base.is_dir() else []:
        try:
            ids.append(nvml_bus_id(entry.name))
        except ValueError:
            continue
    return sorted(ids)


def count_again(nvml: Nvml, reading: GpuReading) -> Gpu:
    """Read a GPU's link error counters a second time: a counter that rose since the first
    reading is a link erroring now, not one that erred once since the driver loaded. A link whose
    counters could not be read the first time is not asked again."""
    if reading.counted_at is None or isinstance(reading.handle, Missing):
        return reading.gpu
    reader = DeviceReader(nvml, reading.handle)
    links = reading.gpu.nvlinks
    counted = [link for link in links if not isinstance(link.errors, Missing)] if isinstance(links, list) else links
    gpu = with_second_counts(reading.gpu, reading.counted_at, read_error_counts(reader, counted))
    return dataclasses.replace(gpu, lost=True) if reader.lost else gpu


def read_gpus(nvml: Nvml, root: Path, isolated: bool | Missing) -> tuple[Driver, list[Gpu], list[GpuPair]]:
    driver = read_driver(nvml, root)
    count = nvml.call("nvmlDeviceGetCount")
    if isinstance(count, Missing) or not isinstance(count, int):
        detail = count.detail if isinstance(count, Missing) else f"unexpected count {count!r}"
        return dataclasses.replace(driver, nvml_status="error", nvml_detail=f"nvmlDeviceGetCount: {detail}"), [], []
    bus_ids = guarded(driver_bus_ids, root)
    known = bus_ids if isinstance(bus_ids, list) and len(bus_ids) == count else [""] * count
    readings = [read_gpu(nvml, index, root, isolated, known[index]) for index in range(count)]
    pairs = read_pairs(nvml, {index: r.handle for index, r in enumerate(readings)})
    return driver, [count_again(nvml, r) for r in readings], pairs


def collect_machine(
    nvml: Nvml,
    environ: Mapping[str, str] | None = None,
    *,
    root: Path | str = "/",
    systemctl: SystemctlRunner = systemctl_is_active,
) -> Snapshot:
    """Probe this machine. `root` relocates procfs/sysfs reads and `systemctl` the unit
    query, both for tests; `environ` defaults to os.environ."""
    root = Path(root)
    environ = os.environ if environ is None else environ
    isolated = guarded(pid_namespace_isolated, root)
    init = nvml.init()
    gpus: list[Gpu] = []
    pairs: list[GpuPair] = []
    if init.ok:
        try:
            driver, gpus, pairs = read_gpus(nvml, root, isolated)
        except Exception as exc:  # noqa: BLE001  (a probe bug must not cost the host facts)
            driver = Driver(nvml_status="error", nvml_detail=f"probe failed: {type(exc).__name__}: {exc}")
            gpus, pairs = [], []
        finally:
            nvml.shutdown()
        driver = dataclasses.replace(driver, fabric_manager=guarded(fabric_manager, gpus, systemctl))
    else:
        down = Missing("error", f"NVML did not start ({init.status})")
        library = guarded(nvml_library, root, environ)  # the user-space half on disk, apart from the module
        driver = Driver(
            nvml_status=init.status,
            nvml_detail=init.detail,
            driver_version=down,
            cuda_driver_version=down,
            nvml_version=down,
            # Readable without NVML, and what tells a version mismatch apart.
            kernel_module_version=guarded(kernel_module_version, root),
            fabric_manager=down,
            nvml_library=library[0] if isinstance(library, tuple) else library,
            nvml_library_changed=library[1] if isinstance(library, tuple) else library,
        )
    return Snapshot(
        schema_version=SCHEMA_VERSION,
        created=now_iso(),
        gpus=gpus,
        pairs=pairs,
        driver=driver,
        host=dataclasses.replace(
            read_host(root, environ, isolated),
            network=guarded(read_network, network_root(environ, root), [g.pci_bus_id for g in gpus]),
            pci_tree=guarded(read_pci_tree, root, [g.pci_bus_id for g in gpus]),
        ),
        software=read_software(),
        env=allowed_env(environ),
    )
