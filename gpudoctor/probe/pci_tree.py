"""The PCIe path of each GPU as the kernel exposes it, without lspci or setpci.

For every GPU and each bridge above it (PCIe switch ports, the root port), from sysfs:

    /sys/bus/pci/devices/<bdf> -> ../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/<bdf>
    <dev>/max_link_speed "16.0 GT/s PCIe", <dev>/max_link_width "16"   Link Capabilities: the card's
        own maximum for a GPU, the slot's for the bridge above it
    <dev>/iommu_group -> ../../kernel/iommu_groups/<n>, and /sys/kernel/iommu_groups/<n>/type
        ("identity" under iommu=pt, "DMA"/"DMA-FQ" when the IOMMU translates)
    <dev>/config   PCI configuration space: the ACS extended capability (ID 0x000D) and its control
        register at +6, as `lspci -vvv` prints it in "ACSCtl:". Linux lets an unprivileged reader
        see only the first 64 bytes (the header), so without root this is recorded as no_permission.

NCCL's troubleshooting guide ("PCI Access Control Services (ACS)"): IO virtualization "can interfere
with GPU Direct by redirecting all PCI point-to-point traffic to the CPU root complex, causing a
significant performance reduction or even a hang"; the reader here gives checks what they need to
judge P2P pairs below such bridges (knowledge/pci_paths.py).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path

from gpudoctor.knowledge.nic_locality import sysfs_bus_id
from gpudoctor.probe.files import missing_from_oserror
from gpudoctor.snapshot import Missing, PciNode

_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")

# sysfs max_link_speed ("8.0 GT/s PCIe", older kernels "8 GT/s") -> PCIe generation.
_SPEED_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}

EXTENDED_CONFIG = 0x100  # PCIe extended capabilities start here (PCIe base spec 7.6)
ACS_CAP_ID = 0x000D  # Access Control Services extended capability
ACS_CTRL_OFFSET = 6
UNPRIVILEGED_CONFIG_BYTES = 64  # what Linux's sysfs `config` gives a reader without CAP_SYS_ADMIN
MAX_DEPTH = 12  # bridges above one GPU; a deeper chain is not a real machine


def _read(path: Path, root: Path) -> str | Missing:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError as exc:
        return missing_from_oserror(exc, "/" + path.relative_to(root).as_posix())


def link_gen(text: str) -> int | None:
    """'16.0 GT/s PCIe' -> 4; None for 'Unknown' (virtual ports often say so) or anything else."""
    try:
        speed = float(text.split()[0])
    except (ValueError, IndexError):
        return None
    return _SPEED_GEN.get(speed)


def _max_gen(dev: Path, root: Path) -> int | Missing:
    text = _read(dev / "max_link_speed", root)
    if isinstance(text, Missing):
        return text
    gen = link_gen(text)
    return gen if gen is not None else Missing("unsupported", f"max_link_speed {text[:40]!r}")


def _max_width(dev: Path, root: Path) -> int | Missing:
    text = _read(dev / "max_link_width", root)
    if isinstance(text, Missing):
        return text
    return int(text) if text.isdigit() and 0 < int(text) <= 32 else Missing("unsupported", f"max_link_width {text!r}")


def card_max_width(root: Path, bus_id: str) -> int | Missing:
    """A GPU's own widest PCIe link (its Link Capabilities: drivers/pci/pci-sysfs.c max_link_width_show
    -> pcie_get_width_cap), for the GPU probe's pcie_width_gpu_max. NVML has no GPU-only width call:
    nvmlDeviceGetMaxPcieLinkWidth is "possible with this device and system" (nvml.h 5513)."""
    try:
        bdf = sysfs_bus_id(bus_id)
    except ValueError:
        return Missing("error", f"PCI bus id {bus_id[:40]!r} does not parse")
    return _max_width(root / "sys/bus/pci/devices" / bdf, root)


def _iommu(dev: Path, root: Path) -> tuple[int | None | Missing, str | Missing]:
    link = dev / "iommu_group"
    if not link.exists():
        return None, Missing("unsupported", "in no IOMMU group")
    name = Path(os.path.realpath(link)).name
    if not name.isdigit():
        return Missing("error", "iommu_group is not a group number"), Missing("error", "")
    kind = _read(root / "sys/kernel/iommu_groups" / name / "type", root)
    return int(name), kind if isinstance(kind, Missing) or kind.isprintable() and len(kind) < 20 else Missing("error")


def acs_control(config: bytes) -> int | None | Missing:
    """The ACS Control register from a function's configuration space; None when it has no ACS
    capability, no_permission when only the unprivileged 64 bytes could be read."""
    if len(config) <= UNPRIVILEGED_CONFIG_BYTES:
        return Missing("no_permission", "PCI extended configuration space needs root (lspci -vvv as root shows ACSCtl)")
    if len(config) <= EXTENDED_CONFIG:
        return None  # conventional PCI: no extended capabilities
    offset, seen = EXTENDED_CONFIG, 0
    while offset and offset + 8 <= len(config) and seen < 64:
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_CAP_ID:
            return struct.unpack_from("<H", config, offset + ACS_CTRL_OFFSET)[0]
        offset, seen = (header >> 20) & 0xFFC, seen + 1
        if offset < EXTENDED_CONFIG:
            return None
    return None


def _acs(dev: Path, root: Path) -> int | None | Missing:
    try:
        with open(dev / "config", "rb") as handle:
            config = handle.read(4096)
    except OSError as exc:
        return missing_from_oserror(exc, "/" + (dev / "config").relative_to(root).as_posix())
    return acs_control(config)


def _node(dev: Path, root: Path, upstream: str | None) -> PciNode:
    group, kind = _iommu(dev, root)
    return PciNode(
        upstream=upstream,
        max_link_gen=_max_gen(dev, root),
        max_link_width=_max_width(dev, root),
        iommu_group=group,
        iommu_type=kind,
        acs_ctrl=_acs(dev, root),
    )


def sysfs_device(root: Path, bus_id: str) -> Path | None:
    """The device directory under /sys/devices that /sys/bus/pci/devices/<bus id> links to, for any
    form of bus id (NVML's, lspci's); None when the id does not parse or sysfs does not list it."""
    try:
        bdf = sysfs_bus_id(bus_id)
    except ValueError:
        return None
    link = root / "sys/bus/pci/devices" / bdf
    return Path(os.path.realpath(link)) if link.exists() else None


def read_pci_tree(root: Path, gpu_bus_ids: Sequence[str]) -> dict[str, PciNode]:
    """Every GPU's PCI function and the bridges above it, by sysfs bus id; a GPU sysfs does not
    list is left out."""
    out: dict[str, PciNode] = {}
    for bus_id in gpu_bus_ids:
        dev = sysfs_device(root, bus_id)
        for _ in range(MAX_DEPTH):
            if dev is None or not _BDF.fullmatch(dev.name) or dev.name in out:
                break
            parent = dev.parent
            out[dev.name] = _node(dev, root, parent.name if _BDF.fullmatch(parent.name) else None)
            dev = parent
    return out
