"""Inter-node network facts from sysfs and procfs only (no ibstat, no ethtool, no root).

    /sys/class/infiniband/<dev>/{hca_type,board_id,fw_ver,node_guid,device,device/net/}
    /sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer,counters/<name>}
    /sys/class/net/<if>/{type,operstate,speed,mtu,device}
    /sys/bus/pci/devices/<bdf> -> ../../../devices/pci0000:17/.../<bdf>, and its numa_node
    /sys/module/nvidia_peermem/version, /sys/kernel/mm/memory_peers/nv_mem{,_nc}/version
    /proc/driver/nvidia/version

The formats are the kernel's (drivers/infiniband/core/sysfs.c): state "4: ACTIVE", phys_state
"5: LinkUp", rate "400 Gb/sec (4X NDR)" (older kernels: "10 Gb/sec (4X)"), link_layer
"InfiniBand" or "Ethernet". `ibstatus` (rdma-core) prints exactly these files.

Every reader takes the filesystem root; GPUDOCTOR_NETWORK_ROOT (test-only) points this module
alone at a recorded tree, so several "nodes" on one machine each read their own facts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpudoctor.probe.files import missing_from_oserror
from gpudoctor.probe.pci_tree import sysfs_device
from gpudoctor.snapshot import (
    RDMA_ERROR_COUNTERS,
    GpuDirect,
    Missing,
    NetInterface,
    Network,
    PciPlace,
    RdmaDevice,
    RdmaPort,
)

ROOT_ENV = "GPUDOCTOR_NETWORK_ROOT"  # test-only: read the network facts under this directory

# NCCL's list, in this order (src/transport/net_ib/gdr.cc, ncclIbGdrSupport).
PEERMEM_FILES = (
    ("nv_mem", "sys/kernel/mm/memory_peers/nv_mem/version"),
    ("nv_mem_nc", "sys/kernel/mm/memory_peers/nv_mem_nc/version"),
    ("nvidia_peermem", "sys/module/nvidia_peermem/version"),
)
_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
# ARPHRD_* from include/uapi/linux/if_arp.h: what /sys/class/net/<if>/type holds.
_IF_TYPES = {1: "ether", 32: "infiniband", 772: "loopback"}


def network_root(environ: Mapping[str, str], root: Path) -> Path:
    override = environ.get(ROOT_ENV, "").strip()
    return Path(override) if override else root


def _shown(path: Path, root: Path) -> str:
    """The path as it is on the machine (without the test root), for a Missing's detail."""
    try:
        return "/" + path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _text(path: Path, root: Path) -> str | Missing:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as exc:
        return missing_from_oserror(exc, _shown(path, root))


def _int(path: Path, root: Path) -> int | Missing:
    text = _text(path, root)
    if isinstance(text, Missing):
        return text
    try:
        return int(text, 0)
    except ValueError:
        return Missing("error", f"{_shown(path, root)}: not a number: {text!r}")


def parse_state(text: str) -> str:
    """'4: ACTIVE' -> 'ACTIVE'; '5: LinkUp' -> 'LinkUp' (a value without the number is kept)."""
    number, sep, name = text.partition(":")
    return name.strip() if sep and number.strip().isdigit() else text.strip()


def parse_rate(text: str) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0; '2.5 Gb/sec (1X SDR)' -> 2.5; None when unreadable."""
    match = _RATE.match(text)
    return float(match.group(1)) if match else None


def _pci_bus_id_of(device_link: Path, root: Path) -> str | Missing:
    """The PCI function behind a class device's `device` link (the last BDF on its real path)."""
    if not device_link.exists():
        return Missing("unsupported", f"{_shown(device_link, root)}: not present")
    for part in reversed(Path(os.path.realpath(device_link)).parts):
        if _BDF.match(part):
            return part.lower()
    return Missing("unsupported", f"{_shown(device_link, root)}: not a PCI device")


def _port(port_dir: Path, root: Path) -> RdmaPort:
    state = _text(port_dir / "state", root)
    phys = _text(port_dir / "phys_state", root)
    rate = _text(port_dir / "rate", root)
    gbps: float | Missing = rate if isinstance(rate, Missing) else (parse_rate(rate) or Missing("error", rate))
    return RdmaPort(
        port=int(port_dir.name),
        state=state if isinstance(state, Missing) else parse_state(state),
        phys_state=phys if isinstance(phys, Missing) else parse_state(phys),
        rate_gbps=gbps,
        rate=rate,
        link_layer=_text(port_dir / "link_layer", root),
        counters=port_counters(port_dir, root),
    )


def port_counters(port_dir: Path, root: Path) -> dict[str, int] | Missing:
    base = port_dir / "counters"
    if not base.is_dir():
        return Missing("unsupported", f"{_shown(base, root)}: not present")
    out: dict[str, int] = {}
    for name in RDMA_ERROR_COUNTERS:
        value = _int(base / name, root)
        if isinstance(value, int):
            out[name] = value
    return out


