"""GD44 (network links) and GD24 (NCCL_IB_HCA): the InfiniBand/RoCE ports, their rates and error
counters, how near each GPU's NIC is, GPUDirect RDMA, and what NCCL_IB_HCA selects.

Static: reads only `snapshot.host.network` (probe/network.py). Error counters growing during
the run (GD443) are judged by the `nodes` check, which reads them again after the active run.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.checks.targets import target_gpus
from gpudoctor.engine import CheckContext, Code, check
from gpudoctor.findings import Finding, Status
from gpudoctor.knowledge import nic_locality
from gpudoctor.knowledge.nccl_list import parse_nccl_list
from gpudoctor.knowledge.nic_ports import PortView, dmabuf_ready, gpu_nic_levels, network_of, port_views, rail_kind
from gpudoctor.knowledge.units import listed
from gpudoctor.knowledge.versions import version_tuple
from gpudoctor.snapshot import RDMA_ERROR_COUNTERS, Network

PORT_DOWN = Code(
    "GD440",
    "rdma-port-down",
    "InfiniBand/RoCE ports are up",
    what="Reads every RDMA port's state and physical state (/sys/class/infiniband/<dev>/ports/<n>/state, "
    "phys_state). A port that is not ACTIVE fails when it belongs to the node's rails (the kind of port "
    "that sits next to the GPUs, or the most common kind when GPU locality is unknown); another port "
    "that is down warns, unless it is the second port of a card whose first port is up (an uncabled "
    "spare) or is administratively disabled.",
    why="NCCL uses only ACTIVE ports (src/transport/net_ib/init.cc). A rail that is down takes its GPU's "
    "traffic to a farther NIC or off the network: the node's inter-node bandwidth drops by a rail, and "
    "every step of a multi-node job waits for this node. A port that flaps (Polling, LinkErrorRecovery) "
    "also breaks running jobs with NCCL 'IB completion with error'.",
    fix="Check the cable and the switch port (`ibstat`, `ibportstate`, the switch's logs); reseat or "
    "replace the cable or transceiver; drain the node until the port is ACTIVE/LinkUp.",
)
PORT_RATE = Code(
    "GD441",
    "rdma-port-rate-low",
    "InfiniBand/RoCE ports run at the rate of their peers",
    what="Compares each ACTIVE port's rate (ports/<n>/rate, e.g. '400 Gb/sec (4X NDR)') with the fastest "
    "port of the same kind (link layer and HCA type) on the host.",
    why="A link that trained at a lower speed or width (a bad cable or transceiver, 2X instead of 4X) "
    "carries a fraction of its peers' traffic; NCCL's rings and trees are paced by it. NVIDIA/nccl#307: "
    "two HDR ports negotiated 100G, so the node got 24 GB/s instead of 48.",
    fix="Replace or reseat the cable/transceiver of the slow port and check the switch port's "
    "configured speed; `ibstat` shows the rate, `mlxlink -d <dev>` the negotiated width and errors.",
)
PORT_ERRORS = Code(
    "GD442",
    "rdma-port-errors",
    "InfiniBand/RoCE port error counters are low",
    what="Reads the port error counters (ports/<n>/counters: symbol_error, link_error_recovery, "
    "link_downed, port_rcv_errors, excessive_buffer_overrun_errors) and warns at the default thresholds "
    "of rdma-core's ibcheckerrs (10 each). The counters count since they were last cleared (driver "
    "load or `perfquery -x`) and saturate instead of wrapping (8 bits for link_downed, 4 for "
    "excessive_buffer_overrun_errors).",
    why="Symbol errors and link recoveries are a marginal cable or transceiver; link_downed counts link "
    "flaps, each of which fails the NCCL connections crossing it. Counts that keep rising during a run "
    "are worse: GD443 judges those.",
    fix="Clear the counters (`perfquery -x`) and watch whether they rise (gpudoctor's active run reads "
    "them before and after, GD443); replace the cable/transceiver of a port that keeps counting.",
)
GPU_NIC_FAR = Code(
    "GD444",
    "gpu-no-near-nic",
    "Every GPU has an RDMA NIC nearby on PCIe",
    what="Walks the PCIe tree in sysfs as NCCL does (src/graph/xml.cc) and finds, for each GPU the run "
    "uses, the nearest RDMA NIC with an active port, in nvidia-smi topo -m's words (PIX, PXB, PHB, NODE, "
    "SYS). A GPU whose nearest NIC is beyond NCCL_NET_GDR_LEVEL (PXB by default) warns.",
    why="Beyond PXB NCCL does not use GPUDirect RDMA (src/graph/paths.cc): its inter-node traffic is "
    "staged through host memory and crosses the CPU interconnect. sjeaugey (NVIDIA/nccl#412): a NIC on "
    "a PCI switch with a GPU gives 24 GB/s per 200G NIC, a NIC attached to the CPU ~16 GB/s.",
    fix="Put the NICs on the GPUs' PCIe switches (the vendor's reference layout), or use the GPUs near a "
    "NIC; in a VM whose PCI tree is flattened, give NCCL the real topology (NCCL_TOPO_FILE).",
)
GDR_MISSING = Code(
    "GD445",
    "gpudirect-rdma-missing",
    "GPUDirect RDMA is available to NCCL",
    what="Looks for what NCCL's IB transport needs to let the NIC read and write GPU memory "
    "(src/transport/net_ib/gdr.cc): a peer-memory module (nvidia_peermem in /sys/module, or MLNX_OFED's "
    "nv_peer_mem under /sys/kernel/mm/memory_peers), or the dma-buf path (NVIDIA's open kernel module, "
    "Linux 5.12 or later, a CUDA 11.7+ driver; NCCL 2.13+). Warns on a host with RDMA ports and NVIDIA "
    "GPUs that has neither.",
    why="Without GPUDirect RDMA every inter-node transfer is copied through host memory: lower bandwidth "
    "and more CPU load (NVIDIA/nccl#412: the GPU Direct RDMA module is needed for full inter-node speed). "
    "NCCL logs 'GPU Direct RDMA Disabled' and says nothing else.",
    fix="Load the module (`modprobe nvidia-peermem`, shipped with the driver since R470; on Kubernetes the "
    "GPU Operator's driver.rdma.enabled=true), or use the open kernel module on Linux >= 5.12 for dma-buf.",
)
IB_HCA_MISSING = Code(
    "GD240",
    "nccl-ib-hca-no-match",
    "NCCL_IB_HCA names RDMA devices this host has",
    what="Matches NCCL_IB_HCA exactly as NCCL does (src/misc/utils.cc parseStringList/matchIfList, "
    "src/transport/net_ib/init.cc): comma-separated `<hca>[:<port>]` entries, prefix match unless the "
    "list starts with '=', an exclude list when it starts with '^', only ACTIVE InfiniBand/RoCE ports. "
    "Fails when nothing active is selected; warns for entries that match no device or port.",
    why="When the list selects nothing NCCL logs 'NET/IB : No device found' and silently falls back to "
    "TCP sockets: a multi-node job runs several times slower without an error. An entry naming a device "
    "that is not there is ignored without a word (a job script moved between clusters).",
    fix="Set NCCL_IB_HCA to devices of this host (`ls /sys/class/infiniband`, `ibstat -l`), e.g. "
    "`=mlx5_0,mlx5_1`, or unset it to let NCCL use every active port.",
)
IB_HCA_PREFIX = Code(
    "GD241",
    "nccl-ib-hca-prefix",
    "NCCL_IB_HCA entries select only the devices they name",
    what="Warns when an NCCL_IB_HCA entry without the '=' prefix is the full name of a device and also "
    "matches others as a prefix (mlx5_1 also selects mlx5_10 to mlx5_19).",
    why="NCCL matches prefixes unless the list starts with '=' (NCCL's env docs: 'using mlx5_1 without a "
    "preceding = will select mlx5_1 as well as mlx5_10 to mlx5_19'): the job uses, or with '^' leaves "
    "out, NICs nobody meant to name.",
    fix="Start the list with '=' for exact names: NCCL_IB_HCA==mlx5_0,mlx5_1 (or ^=mlx5_1 to exclude one).",
)
CODES = [IB_HCA_MISSING, IB_HCA_PREFIX, PORT_DOWN, PORT_RATE, PORT_ERRORS, GPU_NIC_FAR, GDR_MISSING]

# rdma-core infiniband-diags' default error thresholds (scripts/ibcheckerrs.in, etc/error_thresholds).
ERROR_THRESHOLDS = {name: 10 for name in RDMA_ERROR_COUNTERS}
# NCCL_NET_GDR_LEVEL: names, and the legacy integers of NCCL's env docs (> 4 is SYS).
GDR_LEVELS = {"LOC": -1, "PIX": 0, "PXB": 1, "PHB": 3, "SYS": 4}
GDR_LEGACY = {0: "LOC", 1: "PIX", 2: "PXB", 3: "PHB", 4: "SYS"}


def _sibling_up(view: PortView, views: list[PortView]) -> bool:
    """Another function of the same card (same bus:device, other function) has a port up."""
    if not isinstance(view.device.pci_bus_id, str):
        return False
    slot = view.device.pci_bus_id.rsplit(".", 1)[0]
    return any(
        v.active
        and v.device.name != view.device.name
        and isinstance(v.device.pci_bus_id, str)
        and v.device.pci_bus_id.rsplit(".", 1)[0] == slot
        for v in views
    )


def _states(view: PortView) -> str:
    p = view.port
    state = p.state if isinstance(p.state, str) else "unknown"
    phys = p.phys_state if isinstance(p.phys_state, str) else "unknown"
    return f"{state} ({phys})"


def port_findings(views: list[PortView], rail: tuple[str, str] | None) -> list[Finding]:
    out = []
    rails = [v for v in views if v.kind == rail]
    up_rails = [v for v in rails if v.active]
    for v in views:
        if v.active:
            continue
        evidence = {**v.describe(), "rail": v.kind == rail, "active_rails": len(up_rails), "rails": len(rails)}
        if v.kind == rail:
            left = (
                f"{len(up_rails)} of {len(rails)} {rail[0]} rails left"
                if up_rails
                else "no rail is up: inter-node traffic falls back to TCP sockets"
            )
            out.append(
                Finding(
                    PORT_DOWN.code,
                    Status.FAIL,
                    "host",
                    f"{v.label} is {_states(v)}: NCCL cannot use it ({left})",
                    PORT_DOWN.fix,
                    evidence,
                )
            )
        elif v.port.phys_state == "Disabled" or _sibling_up(v, views):
            why = "administratively disabled" if v.port.phys_state == "Disabled" else "the card's other port is up"
            out.append(
                Finding(
                    PORT_DOWN.code,
                    Status.PASS,
                    "host",
                    f"{v.label} is {_states(v)}, not a rail ({why}): ignored",
                    "",
                    evidence,
                )
            )
        else:
            out.append(
                Finding(
                    PORT_DOWN.code,
                    Status.WARN,
                    "host",
                    f"{v.label} is {_states(v)} (not one of the {rail[0] if rail else ''} rails)",
                    PORT_DOWN.fix,
                    evidence,
                )
            )
    if views and not any(f.status is not Status.PASS for f in out):
        out.append(
            Finding(
                PORT_DOWN.code,
                Status.PASS,
                "host",
                f"{len([v for v in views if v.active])} of {len(views)} RDMA port(s) active",
                "",
                {"ports": [v.describe() for v in views]},
            )
        )
    return out


def rate_findings(views: list[PortView], rail: tuple[str, str] | None) -> list[Finding]:
    out = []
    for kind in sorted({v.kind for v in views}):
        peers = [v for v in views if v.kind == kind and v.active and v.rate]
        if len(peers) < 2:
            continue
        top = max(v.rate or 0.0 for v in peers)
        slow = [v for v in peers if (v.rate or 0.0) < top]
        for v in slow:
            status = Status.FAIL if kind == rail else Status.WARN
            out.append(
                Finding(
                    PORT_RATE.code,
                    status,
                    "host",
                    f"{v.label} runs at {v.port.rate}, its {len(peers) - 1} {kind[0]} peer(s) at up to {top:g} Gb/sec",
                    PORT_RATE.fix,
                    {**v.describe(), "rate_gbps": v.rate, "peer_rate_gbps": top},
                )
            )
        if not slow:
            out.append(
                Finding(
                    PORT_RATE.code,
                    Status.PASS,
                    "host",
                    f"{len(peers)} active {kind[0]} port(s) ({kind[1]}) all at {top:g} Gb/sec",
                    "",
                    {"rate_gbps": top, "ports": [v.key for v in peers]},
                )
            )
    return out


def saturated(name: str, value: int) -> bool:
    return value >= (1 << RDMA_ERROR_COUNTERS.get(name, 64)) - 1


def error_findings(views: list[PortView]) -> list[Finding]:
    out = []
    counted = [v for v in views if isinstance(v.port.counters, dict)]
    for v in counted:
        assert isinstance(v.port.counters, dict)
        over = {k: n for k, n in v.port.counters.items() if n >= ERROR_THRESHOLDS.get(k, 1 << 62)}
        if not over:
            continue
        text = ", ".join(f"{k} {n}{' (saturated)' if saturated(k, n) else ''}" for k, n in over.items())
        out.append(
            Finding(
                PORT_ERRORS.code,
                Status.WARN,
                "host",
                f"{v.label} has counted {text} since its counters were last cleared",
                PORT_ERRORS.fix,
                {**v.describe(), "counters": v.port.counters, "thresholds": ERROR_THRESHOLDS},
            )
        )
    if counted and not out:
        out.append(
            Finding(
                PORT_ERRORS.code,
                Status.PASS,
                "host",
                f"error counters of {len(counted)} RDMA port(s) below rdma-core's thresholds",
                "",
                {"thresholds": ERROR_THRESHOLDS},
            )
        )
    return out


def gdr_threshold(env: dict[str, str]) -> tuple[str, int]:
    """NCCL_NET_GDR_LEVEL as a topo -m level rank (PXB by default); NCCL's PHB covers NODE."""
    raw = env.get("NCCL_NET_GDR_LEVEL", "").strip().upper()
    if raw.lstrip("-").isdigit():
        raw = GDR_LEGACY.get(int(raw), "SYS" if int(raw) > 4 else "PXB")
    if raw not in GDR_LEVELS:
        raw = "PXB"
    return raw, GDR_LEVELS[raw]


