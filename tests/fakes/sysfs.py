"""Sysfs/procfs trees of real machine shapes, written to a directory for the network probe.

The tree is laid out as the kernel lays it out: PCI functions under /sys/devices/pci<dom>:<bus>/,
/sys/bus/pci/devices/<bdf> and /sys/class/{infiniband,net}/<name> as relative symlinks into
it, a class device's `device` link to its PCI function. File contents are copied from public
readings (tests/reference/network-sysfs.md): `ibstatus` prints these files verbatim.

    tree = SysfsTree(tmp_path)
    nic = tree.pci("pci0000:15", ["0000:15:01.0", "0000:16:00.0", "0000:17:01.0", "0000:19:00.0"], numa=0)
    tree.hca("mlx5_0", nic, ports=[Port()])
    network = read_network(tmp_path, ["00000000:18:00.0"])
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

# NVIDIA/nccl#1591 (ibstat on an 8x H100 node): CA type MT4129 (ConnectX-7), firmware 28.41.1000,
# Rate 400, InfiniBand; the sysfs strings as ibstatus prints them (NVIDIA/nccl#1412, DeepEP#17).
CX7 = {"hca_type": "MT4129", "fw_ver": "28.41.1000", "board_id": "MT_0000000838"}
NDR = "400 Gb/sec (4X NDR)"
HDR = "200 Gb/sec (4X HDR)"
ACTIVE = "4: ACTIVE"
LINK_UP = "5: LinkUp"
# NVIDIA/nccl#489 (ibstatus): a port that is down and disabled, rate as an old kernel prints it.
DOWN = "1: DOWN"
DISABLED = "3: Disabled"
POLLING = "2: Polling"


@dataclass
class Port:
    state: str = ACTIVE
    phys_state: str = LINK_UP
    rate: str = NDR
    link_layer: str = "InfiniBand"
    counters: dict[str, int] = field(
        default_factory=lambda: {
            "symbol_error": 0,
            "link_error_recovery": 0,
            "link_downed": 0,
            "port_rcv_errors": 0,
            "excessive_buffer_overrun_errors": 0,
        }
    )


class SysfsTree:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    def _link(self, rel: str, target_rel: str) -> None:
        """A relative symlink at `rel` pointing at `target_rel` (both relative to the root)."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.symlink_to(os.path.relpath(self.root / target_rel, path.parent))

    def pci(self, host_bridge: str, chain: list[str], *, numa: int = 0, cls: str = "0x030200") -> str:
        """PCI functions `chain` (root port first, the device last) below `host_bridge`; every
        function gets its /sys/bus/pci/devices link and numa_node. Returns the device's dir."""
        path = f"sys/devices/{host_bridge}"
        for bdf in chain:
            path += f"/{bdf}"
            self._write(f"{path}/numa_node", str(numa))
            self._write(f"{path}/class", "0x060400" if bdf != chain[-1] else cls)
            self._link(f"sys/bus/pci/devices/{bdf}", path)
        return path

    def hca(self, name: str, device: str, *, ports: list[Port], netdev: str | None = None, **attrs: str) -> None:
        """An RDMA device of the PCI function at `device` (a dir from pci())."""
        values = {**CX7, "node_guid": "9c63:c003:0055:48ae", **attrs}
        dev = f"{device}/infiniband/{name}"
        for key, value in values.items():
            self._write(f"{dev}/{key}", value)
        self._link(f"{dev}/device", device)
        self._link(f"sys/class/infiniband/{name}", dev)
        for number, port in enumerate(ports, start=1):
            base = f"{dev}/ports/{number}"
            self._write(f"{base}/state", port.state)
            self._write(f"{base}/phys_state", port.phys_state)
            self._write(f"{base}/rate", port.rate)
            self._write(f"{base}/link_layer", port.link_layer)
            for counter, value in port.counters.items():
                self._write(f"{base}/counters/{counter}", str(value))
        if netdev:
            kind = 32 if ports and ports[0].link_layer == "InfiniBand" else 1
            self.netdev(netdev, device, kind=kind, mtu=4092 if kind == 32 else 9000)

    def netdev(
        self,
        name: str,
        device: str | None,
        *,
        kind: int = 1,
        operstate: str = "up",
        speed: int | None = 400000,
        mtu: int = 9000,
    ) -> None:
        """A network interface; `device` None makes it virtual (/sys/devices/virtual/net)."""
        where = f"{device}/net/{name}" if device else f"sys/devices/virtual/net/{name}"
        self._write(f"{where}/type", str(kind))
        self._write(f"{where}/operstate", operstate)
        self._write(f"{where}/mtu", str(mtu))
        if speed is not None:
            self._write(f"{where}/speed", str(speed))
        if device:
            self._link(f"{where}/device", device)
        self._link(f"sys/class/net/{name}", where)

    def set_port(self, hca: str, port: int, **files: str) -> None:
        """Overwrite port files (state, rate, ...) or counters ("counters/link_downed")."""
        base = os.path.realpath(self.root / "sys/class/infiniband" / hca)
        for key, value in files.items():
            Path(base, "ports", str(port), key.replace("__", "/")).write_text(value + "\n")

    def peermem(self, module: str = "nvidia_peermem") -> None:
        rel = {"nvidia_peermem": "sys/module/nvidia_peermem/version"}.get(
            module, f"sys/kernel/mm/memory_peers/{module}/version"
        )
        self._write(rel, "1.0")

    def nvidia_version(self, *, open_module: bool) -> None:
        # /proc/driver/nvidia/version, as the open and the proprietary module print it.
        line = (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build"
            if open_module
            else "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Thu Feb 22 01:44:30 UTC 2024"
        )
        self._write("proc/driver/nvidia/version", line)


