"""The PCIe path of each GPU from a fake sysfs: link capabilities, IOMMU groups, ACS control, and the
virtual-machine facts (issue 21: what the kernel exposes without extra tools)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from gpudoctor.probe.host import virtualization
from gpudoctor.probe.pci_tree import acs_control, link_gen, read_pci_tree
from gpudoctor.snapshot import Missing

# NVIDIA/nccl#2079: the AMD GPP bridges above both GPUs read "ACSCtl: SrcValid+ ... ReqRedir+ CmpltRedir+
# UpstreamFwd+" = 0x001d.
ACS_ON = 0x001D


def config_space(acs: int | None, *, size: int = 4096, other_cap_first: bool = True) -> bytes:
    """A configuration space with, in its extended part, an AER capability then ACS (control `acs`)."""
    data = bytearray(size)
    if size <= 0x100:
        return bytes(data)
    if other_cap_first:
        struct.pack_into("<I", data, 0x100, 0x0001 | (1 << 16) | (0x148 << 20))  # AER, next at 0x148
        at = 0x148
    else:
        at = 0x100
    if acs is not None:
        struct.pack_into("<I", data, at, 0x000D | (1 << 16))  # ACS, last capability
        struct.pack_into("<HH", data, at + 4, 0x005F, acs)
    return bytes(data)


def device(root: Path, path: str, *, speed: str, width: str, group: int | None, config: bytes) -> None:
    dev = root / "sys/devices" / path
    dev.mkdir(parents=True, exist_ok=True)
    (dev / "max_link_speed").write_text(speed + "\n")
    (dev / "max_link_width").write_text(width + "\n")
    (dev / "config").write_bytes(config)
    if group is not None:
        groups = root / "sys/kernel/iommu_groups" / str(group)
        groups.mkdir(parents=True, exist_ok=True)
        (groups / "type").write_text("DMA\n")
        (dev / "iommu_group").symlink_to(os.path.relpath(groups, dev))
    bus = root / "sys/bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / dev.name).symlink_to(os.path.relpath(dev, bus))


def two_gpus_under_acs_bridges(root: Path, *, privileged: bool = True) -> None:
    """nccl#2079's box: GPUs 41:00.0 and 61:00.0 each below a root-port bridge with ACS on."""
    places = (("pci0000:40", "0000:40:01.1", "0000:41:00.0"), ("pci0000:60", "0000:60:01.1", "0000:61:00.0"))
    for rc, port, gpu in places:
        bridge_cfg = config_space(ACS_ON) if privileged else bytes(64)
        device(root, f"{rc}/{port}", speed="16.0 GT/s PCIe", width="16", group=None, config=bridge_cfg)
        gpu_cfg = config_space(None) if privileged else bytes(64)
        device(root, f"{rc}/{port}/{gpu}", speed="16.0 GT/s PCIe", width="16", group=int(gpu[5:7], 16), config=gpu_cfg)


def test_each_gpu_and_the_bridges_above_it_are_recorded(tmp_path: Path) -> None:
    two_gpus_under_acs_bridges(tmp_path)
    tree = read_pci_tree(tmp_path, ["00000000:41:00.0", "00000000:61:00.0", "00000000:99:00.0"])
    assert set(tree) == {"0000:40:01.1", "0000:41:00.0", "0000:60:01.1", "0000:61:00.0"}
    gpu, bridge = tree["0000:41:00.0"], tree["0000:40:01.1"]
    assert gpu.upstream == "0000:40:01.1" and bridge.upstream is None  # the host bridge pci0000:40 is no function
    assert (gpu.max_link_gen, gpu.max_link_width) == (4, 16)
    assert (gpu.iommu_group, gpu.iommu_type) == (0x41, "DMA")
    assert bridge.acs_ctrl == ACS_ON and gpu.acs_ctrl is None  # the GPU has no ACS capability
    assert bridge.iommu_group is None


def test_without_root_acs_is_recorded_as_not_readable(tmp_path: Path) -> None:
    two_gpus_under_acs_bridges(tmp_path, privileged=False)
    tree = read_pci_tree(tmp_path, ["00000000:41:00.0"])
    acs = tree["0000:40:01.1"].acs_ctrl
    assert isinstance(acs, Missing) and acs.reason == "no_permission" and "root" in acs.detail


def test_acs_control_is_found_along_the_capability_list() -> None:
    assert acs_control(config_space(ACS_ON)) == ACS_ON
    assert acs_control(config_space(0, other_cap_first=False)) == 0
    assert acs_control(config_space(None)) is None  # extended space without ACS
    assert acs_control(bytes(256)) is None  # conventional PCI
    looped = bytearray(4096)
    struct.pack_into("<I", looped, 0x100, 0x0001 | (0x100 << 20))  # a capability pointing at itself
    assert acs_control(bytes(looped)) is None  # bounded, never a hang


def test_link_speeds_read_as_generations() -> None:
    assert [link_gen(t) for t in ("2.5 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe")] == [1, 3, 4, 5]
    assert link_gen("8 GT/s") == 3 and link_gen("Unknown") is None and link_gen("") is None


def test_virtualization_from_cpu_flags_and_dmi(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu vme sse2 hypervisor avx\n")
    dmi = tmp_path / "sys/class/dmi/id"
    dmi.mkdir(parents=True)
    (dmi / "sys_vendor").write_text("Microsoft Corporation\n")
    (dmi / "product_name").write_text("Virtual Machine\n")
    v = virtualization(tmp_path)
    assert (v.hypervisor, v.sys_vendor, v.product_name) == (True, "Microsoft Corporation", "Virtual Machine")
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu vme sse2 avx\n")
    assert virtualization(tmp_path).hypervisor is False
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n")
    assert isinstance(virtualization(tmp_path).hypervisor, Missing)  # ARM has no such flag