def locality_findings(ctx: CheckContext, views: list[PortView], levels: dict[int, dict[str, str]]) -> list[Finding]:
    active = {v.device.name for v in views if v.active}
    if not active or not levels:
        return []
    name, limit = gdr_threshold(ctx.snapshot.env)
    out = []
    for gpu, row in sorted(levels.items()):
        reachable = {nic: lvl for nic, lvl in row.items() if nic in active}
        if not reachable:
            continue
        nic, lvl = min(reachable.items(), key=lambda kv: (nic_locality.rank(kv[1]), kv[0]))
        evidence = {"nearest_nic": nic, "level": lvl, "NCCL_NET_GDR_LEVEL": name, "levels": row}
        if nic_locality.rank(lvl) <= limit:
            continue
        out.append(
            Finding(
                GPU_NIC_FAR.code,
                Status.WARN,
                f"gpu:{gpu}",
                f"GPU {gpu}'s nearest active RDMA NIC is {nic} at {lvl}: beyond {name}, NCCL sends its inter-node "
                "traffic through host memory (no GPUDirect RDMA)",
                GPU_NIC_FAR.fix,
                evidence,
            )
        )
    if not out:
        worst = max(
            (
                min(nic_locality.rank(lvl) for nic, lvl in row.items() if nic in active)
                for row in levels.values()
                if any(nic in active for nic in row)
            ),
            default=0,
        )
        out.append(
            Finding(
                GPU_NIC_FAR.code,
                Status.PASS,
                "host",
                f"every GPU has an active RDMA NIC at {nic_locality.LEVELS[worst]} or nearer",
                "",
                {"NCCL_NET_GDR_LEVEL": name},
            )
        )
    return out


