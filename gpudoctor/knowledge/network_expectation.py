"""What inter-node all-reduce busbw a node's NICs should carry: the model behind GD680.

    expected busbw = min over nodes (rail ports used x healthy port rate / 8) x 0.96

NCCL's maintainers quote the achievable all-reduce busbw across nodes as the NICs' line rate
less ~4 %: "24GB/s is the peak performance per 200G NIC (12 GB/s for 100G NICs)" (sjeaugey,
NVIDIA/nccl-tests#119), "8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW" on DGX
A100 (AddyLaddy, NVIDIA/nccl#1576), "CX-7 NICs at NDR rate (400Gbps) should achieve up to
48-49GB/s per NIC" (NVIDIA/nccl-tests#267): 24/25, 192/200, 48/50 = 0.96. (For the `busbw`
definition, a ring's busbw is the bandwidth each rank's link carries, so on one GPU per node
it is the NIC's.)

The rails are the ports of the kind that sits next to the GPUs (checks/network.rail_kind), as
NCCL_IB_HCA selects them, counted whether up or down and at the fastest rate of their kind on
the node: the expectation is what healthy hardware carries, never what the links that happen
to be up give (a node with a rail down is judged against its healthy figure and fails). A
rank uses one NIC (NCCL's rings and trees pair each GPU with its nearest NIC), so a node's
ranks use at most as many rails as there are ranks on it. A ring across nodes also runs through
each node's own GPU links, so the node's intra-node expectation (expectations.expected_busbw)
caps it where it is lower (a PCIe box with many NICs). Two-node tree all-reduce can read above
the line rate (NVIDIA/nccl#1576); a model for large messages (>= 256 MiB).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.knowledge.expectations import expected_busbw
from gpudoctor.knowledge.nccl_list import parse_nccl_list
from gpudoctor.knowledge.nic_ports import gpu_nic_levels, network_of, port_views, rail_kind
from gpudoctor.snapshot import Gpu, Snapshot

NET_EFFICIENCY = 0.96
NET_SOURCE = "24 GB/s per 200G NIC (sjeaugey, NVIDIA/nccl-tests#119); 8x 200G on DGX A100: 192 GB/s (NVIDIA/nccl#1576)"


@dataclass(frozen=True)
class NodeCapacity:
    line_gbps: float  # GB/s, the rails' line rate together
    ports: int  # rails the node's ranks use
    port_rate_gbps: float  # Gb/s per rail, healthy
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)
    intra_gbps: float | None = None  # the node's own links' expected busbw, when lower caps

    @property
    def expected_gbps(self) -> float:
        nics = self.line_gbps * NET_EFFICIENCY
        return nics if self.intra_gbps is None else min(nics, self.intra_gbps)

    @property
    def basis(self) -> str:
        nics = (
            f"{self.ports} x {self.port_rate_gbps:g} Gb/s {self.link_layer} rail(s) = {self.line_gbps:g} GB/s "
            f"x {NET_EFFICIENCY:g}"
        )
        if self.intra_gbps is not None and self.intra_gbps < self.line_gbps * NET_EFFICIENCY:
            return f"{nics}, capped at the node's own {self.intra_gbps:.1f} GB/s (its GPUs' links)"
        return nics

    def to_json(self) -> dict[str, object]:
        return {
            "line_gbps": round(self.line_gbps, 3),
            "ports": self.ports,
            "port_rate_gbps": self.port_rate_gbps,
            "link_layer": self.link_layer,
            "expected_gbps": round(self.expected_gbps, 3),
            "basis": self.basis,
        }


def node_capacity(snapshot: Snapshot, gpus: list[Gpu], ranks_on_node: int) -> NodeCapacity | None:
    """The node's healthy inter-node capacity; None without RDMA rails (TCP sockets: no model)."""
    views = port_views(network_of(snapshot))
    rail = rail_kind(views, gpu_nic_levels(snapshot, gpus))
    if rail is None:
        return None
    hca = snapshot.env.get("NCCL_IB_HCA")
    spec = parse_nccl_list(hca) if hca is not None else None
    rails = [v for v in views if v.kind == rail and (spec is None or spec.selects(v.device.name, v.port.port))]
    rates = [v.rate for v in rails if v.rate and v.active]
    if not rails or not rates:
        return None
    ports = min(len(rails), max(1, ranks_on_node))
    rate = max(rates)
    intra = expected_busbw(snapshot, [g.index for g in gpus]) if len(gpus) >= 2 else None
    return NodeCapacity(ports * rate / 8.0, ports, rate, rail[0], intra.busbw_gbps if intra else None)