def _ports(dev_dir: Path, root: Path) -> list[RdmaPort]:
    ports_dir = dev_dir / "ports"
    if not ports_dir.is_dir():
        return []
    return [_port(p, root) for p in sorted(ports_dir.iterdir(), key=lambda p: int(p.name)) if p.name.isdigit()]


def _netdevs(dev_dir: Path, root: Path) -> list[str] | Missing:
    net = dev_dir / "device" / "net"
    if not net.is_dir():
        return Missing("unsupported", f"{_shown(net, root)}: not present")
    return sorted(p.name for p in net.iterdir())


def _natural(name: str) -> tuple[str, int]:
    """mlx5_2 before mlx5_10."""
    head, _, tail = name.rpartition("_")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def read_rdma(root: Path) -> list[RdmaDevice]:
    base = root / "sys/class/infiniband"
    if not base.is_dir():
        return []  # no RDMA driver loaded: a fact, not an error
    devices = []
    for dev_dir in sorted(base.iterdir(), key=lambda p: _natural(p.name)):
        devices.append(
            RdmaDevice(
                name=dev_dir.name,
                pci_bus_id=_pci_bus_id_of(dev_dir / "device", root),
                hca_type=_text(dev_dir / "hca_type", root),
                board_id=_text(dev_dir / "board_id", root),
                fw_ver=_text(dev_dir / "fw_ver", root),
                node_guid=_text(dev_dir / "node_guid", root),
                netdevs=_netdevs(dev_dir, root),
                ports=_ports(dev_dir, root),
            )
        )
    return devices


def read_counters(root: Path) -> dict[str, dict[str, int]]:
    """Every RDMA port's error counters now, as {"mlx5_0:1": {"symbol_error": 0, ...}}: the
    second reading, after the active run, that tells counters growing from old ones."""
    out: dict[str, dict[str, int]] = {}
    for dev in read_rdma(root):
        for port in dev.ports:
            if isinstance(port.counters, dict):
                out[f"{dev.name}:{port.port}"] = port.counters
    return out


def _speed(path: Path, root: Path) -> int | None | Missing:
    value = _int(path, root)
    if isinstance(value, Missing):
        # Reading `speed` of a link that is down fails with EINVAL: the driver does not know.
        return None if value.reason == "error" else value
    return value if value > 0 else None


def read_interfaces(root: Path) -> list[NetInterface]:
    base = root / "sys/class/net"
    if not base.is_dir():
        raise FileNotFoundError(2, "not present", "/sys/class/net")
    out = []
    for if_dir in sorted(base.iterdir(), key=lambda p: p.name):
        kind_code = _int(if_dir / "type", root)
        virtual = not (if_dir / "device").exists()
        out.append(
            NetInterface(
                name=if_dir.name,
                kind=_IF_TYPES.get(kind_code, "other") if isinstance(kind_code, int) else "other",
                virtual=virtual,
                operstate=_text(if_dir / "operstate", root),
                speed_mbps=_speed(if_dir / "speed", root),
                mtu=_int(if_dir / "mtu", root),
                pci_bus_id=None if virtual else _pci_bus_id_of(if_dir / "device", root),
            )
        )
    return out


def read_gpudirect(root: Path) -> GpuDirect:
    peermem = next((name for name, rel in PEERMEM_FILES if (root / rel).exists()), None)
    version = _text(root / "proc/driver/nvidia/version", root)
    open_module: bool | Missing = version if isinstance(version, Missing) else "Open Kernel Module" in version
    return GpuDirect(peermem=peermem, open_kernel_module=open_module)


def pci_places(root: Path, bus_ids: Sequence[str]) -> dict[str, PciPlace]:
    """Where each PCI function hangs (path under /sys/devices, NUMA node); ids that are not
    there are left out."""
    devices = root / "sys/devices"
    out: dict[str, PciPlace] = {}
    for bus_id in bus_ids:
        real = sysfs_device(root, bus_id)
        if real is None:
            continue
        bdf = real.name
        link = root / "sys/bus/pci/devices" / bdf
        try:
            path = real.relative_to(os.path.realpath(devices)).as_posix()
        except ValueError:
            continue
        numa = _int(link / "numa_node", root)
        out[bdf] = PciPlace(path=path, numa_node=numa if isinstance(numa, int) and numa >= 0 else None)
    return out


def read_network(root: Path, gpu_bus_ids: Sequence[str] = ()) -> Network:
    """Everything this module reads; a part that cannot be read is a Missing, never an escape."""
    from gpudoctor.probe.host import guarded  # the probe's one guard (lazy: it brings the kernel-log reader)

    rdma = guarded(read_rdma, root)
    interfaces = guarded(read_interfaces, root)
    nic_ids = [d.pci_bus_id for d in rdma if isinstance(d.pci_bus_id, str)] if isinstance(rdma, list) else []
    if isinstance(interfaces, list):
        nic_ids += [i.pci_bus_id for i in interfaces if isinstance(i.pci_bus_id, str)]
    return Network(
        rdma=rdma,
        interfaces=interfaces,
        gpudirect=guarded(read_gpudirect, root),
        pci=guarded(pci_places, root, [*gpu_bus_ids, *dict.fromkeys(nic_ids)]),
    )