def gdr_findings(ctx: CheckContext, network: Network, views: list[PortView]) -> list[Finding]:
    snapshot = ctx.snapshot
    if not any(v.active for v in views) or not snapshot.gpus:
        return []
    gd = network.gpudirect
    peermem = getattr(gd, "peermem", None)
    ready, dmabuf = dmabuf_ready(snapshot, network)
    evidence = {"peermem": peermem, "dmabuf": dmabuf}
    if not hasattr(gd, "peermem"):
        return []
    if isinstance(peermem, str):
        return [Finding(GDR_MISSING.code, Status.PASS, "host", f"GPUDirect RDMA: {peermem} is loaded", "", evidence)]
    if ready:
        return [
            Finding(
                GDR_MISSING.code,
                Status.PASS,
                "host",
                "GPUDirect RDMA through dma-buf: open kernel module on Linux "
                f"{'.'.join(map(str, version_tuple(snapshot.host.kernel) or ()))} (NCCL 2.13+)",
                "",
                evidence,
            )
        ]
    return [
        Finding(
            GDR_MISSING.code,
            Status.WARN,
            "host",
            "no GPUDirect RDMA: neither nvidia_peermem (nor nv_peer_mem) is loaded nor is the dma-buf path there "
            "(open kernel module, Linux >= 5.12): NCCL stages inter-node traffic through host memory",
            GDR_MISSING.fix,
            evidence,
        )
    ]