# The 8x H100 fixture's GPUs (tests/fixtures/h100_sxm_8x.json), NUMA 0 for the first four.
H100_GPUS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def hgx_h100_node(
    root: Path,
    *,
    peermem: bool = True,
    ports: dict[int, Port] | None = None,
    nics_on_cpu: bool = False,
    open_module: bool = False,
) -> SysfsTree:
    """An HGX H100 node shaped like the ones in NVIDIA/nccl#1591 and deepseek-ai/DeepEP#128: each
    GPU shares a PCIe switch with its own ConnectX-7 NDR port (topo -m: PIX), one switch per GPU
    pair of host bridges, two NUMA nodes; a 100 GbE management port on the CPU; nvidia_peermem.
    `ports` replaces the Port of NIC i (mlx5_i) to build a fault; `nics_on_cpu` puts each NIC on a
    root port of its own (PHB to its GPU, as in a server without GPU-side PCIe switches)."""
    tree = SysfsTree(root)
    for i, bus in enumerate(H100_GPUS):
        b = int(bus, 16)
        numa = 0 if i < 4 else 1
        bridge = f"pci0000:{b - 3:02x}"
        rp, usp = f"0000:{b - 3:02x}:01.0", f"0000:{b - 2:02x}:00.0"
        gpu_dsp, nic_dsp = f"0000:{b - 1:02x}:00.0", f"0000:{b - 1:02x}:01.0"
        tree.pci(bridge, [rp, usp, gpu_dsp, f"0000:{b:02x}:00.0"], numa=numa)
        nic_chain = (
            [f"0000:{b - 3:02x}:02.0", f"0000:{b + 1:02x}:00.0"]
            if nics_on_cpu
            else [rp, usp, nic_dsp, f"0000:{b + 1:02x}:00.0"]
        )
        nic = tree.pci(bridge, nic_chain, numa=numa, cls="0x020700")
        tree.hca(f"mlx5_{i}", nic, ports=[(ports or {}).get(i, Port())], netdev=f"ibp{b + 1}s0")
    eth = tree.pci("pci0000:00", ["0000:00:1c.0", "0000:01:00.0"], numa=0, cls="0x020000")
    tree.netdev("eno1", eth, speed=100000, mtu=1500)
    tree.netdev("lo", None, kind=772, speed=None, mtu=65536)
    if peermem:
        tree.peermem()
    tree.nvidia_version(open_module=open_module)
    return tree


def h100_gpu_bus_ids() -> list[str]:
    return [f"00000000:{bus.upper()}:00.0" for bus in H100_GPUS]


def cpu_node(root: Path, *, fw_ver: str = CX7["fw_ver"], ports: dict[int, Port] | None = None) -> SysfsTree:
    """A GPU-less node with four ConnectX-7 NDR ports (the CPU "nodes" of the multi-node tests)."""
    tree = SysfsTree(root)
    for i in range(4):
        nic = tree.pci(
            f"pci0000:{0x10 * (i + 1):02x}",
            [f"0000:{0x10 * (i + 1):02x}:01.0", f"0000:{0x10 * (i + 1) + 1:02x}:00.0"],
            cls="0x020700",
        )
        tree.hca(
            f"mlx5_{i}", nic, ports=[(ports or {}).get(i, Port())], netdev=f"ibp{0x10 * (i + 1) + 1}s0", fw_ver=fw_ver
        )
    tree.netdev("lo", None, kind=772, speed=None, mtu=65536)
    return tree
