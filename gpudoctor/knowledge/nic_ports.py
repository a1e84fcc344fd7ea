"""A node's RDMA ports as the network checks, the cross-node comparison and the inter-node
bandwidth model see them: each port with its device, which NICs are near which GPU, which kind of
port the GPUs' traffic leaves by, and whether GPUDirect RDMA's dma-buf path can work."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpudoctor.knowledge import nic_locality
from gpudoctor.knowledge.versions import version_tuple
from gpudoctor.records import Record, record
from gpudoctor.snapshot import Gpu, Network, RdmaDevice, RdmaPort, Snapshot

DMABUF_KERNEL = (5, 12)  # ib_umem_dmabuf (RDMA dma-buf import) arrived in Linux 5.12


DMABUF_CUDA = (11, 7)  # NCCL asks CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED only from CUDA 11.7 (src/init.cc)


@record
class PortView(Record):
    device: RdmaDevice
    port: RdmaPort

    @property
    def key(self) -> str:
        return f"{self.device.name}:{self.port.port}"

    @property
    def label(self) -> str:
        return f"{self.device.name} port {self.port.port}"

    @property
    def active(self) -> bool:
        return self.port.state == "ACTIVE"

    @property
    def kind(self) -> tuple[str, str]:
        layer = self.port.link_layer if isinstance(self.port.link_layer, str) else "?"
        hca = self.device.hca_type if isinstance(self.device.hca_type, str) else "?"
        return layer, hca

    @property
    def rate(self) -> float | None:
        return self.port.rate_gbps if isinstance(self.port.rate_gbps, float) else None

    def describe(self) -> dict[str, Any]:
        p = self.port
        return {
            "device": self.device.name,
            "port": p.port,
            "state": p.state if isinstance(p.state, str) else None,
            "phys_state": p.phys_state if isinstance(p.phys_state, str) else None,
            "rate": p.rate if isinstance(p.rate, str) else None,
            "link_layer": p.link_layer if isinstance(p.link_layer, str) else None,
        }


def network_of(snapshot: Snapshot) -> Network | None:
    net = snapshot.host.network
    return net if isinstance(net, Network) else None


def port_views(network: Network | None) -> list[PortView]:
    if network is None or not isinstance(network.rdma, list):
        return []
    return [PortView(d, p) for d in network.rdma for p in d.ports]


def gpu_nic_levels(snapshot: Snapshot, gpus: list[Gpu]) -> dict[int, dict[str, str]]:
    """GPU (NVML index) -> RDMA device name -> topo -m level, where both places are recorded."""
    network = network_of(snapshot)
    if network is None or not isinstance(network.pci, dict) or not isinstance(network.rdma, list):
        return {}
    out: dict[int, dict[str, str]] = {}
    for gpu in gpus:
        try:
            place = network.pci.get(nic_locality.sysfs_bus_id(gpu.pci_bus_id))
        except ValueError:
            continue
        if place is None:
            continue
        row = {}
        for dev in network.rdma:
            nic = network.pci.get(dev.pci_bus_id) if isinstance(dev.pci_bus_id, str) else None
            if nic is not None:
                row[dev.name] = nic_locality.level(place, nic)
        if row:
            out[gpu.index] = row
    return out


def rail_kind(views: list[PortView], levels: dict[int, dict[str, str]]) -> tuple[str, str] | None:
    """The kind of port the GPUs' traffic leaves by: the kind with most devices near a GPU, or,
    when locality is unknown, the most common kind (ties: the faster)."""
    if not views:
        return None
    near = {name for row in levels.values() for name, lvl in row.items() if nic_locality.near(lvl)}
    by_near = Counter(v.kind for v in views if v.device.name in near)
    counts = by_near or Counter(v.kind for v in views)
    fastest = {k: max((v.rate or 0.0) for v in views if v.kind == k) for k in counts}
    return max(counts, key=lambda k: (counts[k], fastest[k]))


def dmabuf_ready(snapshot: Snapshot, network: Network) -> tuple[bool, dict[str, Any]]:
    """The dma-buf path's preconditions as far as files tell: open kernel module, Linux >= 5.12,
    a CUDA >= 11.7 driver (NCCL confirms at run time with ibv_reg_dmabuf_mr, gdr.cc)."""
    gd = network.gpudirect
    open_module = getattr(gd, "open_kernel_module", None) is True
    kernel = version_tuple(snapshot.host.kernel) or ()
    cuda = snapshot.driver.cuda_driver_version
    cuda_v = version_tuple(cuda) if isinstance(cuda, str) else None
    ready = open_module and kernel >= DMABUF_KERNEL and (cuda_v is None or cuda_v >= DMABUF_CUDA)
    return ready, {
        "open_kernel_module": open_module,
        "kernel": snapshot.host.kernel,
        "cuda_driver": cuda_v and ".".join(map(str, cuda_v)),
    }