def ib_hca_findings(env: dict[str, str], network: Network | None, views: list[PortView]) -> list[Finding]:
    value = env.get("NCCL_IB_HCA")
    if value is None or network is None or not isinstance(network.rdma, list):
        return []
    spec = parse_nccl_list(value)
    usable = [v for v in views if v.active and v.port.link_layer in ("InfiniBand", "Ethernet")]
    chosen = [v for v in usable if spec.selects(v.device.name, v.port.port)]
    names = [d.name for d in network.rdma]
    evidence: dict[str, Any] = {
        "NCCL_IB_HCA": value,
        "devices": names,
        "selected": [v.key for v in chosen],
        "active_ports": [v.key for v in usable],
    }
    if not names:
        return [
            Finding(
                IB_HCA_MISSING.code,
                Status.WARN,
                "host",
                f"NCCL_IB_HCA={value!r} but this host has no RDMA device: inter-node traffic goes over TCP sockets",
                IB_HCA_MISSING.fix,
                evidence,
            )
        ]
    out = []
    if not chosen:
        down = [v.label for v in views if spec.selects(v.device.name, v.port.port) and not v.active]
        why = f" (it names only ports that are down: {listed(down)})" if down else ""
        out.append(
            Finding(
                IB_HCA_MISSING.code,
                Status.FAIL,
                "host",
                f"NCCL_IB_HCA={value!r} selects no active port of {listed(names)}{why}: NCCL finds no IB device and "
                "falls back to TCP sockets",
                IB_HCA_MISSING.fix,
                evidence,
            )
        )
    elif not spec.exclude:
        ports = {v.device.name: [p.port for p in v.device.ports] for v in views}
        dead = [
            f"{name}{'' if port is None else f':{port}'}"
            for name, port in spec.entries
            if not any(spec.entry_matches((name, port), dev, p) for dev, plist in ports.items() for p in plist)
        ]
        if dead:
            out.append(
                Finding(
                    IB_HCA_MISSING.code,
                    Status.WARN,
                    "host",
                    f"NCCL_IB_HCA entries {', '.join(dead)} match no device or port here (NCCL ignores them); it "
                    f"selects {listed([v.key for v in chosen])}",
                    IB_HCA_MISSING.fix,
                    {**evidence, "unmatched": dead},
                )
            )
    if chosen and not out:
        out.append(
            Finding(
                IB_HCA_MISSING.code,
                Status.PASS,
                "host",
                f"NCCL_IB_HCA={value!r} selects {len(chosen)} active port(s): {listed([v.key for v in chosen])}",
                "",
                evidence,
            )
        )
    if not spec.exact:
        for prefix, _port in spec.entries:
            extra = [n for n in names if n.startswith(prefix) and n != prefix]
            if prefix in names and extra:
                verb = "excludes" if spec.exclude else "selects"
                out.append(
                    Finding(
                        IB_HCA_PREFIX.code,
                        Status.WARN,
                        "host",
                        f"NCCL_IB_HCA entry {prefix} is a prefix: it also {verb} {listed(extra)}",
                        f"write {'^' if spec.exclude else ''}={value.lstrip('^')} for exact names",
                        {"NCCL_IB_HCA": value, "entry": prefix, "also": extra},
                    )
                )
    return out


