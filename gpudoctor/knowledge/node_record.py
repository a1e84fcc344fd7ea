"""One node's facts as the multi-node comparison reads them, built from a snapshot or from a saved
report's `facts` block: the one definition shared by the torchrun/srun path (each node's parent
sends them to rank 0, checks/active/node_task.py) and `gpudoctor fleet` (read from files,
gpudoctor/fleet.py). Their shape and bounds are knowledge/node_facts.py's `FACTS`.

A report records less than a snapshot: its `facts` block (knowledge/facts.py) has the driver, the
CUDA version and the GPUs (names, VBIOS, active NVLinks) but not NCCL, torch or the NICs;
`REPORTED` names the fields it gives.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpudoctor.snapshot import Snapshot, known


def from_machine_facts(machine: dict[str, Any]) -> dict[str, Any]:
    """The node facts a report's `facts` block (facts_from_snapshot's dict) gives."""
    gpus = [g for g in machine.get("gpus") or [] if isinstance(g, dict)]
    return {
        "host": machine.get("hostname"),
        "driver": machine.get("driver_version"),
        "cuda": machine.get("cuda_driver_version"),
        "gpus": [g.get("name") for g in gpus],
        "vbios": sorted({g["vbios"] for g in gpus if isinstance(g.get("vbios"), str) and g["vbios"]}),
        "nvlinks": [g.get("nvlinks_active") for g in gpus],
    }


REPORTED = frozenset(from_machine_facts({}))  # the fields a saved report records


def gpudirect_mode(snapshot: Snapshot) -> str | None:
    """How GPUDirect RDMA reaches the NICs: nvidia_peermem's state, "dma-buf" or "none"."""
    from gpudoctor.knowledge.nic_ports import dmabuf_ready, network_of

    net = network_of(snapshot)
    if net is None or not known(net.gpudirect):
        return None
    peermem = getattr(net.gpudirect, "peermem", None)
    if isinstance(peermem, str):
        return peermem
    return "dma-buf" if dmabuf_ready(snapshot, net)[0] else "none"


def ethernet_links(net: Any) -> list[str]:
    """The node's physical Ethernet interfaces that are up, as "speed/MTU" (NCCL's socket
    transport and RoCE ride on them): what should be alike across nodes."""
    if net is None or not isinstance(net.interfaces, list):
        return []
    return sorted(
        f"{i.speed_mbps if isinstance(i.speed_mbps, int) else '?'} Mb/s MTU {i.mtu if isinstance(i.mtu, int) else '?'}"
        for i in net.interfaces
        if i.kind == "ether" and not i.virtual and i.operstate == "up"
    )


def from_snapshot(
    snapshot: Snapshot, capacity: dict[str, Any] | None = None, findings: Iterable[dict[str, str]] = ()
) -> dict[str, Any]:
    """A node's facts from its snapshot; `capacity` (network_expectation.node_capacity, as JSON) and
    `findings` (its static findings that are not a pass) come from the caller, which knows the run."""
    from gpudoctor.knowledge.facts import facts_from_snapshot
    from gpudoctor.knowledge.nic_ports import network_of, port_views

    net = network_of(snapshot)
    nics = []
    mtu: dict[str, int] = {}
    interfaces = {i.name: i for i in net.interfaces} if net and isinstance(net.interfaces, list) else {}
    for dev in net.rdma if net and isinstance(net.rdma, list) else []:
        ports = [
            {"port": q.port, "state": q.state, "rate_gbps": q.rate_gbps, "link_layer": q.link_layer} for q in dev.ports
        ]
        nics.append({"name": dev.name, "hca_type": dev.hca_type, "fw_ver": dev.fw_ver, "ports": ports})
        for name in dev.netdevs if isinstance(dev.netdevs, list) else []:
            if name in interfaces and isinstance(interfaces[name].mtu, int):
                mtu[name] = interfaces[name].mtu
    machine = facts_from_snapshot(snapshot)  # the facts every report carries, for its GPUs and driver
    return jsonable(
        {
            **from_machine_facts(machine),
            "host": snapshot.host.hostname,
            "nccl": snapshot.software.torch_nccl,
            "torch": snapshot.software.torch,
            "nics": nics,
            "mtu": mtu,
            "ethernet": ethernet_links(net),
            "gpudirect": gpudirect_mode(snapshot),
            "capacity": capacity,
            "counters": {v.key: v.port.counters for v in port_views(net) if isinstance(v.port.counters, dict)},
            "findings": list(findings),
        }
    )


def jsonable(value: Any) -> Any:
    """Missing values become None: what a node sends is plain JSON."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value if value is None or isinstance(value, str | int | float | bool) else None