def ports_table(views: list[PortView], levels: dict[int, dict[str, str]]) -> dict[str, Any]:
    nearest: dict[str, str] = {}
    for gpu, row in sorted(levels.items()):
        for nic, lvl in row.items():
            if nic_locality.near(lvl):
                nearest.setdefault(nic, f"GPU {gpu} {lvl}")
    rows = [
        [
            v.device.name,
            v.port.port,
            v.port.state if isinstance(v.port.state, str) else "?",
            v.port.phys_state if isinstance(v.port.phys_state, str) else "?",
            v.port.rate if isinstance(v.port.rate, str) else "?",
            v.port.link_layer if isinstance(v.port.link_layer, str) else "?",
            v.device.fw_ver if isinstance(v.device.fw_ver, str) else "?",
            nearest.get(v.device.name, "-"),
        ]
        for v in views
    ]
    return {
        "title": "RDMA ports",
        "columns": ["device", "port", "state", "physical", "rate", "link layer", "firmware", "near"],
        "rows": rows,
    }


def locality_table(levels: dict[int, dict[str, str]]) -> dict[str, Any]:
    nics = sorted({n for row in levels.values() for n in row}, key=lambda n: (len(n), n))
    return {
        "title": "GPU to NIC (topo -m words)",
        "columns": ["", *nics],
        "rows": [[f"GPU{g}", *(row.get(n, "?") for n in nics)] for g, row in sorted(levels.items())],
    }


@check("network", "InfiniBand/RoCE ports, NIC locality, GPUDirect RDMA", codes=CODES)
def network(ctx: CheckContext) -> tuple[list[Finding], dict[str, Any]]:
    net = network_of(ctx.snapshot)
    if net is None:
        return [], {}  # a recording made before gpudoctor read the network: nothing to judge
    views = port_views(net)
    levels = gpu_nic_levels(ctx.snapshot, target_gpus(ctx))
    rail = rail_kind(views, levels)
    findings = [
        *ib_hca_findings(ctx.snapshot.env, net, views),
        *port_findings(views, rail),
        *rate_findings(views, rail),
        *error_findings(views),
        *locality_findings(ctx, views, levels),
        *gdr_findings(ctx, net, views),
    ]
    if not views and isinstance(net.rdma, list):
        findings.append(Finding(PORT_DOWN.code, Status.PASS, "host", "no InfiniBand/RoCE device on this host", "", {}))
    tables = [ports_table(views, levels)] if views else []
    if levels:
        tables.append(locality_table(levels))
    return findings, {"tables": tables} if tables else {}
